"""lower_ort_matmulnbits_draft: lower_ort_matmulnbits at accuracy level 4 for every float32 linear,
block offsets (`convert --quant gguf`) included.

lower_ort_matmulnbits keeps linears with block offsets at level 0 (exact, float activations), because at
level 4 their error adds up (see its docstring). A speculative draft need not be exact: the target
verifies every drafted token, so only the draft's agreement with the target and its step cost count.
On SmolLM2-135M's GGUF (Q4_1) this makes the draft's linears the cheap int8-activation kernel while the
weights stay the target's own (README "Speculative decoding" has the measured step cost and acceptance).
`trtbuild build CKPT OUT --twin-accuracy draft` picks it in place of lower_ort_matmulnbits.
"""

from __future__ import annotations

from passes.base import register_pass
from passes.lower_ort_matmulnbits import LowerOrtMatMulNBits


@register_pass
class LowerOrtMatMulNBitsDraft(LowerOrtMatMulNBits):
    name = "lower_ort_matmulnbits_draft"
    description = "as lower_ort_matmulnbits, at accuracy_level 4 for linears with block offsets too (drafts)"
    offsets_too = True

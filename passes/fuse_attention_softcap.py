"""fuse_attention_softcap: gemma2's soft-capped attention -> Attention-24 with its softcap attribute.

Separate from fuse_attention because targets differ: onnxruntime takes `softcap`, TensorRT's
parser rejects it ("Setting softcap is not supported in TensorRT Attention"), so the tensorrt
pipeline leaves soft-capped attention decomposed.
"""

from __future__ import annotations

from collections.abc import Sequence

from onnxscript.rewriter import pattern

from passes.base import RewritePass, register_pass
from passes.fuse_attention import AttentionFusion


@register_pass
class FuseAttentionSoftcap(RewritePass):
    name = "fuse_attention_softcap"
    description = "eager attention with cap * tanh(scores / cap) -> Attention-24 softcap"

    def rules(self) -> Sequence[pattern.RewriteRule]:
        return [AttentionFusion.rule(softcap=True)]

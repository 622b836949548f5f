"""The SmolLM2-135M quantization variants the quantization benchmarks compare, made once per work dir.

Group sizes are SmolLM2's: its hidden size 576 is a multiple of 64 and 32, not of 128. lm_head stays
float (`--lm-head float`), as in tests/eval/test_quantized_fidelity.py: it is the tied embedding; the
`_lm8` and `_lm4` variants store it int8 per output channel (convert's default for weight-only schemes)
and like the body (`--lm-head same`).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

# variant -> (--quant, --group-size, --kv-cache)
VARIANTS: dict[str, tuple[str, int | None, str]] = {
    "fp32": ("none", None, "none"),
    "int8_wo": ("int8_wo", None, "none"),  # one scale per output channel
    "int8_wo_g32": ("int8_wo", 32, "none"),
    "int4_wo": ("int4_wo", 64, "none"),
    "int4_wo_g32": ("int4_wo", 32, "none"),
    "int4_awq": ("int4_awq", 64, "none"),
    "int4_awq_g32": ("int4_awq", 32, "none"),
    "fp32_kv8": ("none", None, "int8"),  # float weights, int8 KV cache
    "int4_awq_kv8": ("int4_awq", 64, "int8"),
    "gguf": ("gguf", None, "none"),  # the GGUF's own Q4_1 blocks, nothing re-quantized
    "gguf_lm8": ("gguf", None, "none"),  # the same with the tied Q8_0 head int8 in its own blocks of 32
    "gguf_lm8_exact": ("gguf", None, "none"),  # the same checkpoint, built `--twin-accuracy exact` (peers_build.py)
    "int4_awq_g32_lm8": ("int4_awq", 32, "none"),  # --lm-head int8 (the default)
    "int4_awq_g32_lm4": ("int4_awq", 32, "none"),  # --lm-head same: int4 in groups of 32
    "int4_wo_g32_lm8": ("int4_wo", 32, "none"),
    "int4_wo_g32_lm4": ("int4_wo", 32, "none"),
}
LM_HEAD = {"int4_awq_g32_lm8": "int8", "int4_awq_g32_lm4": "same", "int4_wo_g32_lm8": "int8",
           "int4_wo_g32_lm4": "same", "gguf_lm8": "int8", "gguf_lm8_exact": "int8"}  # the rest: float


def checkpoint(work: Path, variant: str) -> Path:
    """WORK/ckpt-VARIANT, converted from the bundled GGUF unless it is already there."""
    from converters.convert import convert
    from engine_builder.util.bundled import smollm2_gguf

    ckpt = work / f"ckpt-{variant}"
    if not ckpt.exists():
        quant, group, kv_cache = VARIANTS[variant]
        options = {} if quant == "none" else {"group_size": group, "lm_head": LM_HEAD.get(variant, "float")}
        if quant == "gguf":  # the head dequantized to float unless an int8 one is asked for
            options = {"lm_head": LM_HEAD[variant]} if variant in LM_HEAD else {"exclude": ["lm_head"]}
        convert(smollm2_gguf(), ckpt, dtype="float32", quant=quant, kv_cache=kv_cache, **options)
    return ckpt


def import_llama_cpp() -> ModuleType:
    """llama-cpp-python, the contender; a one-line exit when it is not installed."""
    try:
        import llama_cpp
    except ImportError:
        raise SystemExit("llama-cpp-python is not installed; run `make bench-install` first") from None
    return llama_cpp

"""The precision of each tensor group of a checkpoint (embeddings, body linears, lm_head), in words.

`convert` prints it and `inspect` shows it for an engine dir, from the same quantization block, so
what a user reads is what the graph was emitted from (network/linear.py reads `Quantization.for_linear`).
"""

from __future__ import annotations

from engine_builder.formats.model_config import ModelConfig
from engine_builder.formats.quantization import Quantization


def describe_linear(q: Quantization, dtype: str) -> str:
    """How a linear stored under Q is computed: 'int4, groups of 128 (int4_awq)', 'float32'..."""
    if q.scheme == "none":
        return dtype
    if q.scheme == "fp8" or q.weight_bits is None:
        text = "fp8 e4m3 per tensor"
    else:
        text = f"int{q.weight_bits}, " + ("per output channel" if q.group_size is None else f"groups of {q.group_size}")
        text += " with zero points" if q.zero_point else ""
    text += f", {q.activation} activations" if q.activation != "none" else ""
    return f"{text} ({q.scheme})"


def tensor_groups(model: ModelConfig, dtype: str, q: Quantization) -> dict[str, str]:
    """{"embeddings", "body", "lm_head"} -> precision, for a checkpoint of DTYPE floats quantized per Q."""
    body = [p for p in q.quantized if p != "lm_head"]
    body_text = describe_linear(q, dtype) if body else dtype
    kept = [p for p in q.excluded if p != "lm_head"]
    if body and kept:
        body_text += f"; {len(kept)} linears kept {dtype}"
    if "lm_head" in q.quantized:
        head = describe_linear(q.for_linear("lm_head"), dtype)
    else:
        head = f"{dtype} (tied to the embeddings)" if model.tie_word_embeddings else dtype
    return {"embeddings": dtype, "body": body_text, "lm_head": head}

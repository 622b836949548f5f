"""Quantizing the real SmolLM2-135M fp32 checkpoint: every linear, bounded memory, the expected sizes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from checkpoint_to_hf import read_checkpoint

from converters.quantize import rtn
from converters.quantize.quant_options import QuantOptions
from converters.quantize.quantized_checkpoint import FloatTensors, quantize_checkpoint
from engine_builder.formats import quant_packing
from engine_builder.util.memory import PeakRss


def read_block(ckpt) -> dict:
    import json

    return json.loads((ckpt / "config.json").read_text())["quantization"]


@pytest.mark.parametrize(("scheme", "group_size", "max_ratio"), [("int8_wo", None, 0.47), ("int8_wo", 32, 0.5),
                                                                 ("int4_wo", 64, 0.39)])
def test_smollm2_quantizes_in_bounded_memory(smollm2_ckpt, tmp_path, scheme, group_size, max_ratio):
    fp = FloatTensors(smollm2_ckpt / "rank0.safetensors")
    largest = max(math.prod(shape) * 4 for _, shape, _, _ in fp.meta.values())  # the 49152 x 576 embedding
    peak = PeakRss()
    result = quantize_checkpoint(smollm2_ckpt, tmp_path, QuantOptions(scheme, group_size))
    # the float tensor being quantized, its codes, and row blocks of float temporaries: never the whole model
    assert peak.above_baseline() < 2 * largest, peak.above_baseline() / largest
    assert len(result.quantized) == 30 * 4 + 1 and result.quantized[-1] == "lm_head"  # tied: its own copy
    fp_bytes = sum(nbytes for _, _, _, nbytes in fp.meta.values())
    # most of what is left is the float32 embedding (113 MB), kept beside the quantized lm_head, which
    # weight-only schemes keep at int8 per output channel by default (28 MB; --lm-head same: like the body)
    # (per-channel int8_wo already stores it so: "same")
    assert read_block(tmp_path)["lm_head"] == ("same" if (scheme, group_size) == ("int8_wo", None) else "int8")
    assert result.bytes < max_ratio * fp_bytes, result.bytes / fp_bytes
    q = read_checkpoint(tmp_path)
    w = fp.read("layers.29.mlp.down.weight")  # [576, 1536]
    if scheme == "int8_wo":
        scale = q["layers.29.mlp.down.weight_scale"]  # [576] per channel, [576, 48] per group of 32
        deq = rtn.dequantize_int8(q["layers.29.mlp.down.weight"], scale)
        step = scale[:, None] if group_size is None else np.repeat(scale, group_size, axis=1)
    else:
        scale = q["layers.29.mlp.down.weight_scale"]
        deq = rtn.dequantize_blocked(quant_packing.unpack_int4(q["layers.29.mlp.down.weight"], w.shape[1]), scale)
        step = np.repeat(scale, group_size, axis=1)
    assert np.all(np.abs(deq - w) <= step * (0.5 + 1e-5))

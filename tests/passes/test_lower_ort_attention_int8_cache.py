"""lower_ort_attention on a graph with an int8 KV cache (`convert --kv-cache int8`): GroupQueryAttention
reads and writes the int8 buffers itself (kv_cache_bit_width 8, per-channel scales), and the fallback
branch quantizes and dequantizes as the unfused graph does; numerics equal the unfused graph's."""

from __future__ import annotations

import sys
from pathlib import Path

import onnx_ir as ir
import pytest
from ort_lowering_check import STEPS, assert_matches_unfused, save_beside, top_level_counts
from test_decoder_pipeline import FUSIONS

from converters.convert import convert
from engine_builder.network import NetworkOptions, write_onnx
from passes.base import PassManager, get_pass
from passes.graph_stats import op_counts

sys.path.insert(0, str(Path(__file__).parents[1] / "engine_builder"))
from hf_reference import prompt_of  # noqa: E402
from kv_int8 import hf_cache_absmax, with_int8_kv_cache  # noqa: E402

GQA = "com.microsoft.GroupQueryAttention"


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_int8_cache_lowers_to_gqa_with_the_same_numerics(arch, tiny_model_dir, tmp_path):
    hf = tiny_model_dir(arch)
    convert(hf, tmp_path / "fp")
    scales = {k: v / 127 for k, v in hf_cache_absmax(hf, prompt_of(40, seed=1)).items()}
    ckpt = with_int8_kv_cache(tmp_path / "fp", tmp_path / "ckpt", scales)
    path = write_onnx(ckpt, tmp_path / "engine", NetworkOptions(max_seq_len=32))
    model = ir.load(path)
    PassManager(FUSIONS).run(model)
    layers = len(scales) // 2
    assert get_pass("lower_ort_attention").apply(model) == layers
    top, every = top_level_counts(model), op_counts(model)
    assert top["If"] == every[GQA] == every["Attention"] == layers and top[GQA] == 0
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if node.op_type == "GroupQueryAttention":
            attrs = {k: a.value for k, a in node.attributes.items()}
            assert (attrs["kv_cache_bit_width"], attrs["k_quant_type"], attrs["v_quant_type"]) == (
                8, "PER_CHANNEL", "PER_CHANNEL")
            assert node.inputs[3].dtype == ir.DataType.INT8 and node.inputs[12].name.endswith("k_cache_scale")
    assert {v.dtype for v in model.graph.outputs if v.name.startswith("present_")} == {ir.DataType.INT8}
    lowered = save_beside(model, path, "lowered")
    for level in ("disable_all", "basic"):
        assert_matches_unfused(path, lowered, level)  # STEPS include the fallback's batched prefill over a cache
    assert any(len(past) > 1 and seq > 1 and max(past) > 0 for seq, past in STEPS)

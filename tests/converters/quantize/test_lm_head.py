"""--lm-head: weight-only schemes keep lm_head at int8 per output channel by default (float and same on
request); the checkpoint, the graph (TensorRT-RTX and the onnxruntime twin) and the summaries agree."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_process import assert_user_error, trtbuild
from safetensors import safe_open

from converters.convert import convert
from engine_builder.build.pipeline import build
from engine_builder.formats.build_config import DEFAULT_PASSES, BuildConfig, Limits, PassLists
from engine_builder.formats.manifest import ORT_MODEL
from engine_builder.network import NetworkOptions, write_onnx

sys.path.insert(0, str(Path(__file__).parents[2] / "engine_builder"))
from hf_reference import prompt_of  # noqa: E402
from ort_helpers import OrtDecoder  # noqa: E402
from quantized_ckpt import dequantized_checkpoint  # noqa: E402

EXACT_ORT_PASSES = tuple(p.replace("lower_ort_matmulnbits", "lower_ort_matmulnbits_exact")
                         for p in DEFAULT_PASSES["onnxruntime"])


def _lm_head(ckpt: Path) -> tuple[str, list[int]]:
    with safe_open(str(ckpt / "rank0.safetensors"), "numpy") as f:
        if "lm_head.weight" not in f.keys():
            return "absent", []
        scale = f.get_slice("lm_head.weight_scale").get_shape() if "lm_head.weight_scale" in f.keys() else []
        return f.get_slice("lm_head.weight").get_dtype(), scale


@pytest.fixture(scope="module")
def int4_ckpts(tiny_model_dir, module_tmp_factory):
    """llama_tied converted --quant int4_wo --group-size 32 with each --lm-head choice (None: the default)."""
    root = module_tmp_factory.mktemp("lm-head")
    made = {}
    for choice in (None, "same", "float"):
        out = root / f"ckpt-{choice}"
        made[choice] = (out, convert(tiny_model_dir("llama_tied"), out, quant="int4_wo", group_size=32,
                                     lm_head=choice))
    return made


def test_weight_only_default_is_int8_lm_head(int4_ckpts):
    ckpt, result = int4_ckpts[None]
    q = json.loads((ckpt / "config.json").read_text())["quantization"]
    assert q["lm_head"] == "int8" and "lm_head" in q["quantized"]
    dtype, scale = _lm_head(ckpt)
    assert dtype == "I8" and len(scale) == 1  # [vocab]: one scale per output channel
    assert result.precision == {"embeddings": "float32", "body": "int4, groups of 32 (int4_wo)",
                                "lm_head": "int8, per output channel (int8_wo)"}
    same, float_ = int4_ckpts["same"][1], int4_ckpts["float"][1]
    assert _lm_head(int4_ckpts["same"][0])[0] == "U8" and same.precision["lm_head"] == "int4, groups of 32 (int4_wo)"
    assert _lm_head(int4_ckpts["float"][0])[0] == "absent"  # tied: the graph multiplies by embed.weight
    assert float_.precision["lm_head"] == "float32 (tied to the embeddings)" and "lm_head" in float_.excluded
    # a quantized lm_head of a tied model is stored beside embed.weight: int8 takes more bytes than int4
    assert result.bytes > same.bytes > float_.bytes


def test_int8_lm_head_graph_equals_its_dequantized_weights(int4_ckpts, tmp_path):
    """Unfused graph vs the float graph of the dequantized weights, then the onnxruntime twin (MatMulNBits at
    level 0) vs the unfused graph; and TensorRT-RTX builds the mixed int4 / int8 checkpoint."""
    ckpt = int4_ckpts[None][0]
    options = NetworkOptions(max_seq_len=64, dtype="float32")
    prompt = prompt_of(20, seed=5)
    tokens, logits = OrtDecoder(write_onnx(ckpt, tmp_path / "q", options), level="disable_all").greedy(prompt, 17)
    twin = dequantized_checkpoint(ckpt, tmp_path / "dequantized")
    want_tokens, want = OrtDecoder(write_onnx(twin, tmp_path / "f", options), level="disable_all").greedy(prompt, 17)
    assert max(float(np.abs(g - w).max()) for g, w in zip(logits, want)) <= 1e-5 and tokens == want_tokens
    out = tmp_path / "engine"
    result = build(ckpt, out, BuildConfig(dtype="float32", limits=Limits(max_batch=2, max_input_len=64, max_seq_len=64),
                                          compute_capabilities=("sm86",),
                                          passes=PassLists(onnxruntime=EXACT_ORT_PASSES)))
    assert result.engine_bytes > 0
    counts = {r["name"]: r["matches"] for r in result.passes["onnxruntime"]}
    assert counts["lower_ort_matmulnbits_exact"] == 2 * 4 + 1  # qkv, o, gate_up, down per layer + lm_head
    got_tokens, got = OrtDecoder(out / ORT_MODEL, level="basic").greedy(prompt, 17)
    assert max(float(np.abs(g - w).max()) for g, w in zip(got, logits)) <= 1e-4 and got_tokens == tokens
    info = trtbuild("inspect", out, "--json", timeout=120)
    assert json.loads(info.stdout)["precision"]["lm_head"] == "int8, per output channel (int8_wo)"


@pytest.mark.parametrize(("args", "needles"), [
    (["--quant", "int4_wo", "--lm-head", "half"], ["--lm-head 'half'", "float, int8, same"]),
    (["--lm-head", "int8"], ["--lm-head", "needs a --quant scheme"]),
    (["--quant", "int4_wo", "--lm-head", "int8", "--exclude", "lm_head"], ["--exclude", "--lm-head float"]),
])
def test_bad_lm_head_choices_are_refused(tiny_model_dir, tmp_path, args, needles):
    out = tmp_path / "out"
    assert_user_error(trtbuild("convert", tiny_model_dir("llama_tied"), out, *args, timeout=120), *needles)
    assert not out.exists()

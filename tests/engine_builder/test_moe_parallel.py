"""MoE decoders at tp=2 (tensor parallel inside every expert, formats/parallel_mapping.py): two real rank
processes over gloo give transformers' greedy tokens, for qwen2_moe (with its gated shared expert, whose
slices split too) and mixtral; a tp the shared expert cannot divide is refused with the valid values."""

from __future__ import annotations

import json

import pytest
import transformers
from cli_process import assert_user_error, trtbuild
from hf_reference import hf_greedy
from test_moe import tiny_moe

from converters.convert import convert
from engine_builder.build.parallel_build import build_parallel
from engine_builder.formats.build_config import BuildConfig, Limits
from engine_builder.formats.checkpoint import CheckpointConfig
from engine_builder.formats.manifest import EngineManifest

NEW_TOKENS = 8
PROMPT = "w5 w6 w7 w40 w31"  # no id 0: generate() would mask it as padding


@pytest.mark.parametrize("family", ["qwen2_moe", "mixtral"])
def test_moe_tp2_run_matches_hf(family, tmp_path):
    hf = tiny_moe(family, tmp_path / "hf")
    convert(hf, tmp_path / "ckpt", dtype="float32", tp=2)
    local = CheckpointConfig.load(tmp_path / "ckpt")
    assert local.mapping is not None and local.mapping.tp == 2
    build_parallel(tmp_path / "ckpt", tmp_path / "engine",
                   BuildConfig(targets=("onnxruntime",), dtype="float32",
                               limits=Limits(max_batch=2, max_input_len=16, max_seq_len=32)))
    ids = transformers.AutoTokenizer.from_pretrained(hf)(PROMPT).input_ids
    want, _ = hf_greedy(hf, ids, NEW_TOKENS)
    assert 2 not in want  # no EOS: `run` generates every token, comparable one for one
    proc = trtbuild("run", tmp_path / "engine", "--prompt", PROMPT, "--max-new-tokens", str(NEW_TOKENS), "--json",
                    "--no-chat", timeout=240)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["token_ids"] == want
    assert "tp=2 pp=1" in result["backend_reason"]


def test_moe_tp_the_shared_expert_cannot_divide_is_refused(tmp_path):
    hf = tiny_moe("qwen2_moe", tmp_path / "hf", shared_expert_intermediate_size=36)  # 36 / 8 does not divide
    proc = trtbuild("convert", hf, tmp_path / "ckpt", "--tp", "8")
    assert_user_error(proc, "--tp 8", "shared expert 36", "valid --tp values")
    assert not (tmp_path / "ckpt").exists()


def test_moe_tp_rank_segments_build_with_tensorrt(tmp_path):
    """TensorRT-RTX builds a tp rank's MoE segments too (real builds, no GPU): the expert If with its local
    expert slices is a valid TensorRT network, not only an onnxruntime one."""
    pytest.importorskip("tensorrt_rtx", reason="pip install tensorrt-rtx-cu13")
    convert(tiny_moe("qwen2_moe", tmp_path / "hf"), tmp_path / "ckpt", dtype="float16", tp=2)
    build_parallel(tmp_path / "ckpt", tmp_path / "engine",
                   BuildConfig(targets=("tensorrt", "onnxruntime"), dtype="float16", compute_capabilities=("sm86",),
                               limits=Limits(max_batch=2, max_input_len=16, max_seq_len=32)), ranks=(1,))
    segments = EngineManifest.load(tmp_path / "engine").tensorrt["segments"]
    assert {"rank1.layers.0.mlp.engine", "rank1.layers.1.mlp.engine"} <= set(segments)
    for name in ("rank1.layers.0.mlp.engine", "rank1.layers.1.mlp.engine"):
        assert (tmp_path / "engine" / name).stat().st_size == segments[name]["engine_bytes"] > 0
        assert segments[name]["engine_layer_types"].get("gemm", 0) > 0, segments[name]
    # the experts' If reached TensorRT as a conditional (its two forms), not folded away
    assert EngineManifest.load(tmp_path / "engine").tensorrt["network_layer_types"].get("CONDITION", 0) >= 2

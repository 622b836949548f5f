"""`trtbuild build --onnx`: the passes recognise torch.onnx.export(dynamo=True) graphs of HF models."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest
import torch
import transformers
from cli_process import error_lines

from engine_builder.build.third_party import build_third_party
from engine_builder.formats.build_config import BuildConfig, Limits


class LogitsOnly(torch.nn.Module):
    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def exported(request, tiny_model_dir, module_tmp_factory):
    """A tiny HF model exported by torch's dynamo exporter with eager attention."""
    hf_dir = tiny_model_dir(request.param)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    ids = torch.randint(0, 300, (1, 8))
    path = module_tmp_factory.mktemp(f"export-{request.param}") / "model.onnx"
    program = torch.onnx.export(LogitsOnly(model), (ids, torch.ones_like(ids)), dynamo=True,
                                input_names=["input_ids", "attention_mask"], output_names=["logits"],
                                dynamic_shapes=({0: "batch", 1: "seq"}, {0: "batch", 1: "seq"}), opset_version=24)
    program.save(str(path))
    return model, path


def run(path, feeds):
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def test_exporter_patterns_fuse_and_keep_numerics(exported, tmp_path):
    model, path = exported
    layers = model.config.num_hidden_layers
    out = tmp_path / "engine"
    result = build_third_party(path, out, BuildConfig(targets=("onnxruntime",)))
    counts = {r["name"]: r["matches"] for r in result.passes["onnxruntime"]}
    assert counts["fuse_qkv"] == counts["fuse_gate_up"] == counts["fuse_attention"] == layers
    assert counts["fuse_rms_norm"] == 2 * layers + 1 and counts["fuse_rotary"] == 2 * layers

    rng = np.random.default_rng(0)
    ids = rng.integers(0, 300, (2, 11), dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    original, fused = run(path, feeds), run(out / "model.onnx", feeds)
    np.testing.assert_allclose(fused, original, atol=1e-4, rtol=1e-4)
    with torch.no_grad():
        reference = model(input_ids=torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(fused, reference, atol=1e-4, rtol=1e-4)


def test_third_party_tensorrt_engine(exported, tmp_path):
    _, path = exported
    result = build_third_party(path, tmp_path / "engine", BuildConfig(
        limits=Limits(max_batch=2, max_input_len=32, max_seq_len=32), compute_capabilities=("sm86",)))
    layers = result.tensorrt["network_layer_types"]
    assert result.engine_bytes > 0 and layers["ROTARY_EMBEDDING"] == 4 and layers["ATTENTION_INPUT"] == 2
    manifest = json.loads((tmp_path / "engine" / "config.json").read_text())
    assert manifest["source_onnx"]["name"] == "model.onnx" and manifest["model"] is None


def test_malformed_onnx_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage that is not a protobuf model" * 10)
    proc = subprocess.run([sys.executable, "-m", "engine_builder.cli", "build", "--onnx", str(bad),
                           str(tmp_path / "out")], capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(error_lines(proc.stderr)) == 1 and "not a readable ONNX model" in proc.stderr
    assert not (tmp_path / "out").exists()

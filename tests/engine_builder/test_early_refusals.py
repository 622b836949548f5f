"""What cannot work is refused before any work: one line with the fix, exit code 2, nothing written, the
model's weights never opened and nothing heavy imported (torch, transformers, onnx, onnxruntime, TensorRT).

These assert what the refusal did, not how long it took: a CPU-time budget here failed under a loaded CI
machine (issue 36 LOW 12); benchmarks/refusal_latency.py measures the times."""

from __future__ import annotations

import json

import pytest
from cli_process import assert_user_error, trtbuild_watched


def test_group_size_outside_the_supported_ones_is_refused_before_the_gguf_is_read(smollm2_gguf, tmp_path):
    proc, opened, heavy = trtbuild_watched("convert", smollm2_gguf, tmp_path / "out", "--quant", "int4_awq",
                                           "--group-size", "100", watch=smollm2_gguf)
    assert_user_error(proc, "--group-size 100", "32, 64, 128")
    assert opened == [] and heavy == [] and list(tmp_path.iterdir()) == []


def test_group_size_that_does_not_divide_lists_those_that_do(model_dir, tmp_path):
    hf = model_dir("llama")
    hidden = json.loads((hf / "config.json").read_text())["hidden_size"]
    assert hidden % 128  # the tiny llama's hidden size is not a multiple of 128
    proc, _, heavy = trtbuild_watched("convert", hf, tmp_path / "out", "--quant", "int4_wo", "--group-size",
                                           "128", watch=hf / "model.safetensors")
    assert_user_error(proc, "--group-size 128 does not divide", f"{hidden} input channels",
                      "use --group-size 32 for this model")
    # the config and the safetensors header are read (the linears' shapes); no weight is loaded (no torch)
    assert heavy == [] and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("args", "needles"), [
    (["--cc", "sm90"], ["TensorRT-RTX cannot target sm90", "--cc sm80,sm86,sm89,sm120", "--target onnxruntime"]),
    (["--cc", "sm86,sm90"], ["cannot target sm90", "--cc sm86"]),
    (["--max-seq-len", "16000000", "--max-input-len", "16000000", "--max-batch", "64"],
     ["needs about", "KV cache", "lower limits.max_seq_len", "TRTBUILD_MEMORY_GB"]),
    (["--dtype", "float8"], ["dtype 'float8' is not one of auto, float16"]),
])
def test_build_refusals_come_before_the_graph(checkpoint_dir, tmp_path, args, needles):
    out = tmp_path / "engine"
    proc, opened, heavy = trtbuild_watched("build", checkpoint_dir("llama"), out, *args,
                                           watch=checkpoint_dir("llama") / "rank0.safetensors")
    assert_user_error(proc, *needles)
    assert opened == [] and heavy == [] and list(tmp_path.iterdir()) == []


def test_quantized_checkpoint_a_target_cannot_take_is_refused_at_once(checkpoint_dir, tmp_path):
    """An int8 KV cache cannot build for TensorRT (TensorRT-RTX updates only float caches)."""
    import shutil

    ckpt = tmp_path / "ckpt"
    shutil.copytree(checkpoint_dir("llama"), ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    config["quantization"]["kv_cache"] = "int8"
    (ckpt / "config.json").write_text(json.dumps(config))
    proc, opened, heavy = trtbuild_watched("build", ckpt, tmp_path / "engine", "--target", "tensorrt",
                                           watch=ckpt / "rank0.safetensors")
    assert_user_error(proc, "int8 KV cache cannot build for --target tensorrt", "--target onnxruntime")
    assert opened == [] and heavy == [] and not (tmp_path / "engine").exists()

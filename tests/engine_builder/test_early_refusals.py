"""What cannot work is refused before any work: one line with the fix, exit code 2, in under 3 s of CPU.

CPU time (user + sys of the trtbuild process) rather than wall time: this shared CI machine's load
stretches wall time several-fold; on an idle machine each of these answers in about a second."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import pytest
from cli_process import assert_user_error

BUDGET_S = 3.0


def timed_trtbuild(*args) -> tuple[subprocess.CompletedProcess[str], float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-m", "engine_builder.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=300)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return proc, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def test_group_size_outside_the_supported_ones_is_refused_before_the_gguf_is_read(smollm2_gguf, tmp_path):
    proc, cpu = timed_trtbuild("convert", smollm2_gguf, tmp_path / "out", "--quant", "int4_awq", "--group-size", "100")
    assert_user_error(proc, "--group-size 100", "32, 64, 128")
    assert cpu < BUDGET_S and not (tmp_path / "out").exists()


def test_group_size_that_does_not_divide_lists_those_that_do(model_dir, tmp_path):
    hf = model_dir("llama")
    hidden = json.loads((hf / "config.json").read_text())["hidden_size"]
    assert hidden % 128  # the tiny llama's hidden size is not a multiple of 128
    proc, cpu = timed_trtbuild("convert", hf, tmp_path / "out", "--quant", "int4_wo", "--group-size", "128")
    assert_user_error(proc, "--group-size 128 does not divide", f"{hidden} input channels",
                      "use --group-size 32 for this model")
    assert cpu < BUDGET_S and not (tmp_path / "out").exists()


@pytest.mark.parametrize(("args", "needles"), [
    (["--cc", "sm90"], ["TensorRT-RTX cannot target sm90", "--cc sm80,sm86,sm89,sm120", "--target onnxruntime"]),
    (["--cc", "sm86,sm90"], ["cannot target sm90", "--cc sm86"]),
    (["--max-seq-len", "16000000", "--max-input-len", "16000000", "--max-batch", "64"],
     ["needs about", "KV cache", "lower limits.max_seq_len", "TRTBUILD_MEMORY_GB"]),
    (["--dtype", "float8"], ["dtype 'float8' is not one of auto, float16"]),
])
def test_build_refusals_come_before_the_graph(checkpoint_dir, tmp_path, args, needles):
    out = tmp_path / "engine"
    proc, cpu = timed_trtbuild("build", checkpoint_dir("llama"), out, *args)
    assert_user_error(proc, *needles)
    assert cpu < BUDGET_S and not out.exists() and not list(tmp_path.glob(".engine*"))


def test_quantized_checkpoint_a_target_cannot_take_is_refused_at_once(checkpoint_dir, tmp_path):
    """An int8 KV cache cannot build for TensorRT (TensorRT-RTX updates only float caches)."""
    import shutil

    ckpt = tmp_path / "ckpt"
    shutil.copytree(checkpoint_dir("llama"), ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    config["quantization"]["kv_cache"] = "int8"
    (ckpt / "config.json").write_text(json.dumps(config))
    proc, cpu = timed_trtbuild("build", ckpt, tmp_path / "engine", "--target", "tensorrt")
    assert_user_error(proc, "int8 KV cache cannot build for --target tensorrt", "--target onnxruntime")
    assert cpu < BUDGET_S and not (tmp_path / "engine").exists()

"""Bad `convert --quant ...` input: exit code 2, one line that says what to do, nothing left behind."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_process import error_lines
from runner_engines import add_word_tokenizer


def run_convert(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine_builder.cli", "convert", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def assert_refused(proc: subprocess.CompletedProcess[str], out: Path, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")], "temp dir left behind"


@pytest.mark.parametrize(("flags", "needles"), [
    # the tiny llama's hidden size is 64: the default group of 128 cannot divide it
    (["--quant", "int4_wo"], ["--group-size 128 does not divide layers.0.attn.qkv's 64 input channels",
                              "use --group-size 32 for this model"]),
    (["--quant", "int3"], ["--quant 'int3' is not a scheme", "none, int8_wo, int4_wo, int4_awq, w8a8_sq, fp8"]),
    (["--quant", "int4_wo", "--group-size", "48"], ["--group-size 48 is not supported", "32, 64, 128"]),
    (["--quant", "int8_wo", "--kv-cache", "int4"], ["--kv-cache 'int4' is not supported", "none, int8, fp8"]),
    (["--quant", "int8_wo", "--kv-cache", "fp8"], ["--kv-cache fp8 is not supported", "no fp8-cache kernel",
                                                   "use --kv-cache int8 (onnxruntime target) or --kv-cache none"]),
    (["--quant", "int4_awq", "--group-size", "32", "--calib", "{tmp}/missing.txt"],
     ["calibration text", "missing.txt", "does not exist", "leave it out to use the shipped text"]),
    (["--quant", "w8a8_sq", "--calib", "{tmp}/empty.txt"], ["calibration text", "empty.txt", "is empty"]),
    (["--quant", "int8_wo", "--calib", "{tmp}/empty.txt"], ["--calib only feeds the calibrated schemes",
                                                            "drop --calib"]),
    (["--quant", "fp8", "--calib-samples", "0"], ["--calib-samples and --calib-seq-len must be positive"]),
    (["--quant", "int8_wo", "--exclude", "layers.0.mlp.up"], ["--exclude 'layers.0.mlp.up' matches no linear",
                                                             "lm_head"]),
    (["--exclude", "lm_head"], ["--exclude picks linears to keep in full precision; it needs a --quant scheme"]),
], ids=["group-divides", "scheme", "group-size", "kv-cache", "kv-cache-fp8", "calib-missing", "calib-empty",
        "calib-unused", "calib-samples", "exclude-typo", "exclude-alone"])
def test_bad_quant_options(tiny_model_dir, tmp_path, flags, needles):
    (tmp_path / "empty.txt").write_text(" \n\n")
    out = tmp_path / "out"
    proc = run_convert(tiny_model_dir("llama"), out, *(f.format(tmp=tmp_path) for f in flags))
    assert_refused(proc, out, *needles)


def test_failure_after_the_float_checkpoint_leaves_nothing(tiny_model_dir, tmp_path):
    """A text too short for one calibration window is found only once the float checkpoint is written
    (it is measured in the checkpoint's tokens); its scratch dir must go with the rest of the temp output."""
    hf = tmp_path / "hf"
    shutil.copytree(tiny_model_dir("llama"), hf)
    add_word_tokenizer(hf, 320)
    (tmp_path / "short.txt").write_text("w40 w41 w42")
    out = tmp_path / "work" / "out"
    out.parent.mkdir()
    proc = run_convert(hf, out, "--quant", "w8a8_sq", "--calib", tmp_path / "short.txt")
    assert proc.returncode == 2, proc.stderr
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: calibration text short.txt has 3 tokens, fewer than one")
    assert not list(out.parent.iterdir())


def test_calibration_needs_a_tokenizer(tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    proc = run_convert(tiny_model_dir("llama"), out, "--quant", "int4_awq", "--group-size", "32")
    assert proc.returncode == 2 and len(error_lines(proc.stderr)) == 1, proc.stderr
    assert "calibrates on text tokenized with the model's tokenizer" in proc.stderr
    assert "use --quant int8_wo or int4_wo" in proc.stderr
    assert not list(tmp_path.iterdir())

"""Output fit for people and CI: a --json summary of at most 60 lines (the details in the engine dir's
manifest), progress as plain timestamped lines when stderr is not a terminal, no wrapping at 80 columns,
-q silences progress and -v adds the pass tables."""

from __future__ import annotations

import json
import re

from cli_process import trtbuild

from engine_builder import __version__

SMALL = ("--max-batch", "2", "--max-input-len", "16", "--max-seq-len", "32", "--cc", "sm86")
PROGRESS_LINE = re.compile(r"^\[ *\d+\.\ds\] (build|convert): ")


def test_build_json_is_a_short_summary_and_ci_logs_see_progress(checkpoint_dir, tmp_path):
    out = tmp_path / "engine"
    proc = trtbuild("build", checkpoint_dir("llama"), out, *SMALL, "--json")
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) <= 60, proc.stdout
    summary = json.loads(proc.stdout)
    assert summary["trtbuild_version"] == __version__ and summary["engine_bytes"] > 0
    assert "fuse_attention 2" in summary["passes"]["tensorrt"] and summary["tensorrt"]["layers"] > 0
    manifest = json.loads(open(summary["details"]).read())  # the details: every pass, TensorRT's report
    assert manifest["passes"]["tensorrt"][0]["name"] and manifest["tensorrt"]["profiles"]
    assert manifest["versions"]["trtbuild"] == __version__
    # stderr is a pipe here, as in CI: one plain line per stage, TensorRT's phases included
    lines = proc.stderr.splitlines()
    assert lines and all(PROGRESS_LINE.match(line) for line in lines), proc.stderr
    assert any("graph and passes for onnxruntime" in line for line in lines)
    assert any("TensorRT: " in line for line in lines)
    info = trtbuild("inspect", out, "--json")
    assert info.returncode == 0 and len(info.stdout.splitlines()) <= 60, info.stdout
    assert json.loads(info.stdout)["trtbuild_version"] == __version__


def test_quiet_and_verbose(checkpoint_dir, tmp_path):
    quiet = trtbuild("-q", "build", checkpoint_dir("llama"), tmp_path / "q", *SMALL, "--target", "onnxruntime")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    # the summary line is longer than 80 columns and stays one line in a log
    assert len(quiet.stdout.splitlines()) == 1 and len(quiet.stdout) > 80, quiet.stdout
    loud = trtbuild("-v", "build", checkpoint_dir("llama"), tmp_path / "v", *SMALL, "--target", "onnxruntime")
    assert loud.returncode == 0 and "passes for onnxruntime" in loud.stdout and "fuse_rotary" in loud.stdout


def test_convert_progress_lines(model_dir, tmp_path):
    proc = trtbuild("convert", model_dir("llama"), tmp_path / "ckpt", "--quant", "int8_wo")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert any(PROGRESS_LINE.match(line) and "converting" in line and "MB" in line for line in lines), proc.stderr
    assert any("quantizing" in line and "(100%)" in line for line in lines), proc.stderr
    assert "precision: embeddings float32; body int8, per output channel (int8_wo)" in proc.stdout

"""SIGKILL `trtbuild convert` and `trtbuild build` at points spread over their whole run: OUT is either absent or
complete and verifiable, never half-written; the source is untouched; the next run clears what the killed ones
left behind."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.numpy import load_file

from engine_builder.formats.checkpoint import CheckpointConfig

POINTS = 20  # kill points per command
CLI = [sys.executable, "-m", "engine_builder.cli"]


def _digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _timed(args: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run([*CLI, *args], check=True, capture_output=True, timeout=600)
    return time.perf_counter() - started


def _killed_at(args: list[str], delay: float) -> None:
    proc = subprocess.Popen([*CLI, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)


def _leftovers(parent: Path, out: str = "") -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{out}"))


def _rerun_clears_a_leftover(parent: Path, command) -> None:
    """A killed run mid-write leaves its temp dir (nothing can clean up after SIGKILL); the next run of the
    same output removes it, since its process is dead."""
    left = _leftovers(parent)
    if not left:  # no kill landed mid-write this time (timing); the cleanup has its own test
        return
    out = left[0][1:].split(".tmp-")[0]
    subprocess.run([*CLI, *command(parent / out)], check=True, capture_output=True, timeout=600)
    assert _leftovers(parent, out + ".") == [] and (parent / out).is_dir()


@pytest.fixture(scope="module")
def medium_hf(module_tmp_factory) -> Path:
    """A llama whose weights (~80 MB) take long enough to write that kills land mid-write too."""
    import torch
    import transformers

    out = module_tmp_factory.mktemp("medium") / "hf"
    config = transformers.LlamaConfig(vocab_size=4096, hidden_size=512, intermediate_size=1536, num_hidden_layers=6,
                                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256,
                                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).eval().save_pretrained(out)
    return out


def test_convert_killed_anywhere_leaves_nothing_or_a_whole_checkpoint(medium_hf, tmp_path):
    src = medium_hf
    before = _digests(src)
    whole = _timed(["convert", str(src), str(tmp_path / "reference"), "--dtype", "float32"])
    reference = load_file(tmp_path / "reference" / "rank0.safetensors")
    complete = 0
    for i in range(POINTS):
        out = tmp_path / f"out{i}"
        _killed_at(["convert", str(src), str(out), "--dtype", "float32"], whole * (i + 0.5) / POINTS)
        if out.exists():  # the rename happened: everything is there
            CheckpointConfig.load(out)
            got = load_file(out / "rank0.safetensors")
            assert got.keys() == reference.keys() and all((got[k] == reference[k]).all() for k in got)
            complete += 1
    assert _digests(src) == before
    assert complete < POINTS  # kills before the rename left no OUT at all
    _rerun_clears_a_leftover(tmp_path, lambda out: ["convert", str(src), str(out), "--dtype", "float32"])


def test_build_killed_anywhere_leaves_nothing_or_a_verifiable_engine(tiny_model_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    subprocess.run([*CLI, "convert", str(tiny_model_dir("llama")), str(ckpt), "--dtype", "float32"], check=True,
                   capture_output=True, timeout=600)
    before = _digests(ckpt)
    build = ["--target", "onnxruntime", "--dtype", "float32", "--max-seq-len", "64", "--max-input-len", "32"]
    whole = _timed(["build", str(ckpt), str(tmp_path / "reference"), *build])
    complete = 0
    for i in range(POINTS):
        out = tmp_path / f"out{i}"
        _killed_at(["build", str(ckpt), str(out), *build], whole * (i + 0.5) / POINTS)
        if out.exists():
            verdict = subprocess.run([*CLI, "verify", str(out), "--json"], capture_output=True, text=True,
                                     timeout=300)
            assert verdict.returncode == 0 and json.loads(verdict.stdout)["ok"], verdict.stdout + verdict.stderr
            complete += 1
    assert _digests(ckpt) == before
    assert complete < POINTS
    _rerun_clears_a_leftover(tmp_path, lambda out: ["build", str(ckpt), str(out), *build])

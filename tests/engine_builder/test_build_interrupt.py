"""Ctrl-C and SIGTERM stop `trtbuild build` while TensorRT-RTX is building, leaving nothing behind.

TensorRT holds the GIL for the whole build, so the build runs in a child process the CLI kills
(engine_builder/trt/engine_build.py). The tests freeze that process (SIGSTOP) before the signal: a CLI that
waited for the build to end instead of killing it would then never exit. Behaviour, not a time budget (one of
2 s failed under a loaded CI machine, issue 36 LOW 12); benchmarks/refusal_latency.py measures the time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("tensorrt_rtx", reason="pip install tensorrt-rtx-cu13")


@pytest.fixture(scope="module")
def slow_ckpt(module_tmp_factory):
    """A llama big enough that its TensorRT-RTX build takes seconds (6 layers, hidden 512: ~3 s here)."""
    import torch
    import transformers

    from converters.convert import convert

    root = module_tmp_factory.mktemp("slow")
    config = transformers.LlamaConfig(vocab_size=2048, hidden_size=512, intermediate_size=1536, num_hidden_layers=6,
                                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024,
                                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).eval().save_pretrained(root / "hf")
    convert(root / "hf", root / "ckpt", dtype="float32")
    return root / "ckpt"


def start_build(ckpt, out) -> subprocess.Popen[str]:
    # its own session, so the test can signal the whole group as a terminal's Ctrl-C does
    return subprocess.Popen([sys.executable, "-m", "engine_builder.cli", "build", str(ckpt), str(out),
                             "--target", "tensorrt", "--cc", "sm86", "--opt-level", "5", "--max-batch", "4",
                             "--max-input-len", "256", "--max-seq-len", "512"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def build_process(parent: int) -> int | None:
    """The pid of PARENT's TensorRT build process (engine_build.py's child), None while there is none."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            if ppid == parent and b"_child_main" in (stat.parent / "cmdline").read_bytes():
                return int(stat.parent.name)
        except (OSError, IndexError, ValueError):
            continue
    return None


def wait_for_tensorrt(proc: subprocess.Popen[str]) -> int:
    """Until the TensorRT build process has run a second (imported TensorRT, parsed, building)."""
    deadline = time.monotonic() + 300
    while (child := build_process(proc.pid)) is None:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(1.0)
    return child


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_a_signal_kills_the_tensorrt_build_and_leaves_nothing(slow_ckpt, tmp_path, how):
    out = tmp_path / "engine"
    proc = start_build(slow_ckpt, out)
    child = wait_for_tensorrt(proc)
    assert build_process(proc.pid) == child, "the TensorRT build ended before the signal: make it slower"
    os.kill(child, signal.SIGSTOP)  # frozen mid-build: it can end now only by being killed
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)  # the terminal signals the foreground process group
    else:
        proc.send_signal(signal.SIGTERM)  # a CI runner or `kill` signals the process
    try:
        _, err = proc.communicate(timeout=120)  # a guard against a hang, not a budget
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError("trtbuild build waited for its frozen TensorRT build instead of killing it") from None
    assert proc.returncode == 2 and "interrupted: nothing was written" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no engine dir, no temp dir
    assert not Path(f"/proc/{child}").exists()  # the TensorRT build process is gone too


def test_the_tensorrt_build_dies_with_a_killed_parent(slow_ckpt, tmp_path):
    """SIGKILL (the OOM killer, `kill -9`) leaves no handler to run: the build process must not outlive the
    command and go on burning CPU and writing into a temp dir nobody owns. Frozen first, so that it cannot end
    by finishing its build: only the kernel's parent-death signal can end it."""
    proc = start_build(slow_ckpt, tmp_path / "engine")
    child = wait_for_tensorrt(proc)
    os.kill(child, signal.SIGSTOP)
    proc.kill()
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 60  # a guard against waiting forever, not a budget: the kernel kills it at once
    while process_state(child) not in (None, "Z") and time.monotonic() < deadline:  # Z: dead, not yet reaped
        time.sleep(0.05)
    state = process_state(child)
    if state not in (None, "Z"):
        os.kill(child, signal.SIGKILL)
    assert state in (None, "Z"), f"the TensorRT build process {child} outlived its killed parent ({state})"


def process_state(pid: int) -> str | None:
    """PID's state letter in /proc (R, S, T: stopped, Z: dead), None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None

"""How long a refusal, and a Ctrl-C during a TensorRT build, take to answer: the times the tests no longer assert.

    python benchmarks/refusal_latency.py [--runs 5] [--work build/bench-refusal] [--no-interrupt]

tests/engine_builder/test_early_refusals.py asserts what a refusal does (one line, exit 2, the weights never
opened, nothing heavy imported) and test_build_interrupt.py that Ctrl-C kills the build; a wall-clock or CPU
budget there failed on a loaded CI machine (issue 36 LOW 12). The times are here: for each refusal the median
wall and CPU seconds (user + sys of the process) of --runs fresh processes, and the seconds from SIGINT to the
exit of `trtbuild build --target tensorrt` while TensorRT-RTX builds (a 6-layer llama, ~3 s of build), printed
with the load average. Here (2 cores, load ~2.6, 2026-12-05): 0.4-0.65 s wall per refusal, 0.35-0.45 s
CPU; the interrupt 1.3 s.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CLI = [sys.executable, "-m", "engine_builder.cli"]


def timed(args: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one `trtbuild ARGS` that must refuse (exit 2)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 2:
        raise SystemExit(f"trtbuild {' '.join(args)} exited {proc.returncode}, not 2: {proc.stderr[-500:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def checkpoints(work: Path) -> tuple[Path, Path]:
    """(a tiny llama checkpoint, a 6-layer one whose TensorRT build takes seconds), made once into WORK."""
    import torch
    import transformers

    from converters.convert import convert

    made = []
    for name, layers, hidden in (("tiny", 2, 64), ("slow", 6, 512)):
        ckpt = work / f"ckpt-{name}"
        if not ckpt.exists():
            config = transformers.LlamaConfig(vocab_size=2048, hidden_size=hidden, intermediate_size=3 * hidden,
                                              num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=4,
                                              max_position_embeddings=1024)
            torch.manual_seed(0)
            transformers.LlamaForCausalLM(config).eval().save_pretrained(work / f"hf-{name}")
            convert(work / f"hf-{name}", ckpt, dtype="float32")
        made.append(ckpt)
    return made[0], made[1]


def interrupt_seconds(ckpt: Path, out: Path) -> float:
    """Seconds from SIGINT to the exit of a `trtbuild build` whose TensorRT build process has run a second."""
    proc = subprocess.Popen([*CLI, "build", str(ckpt), str(out), "--target", "tensorrt", "--cc", "sm86",
                             "--opt-level", "5", "--max-batch", "4", "--max-input-len", "256", "--max-seq-len", "512"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    while not any(b"_child_main" in p.read_bytes() for p in _children_cmdlines(proc.pid)):
        if proc.poll() is not None:
            raise SystemExit(f"trtbuild build exited {proc.returncode} before its TensorRT build started")
        time.sleep(0.02)
    time.sleep(1.0)
    sent = time.perf_counter()
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait()
    return time.perf_counter() - sent


def _children_cmdlines(parent: int) -> list[Path]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == parent:
                found.append(stat.parent / "cmdline")
        except (OSError, IndexError, ValueError):
            continue
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--work", type=Path, default=Path("build/bench-refusal"))
    parser.add_argument("--no-interrupt", action="store_true", help="skip the TensorRT build's Ctrl-C")
    args = parser.parse_args()
    from engine_builder.util.bundled import smollm2_gguf

    args.work.mkdir(parents=True, exist_ok=True)
    tiny, slow = checkpoints(args.work)
    out = args.work / "never-written"
    refusals = {
        "convert --group-size 100 (GGUF)": ["convert", str(smollm2_gguf()), str(out), "--quant", "int4_awq",
                                            "--group-size", "100"],
        "build --cc sm90": ["build", str(tiny), str(out), "--cc", "sm90"],
        "build over this machine's memory": ["build", str(tiny), str(out), "--max-seq-len", "16000000",
                                             "--max-input-len", "16000000", "--max-batch", "64"],
    }
    load = os.getloadavg()[0]  # other processes on the cores stretch the wall times: printed beside them
    for what, cmd in refusals.items():
        timed(cmd)  # untimed: page cache and bytecode warm
        walls, cpus = zip(*(timed(cmd) for _ in range(args.runs)))
        print(f"{what}: refused in {statistics.median(walls):.2f} s wall, {statistics.median(cpus):.2f} s CPU "
              f"(median of {args.runs})")
    if not args.no_interrupt:
        times = [interrupt_seconds(slow, out) for _ in range(args.runs)]
        print(f"Ctrl-C during a TensorRT build: exited {statistics.median(times):.2f} s after the signal "
              f"(median of {args.runs}, max {max(times):.2f} s)")
    print(f"load average {load:.2f} -> {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()

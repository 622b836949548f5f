"""`trtbuild` as a user runs it: a real process, its exit code and its one-line errors."""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

# a progress line for logs (engine_builder/cli/progress_lines.py): stderr carries them when it is not a
# terminal, as here; a user error is still one line of its own
PROGRESS_LINE = re.compile(r"^\[ *\d+\.\ds\] [a-z]+: ")


def error_lines(stderr: str) -> list[str]:
    """STDERR's lines without the progress lines."""
    return [line for line in stderr.strip().splitlines() if not PROGRESS_LINE.match(line)]


def trtbuild(*args: str | Path, timeout: float = 600, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine_builder.cli", *map(str, args)], input=stdin,
                          capture_output=True, text=True, timeout=timeout)


def assert_user_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    """Exit code 2, one `error: ` line naming every needle, no traceback."""
    assert proc.returncode == 2, proc.stderr
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def ready_line(proc: subprocess.Popen, prefix: str, timeout: float, log: Callable[[], str]) -> tuple[str, int]:
    """The first stdout line of a starting server PROC that begins with PREFIX, and its line number; kills
    PROC and fails with LOG() if it exits or prints none within TIMEOUT seconds."""
    deadline = time.monotonic() + timeout
    number = 0
    while time.monotonic() < deadline:
        if select.select([proc.stdout], [], [], 1.0)[0]:
            line = proc.stdout.readline()
            number += 1
            if line.startswith(prefix):
                return line, number
            if not line:  # stdout closed: the server exited
                break
    proc.kill()
    proc.wait()
    raise AssertionError(f"{proc.args[3]} did not start (exit {proc.returncode}): {log()[-4000:]}")


# what a refusal must not have loaded: each costs seconds of import (issue 36 LOW 12)
HEAVY_MODULES = ("torch", "transformers", "onnx", "onnxruntime", "tensorrt_rtx", "tensorrt", "gguf")

# runs the CLI in this process after an audit hook that records every open() of a path under WATCH, and at exit
# writes what it saw to REPORT
_WATCHED_CLI = """
import atexit, json, os, runpy, sys
watch, report, heavy = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
opened = []
def hook(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.path.abspath(os.fsdecode(args[0]))
        if path == watch or path.startswith(watch + os.sep):
            opened.append(path)
sys.addaudithook(hook)
def done():
    with open(report, "w") as f:
        json.dump({"opened": opened, "modules": [m for m in heavy if m in sys.modules]}, f)
atexit.register(done)
sys.argv = ["trtbuild", *sys.argv[4:]]
runpy.run_module("engine_builder.cli", run_name="__main__")
"""


def trtbuild_watched(*args: str | Path, watch: Path, timeout: float = 300
                     ) -> tuple[subprocess.CompletedProcess[str], list[str], list[str]]:
    """trtbuild ARGS as a user runs it, and what the process did: (the finished process, the paths under WATCH it
    opened, the HEAVY_MODULES it imported)."""
    fd, name = tempfile.mkstemp(suffix=".json", prefix="trtbuild-watched-")
    os.close(fd)
    report = Path(name)
    try:
        proc = subprocess.run([sys.executable, "-c", _WATCHED_CLI, str(Path(watch).resolve()), str(report),
                               ",".join(HEAVY_MODULES), *map(str, args)], capture_output=True, text=True,
                              timeout=timeout)
        seen = json.loads(report.read_text())
    finally:
        report.unlink(missing_ok=True)
    return proc, seen["opened"], seen["modules"]

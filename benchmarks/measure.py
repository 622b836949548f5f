"""Run a child process and measure it from outside: wall seconds and its own peak RSS."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from dataclasses import dataclass

GNU_TIME = "/usr/bin/time" if os.access("/usr/bin/time", os.X_OK) else None
RSS_SOURCE = "/usr/bin/time %M" if GNU_TIME else "os.wait4 (may include the parent's RSS)"


@dataclass(frozen=True)
class Run:
    seconds: float  # wall, whole subprocess
    max_rss_bytes: int  # peak RSS of this child alone
    stdout: str


def run_child(argv: list[str]) -> Run:
    """Run argv; return its wall time and its own peak RSS.

    os.wait4 gives exactly this child's rusage (RUSAGE_CHILDREN would be a max over all
    children). But Python spawns with vfork, and at exec Linux seeds the child's ru_maxrss
    with the *parent's* high-water RSS (this script has torch imported), so a bare wait4
    would report ~0.5 GB even for cp. GNU time forks from its own tiny process, so its %M
    (also from wait4) is the child's true peak; without it we fall back to wait4 and say so.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r") as rss:
        wrapped = [GNU_TIME, "-f", "%M", "-o", rss.name, *argv] if GNU_TIME else argv
        started = time.perf_counter()
        proc = subprocess.Popen(wrapped, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)  # tell Popen it was reaped
        out.seek(0), err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed with exit {proc.returncode}:\n{stderr}")
        max_rss_kib = int(rss.read().split()[-1]) if GNU_TIME else usage.ru_maxrss  # KiB on Linux
    return Run(seconds, max_rss_kib * 1024, stdout)

"""How many of this process's CPUs other processes keep busy right now, from /proc/stat (Linux).

runner/ort_spinning.py's `auto` rule asks whether the cores onnxruntime's threads need are idle. The
1-minute load average answers late and counts our own work: it still held 1.4 on the quiet 2-core EPYC when
benchmarks/peers.py opened its workers right after its own streaming-read benchmark, so our int4 twin ran
without spinning (135.6 tok/s) beside onnxruntime-genai's spinning one (192.7), with no other process busy
during the runs (issue 22). Here the busy time of the CPUs this process may run on (sched_getaffinity),
minus this process's own CPU time, is taken over a window that ends now: from the previous sample (the first
is taken when this module is imported, so a fresh process measures from its start to its first session,
the imports and the engine's loading) to this one.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from engine_builder.runner.tunables import BUSY_MAX_WINDOW_S, BUSY_MIN_WINDOW_S

_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class CpuSample:
    wall: float  # time.monotonic() seconds
    busy: int  # non-idle clock ticks of the CPUs this process may run on
    own: int  # this process's user + system clock ticks, every thread
    cpus: int  # how many CPUs `busy` sums


def sample() -> CpuSample | None:
    """Now's counters; None where /proc/stat is not there or names none of this process's CPUs."""
    try:
        allowed = os.sched_getaffinity(0)
        busy, seen = 0, 0
        for line in Path("/proc/stat").read_text().splitlines():
            name, _, rest = line.partition(" ")
            if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in allowed:
                continue
            f = [int(v) for v in rest.split()]
            busy += sum(f[:3]) + sum(f[5:8])  # user nice system, irq softirq steal (not idle, iowait)
            seen += 1
        own = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        if not seen:
            return None
        return CpuSample(time.monotonic(), busy, int(own[11]) + int(own[12]), seen)
    except (OSError, ValueError, AttributeError, IndexError):
        return None


def others_busy(since: CpuSample | None, now: CpuSample | None) -> tuple[float, float] | None:
    """(cores other processes kept busy between the samples, the window in seconds), or None where the
    window is too short or too long to say (see BUSY_MIN_WINDOW_S, BUSY_MAX_WINDOW_S) or a sample is missing."""
    if since is None or now is None or since.cpus != now.cpus:
        return None
    window = now.wall - since.wall
    if not BUSY_MIN_WINDOW_S <= window <= BUSY_MAX_WINDOW_S:
        return None
    cores = ((now.busy - since.busy) - (now.own - since.own)) / _HZ / window
    return min(max(cores, 0.0), float(now.cpus)), window


_last = sample()


def others_busy_now() -> tuple[float, float] | None:
    """others_busy since the previous call (or this module's import); the next call measures from here. A
    window shorter than BUSY_MIN_WINDOW_S (an engine that loads that fast after the import) is waited out: at
    most 0.1 s, once per process start, against a whole session of spinning or not. A window over
    BUSY_MAX_WINDOW_S (a session opened minutes after the last: a benchmark's next part, a server's reload) is
    replaced by a fresh one of BUSY_MIN_WINDOW_S rather than left to the load average, which counts this process's
    own work of that last minute (measured: a speculative draft opened after 3 minutes of HF transformers in
    benchmarks/speculative.py's copy part ran without spinning, 1.24-1.32x instead of 1.51-1.86x)."""
    global _last
    now = sample()
    if _last is not None and now is not None and now.wall - _last.wall > BUSY_MAX_WINDOW_S:
        _last = now
    if _last is not None and now is not None and now.wall - _last.wall < BUSY_MIN_WINDOW_S:
        time.sleep(BUSY_MIN_WINDOW_S - (now.wall - _last.wall))
        now = sample()
    result, _last = others_busy(_last, now), now
    return result

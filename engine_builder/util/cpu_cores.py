"""How many CPU cores this process may compute on."""

from __future__ import annotations

import os
import re
from pathlib import Path


def physical_cores() -> int:
    """Physical cores this process may run on: onnxruntime's intra-op threads.

    Hyper-threads share a core's FMA units, so a second thread per core adds contention rather
    than throughput for GEMM-bound decoding (onnxruntime's own default is also one per core).
    """
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    cores = _cores_from_cpuinfo(Path("/proc/cpuinfo"))
    if cores is None:
        try:
            import psutil  # optional: not a dependency

            cores = psutil.cpu_count(logical=False)
        except ImportError:
            cores = None
    return max(1, min(cores or allowed, allowed))


def _cores_from_cpuinfo(path: Path) -> int | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    pairs = set()
    for block in text.split("\n\n"):
        phys = re.search(r"^physical id\s*:\s*(\d+)", block, re.M)
        core = re.search(r"^core id\s*:\s*(\d+)", block, re.M)
        if phys and core:
            pairs.add((phys[1], core[1]))
    return len(pairs) or None

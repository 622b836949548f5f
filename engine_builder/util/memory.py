"""Peak resident memory of a piece of work, measured by the kernel rather than sampled."""

from __future__ import annotations

import resource
from pathlib import Path


def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


class PeakRss:
    """Peak RSS above the RSS at construction, in bytes.

    Linux lets a process reset its high-water mark (clear_refs 5), so the figure covers just
    this work, not imports or earlier work in the same process. Elsewhere it falls back to
    ru_maxrss, an upper bound.
    """

    def __init__(self) -> None:
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self._hwm_reset = True
        except OSError:
            self._hwm_reset = False
        self.baseline = (_status_kib("VmRSS") or 0) * 1024

    def above_baseline(self) -> int:
        hwm = _status_kib("VmHWM") if self._hwm_reset else None
        peak = hwm * 1024 if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return max(0, peak - self.baseline)

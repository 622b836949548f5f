"""Progress where no one watches a terminal: plain lines in a CI log.

Rich's bars redraw one line in place, which only a terminal shows; piped into a CI log they stay
silent for minutes. There each stage gets a line when it starts, and a long stage a line at most
every INTERVAL_S seconds, never wrapped (one `write` per line, whatever the log's width):

    [   0.0s] build: graph and passes for onnxruntime
    [  41.3s] build: TensorRT: Building engine 3/7
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

INTERVAL_S = 10.0


def is_terminal(stream: TextIO | None = None) -> bool:
    stream = stream if stream is not None else sys.stderr
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or replaced streams
        return False


class LineProgress:
    """Stage and step lines on STREAM (stderr), timestamped from construction."""

    def __init__(self, command: str, stream: TextIO | None = None, interval_s: float = INTERVAL_S) -> None:
        self.command = command
        self.stream = stream if stream is not None else sys.stderr
        self.interval_s = interval_s
        self.started = time.monotonic()
        self._last_line = -interval_s
        self._last_stage = ""

    def line(self, text: str) -> None:
        now = time.monotonic() - self.started
        self.stream.write(f"[{now:7.1f}s] {self.command}: {text}\n")
        self.stream.flush()
        self._last_line = now

    def stage(self, text: str) -> None:
        """A new stage: always a line (a repeat of the current one is not)."""
        if text != self._last_stage:
            self._last_stage = text
            self.line(text)

    def step(self, text: str, done: float, total: float | None, unit: str = "") -> None:
        """Progress within a stage: a line when the stage is new, at its end, or INTERVAL_S after the last."""
        now = time.monotonic() - self.started
        finished = total is not None and total > 0 and done >= total
        if text != self._last_stage or finished or now - self._last_line >= self.interval_s:
            self._last_stage = text
            digits = 1 if total is not None and 0 < total < 100 else 0  # "0.4/1.2 MB", not "0/1 MB"
            amount = (f"{done:.{digits}f}/{total:.{digits}f}{unit} ({100 * done / total:.0f}%)" if total
                      else f"{done:.0f}{unit}")
            self.line(f"{text} {amount}")

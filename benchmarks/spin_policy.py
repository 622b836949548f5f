"""One spinning decision for every onnxruntime session a same-process A/B opens, and sessions that take turns.

runner/ort_spinning.py's `auto` lets a session's threads spin when other processes leave idle cores, and
counts the threads this process already let spin as busy: in a benchmark that opens two engines to compare
(slots vs paged, ours vs onnxruntime-genai's graph), the first would spin and the second not, and the
first's workers, spinning on after its Run, would take the cores the second's Run needs (measured with the
speculative target and draft: a verify step 45 ms instead of 23). Inside `same_spinning(threads)` every
session gets the first decision and stops spinning when its Run returns, as a speculative LLM's two do.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def same_spinning(threads: int | None, take_turns: bool = True) -> Iterator[str]:
    """Yields "on" or "off": what every session opened inside gets (TRTBUILD_ORT_SPINNING wins if set).
    take_turns=False keeps onnxruntime's spinning after a Run (decode_overhead.py times one session at a time)."""
    from engine_builder.runner.ort_spinning import ENV, allow_spinning, sessions_take_turns
    from engine_builder.util.cpu_cores import physical_cores

    before = os.environ.get(ENV)
    # decided inside: a decision for sessions that take turns is not counted as this process's spinning threads,
    # so a second same_spinning in one process (speculative.py's parts) decides as the first did
    with sessions_take_turns(take_turns):
        if before is None:
            os.environ[ENV] = "on" if allow_spinning(threads or physical_cores())[0] else "off"
        try:
            yield os.environ[ENV]
        finally:
            if before is None:
                del os.environ[ENV]

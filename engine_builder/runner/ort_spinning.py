"""Whether onnxruntime's intra-op threads spin-wait between kernels: on for an idle machine, off for a busy one.

A decode step is ~250 small kernels; between them onnxruntime's worker threads spin (its default)
so the next kernel starts without a wake-up. That is worth it only while each thread has a core to
itself. Measured (the retired benchmarks/spin_wait.py, results/draft-vocab-and-spin-wait-retired.txt: a
SmolLM2-shaped int4 step, 2 threads pinned to 2 cores, onnxruntime 1.30, Xeon): quiet 4.77 ms spinning vs
5.33 ms not; beside 2 busy processes 14.3 ms spinning vs 9.6 ms not. On the shared 2-core EPYC this repo is
developed on (load average ~9) the bundled SmolLM2 `--quant gguf` engine decoded 11.0 tok/s spinning and 31.1
not (median of 5 alternating runs). So `auto` spins only when the cores the threads need are idle, read when the
session opens: by what other processes used of this process's CPUs since the process started or its
previous session opened (runner/cpu_busy.py; a window under 0.1 s is waited out, one over a minute is
replaced by a fresh 0.1 s one, within 0.25 core of idle counts as idle), or by the 1-minute load average
where /proc/stat cannot tell. The load average
alone lagged and counted our own work: benchmarks/peers.py opened
our int4 twin without spinning (load average 1.4 on 2 CPUs, its own streaming-read test just before)
and measured 135.6 tok/s against onnxruntime-genai's 192.7 with nothing else running (issue 22).

TRTBUILD_ORT_SPINNING=on|off|auto (default auto) overrides the choice.

Sessions that take turns (a speculative target and its draft model: one runs while the other waits) are
opened inside `sessions_take_turns()`: their threads still spin between a Run's kernels but stop when the
Run returns (onnxruntime's session.force_spinning_stop), so a finished session's spinning workers do not
take the cores the next session's Run needs. Measured on the 2-core dev machine (spinning forced on,
`benchmarks/speculative.py --parts breakdown --draft-quant gguf_draft --threads 2`): without the stop a
5-token verify step took 45-46 ms instead of 22-24 and a draft step 13.5-15 ms instead of 8.8-10.9, and the
int4 draft's story ran 0.72-0.84x plain; with it 1.15-1.42x.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator

from engine_builder.runner.cpu_busy import others_busy_now
from engine_builder.runner.tunables import SPIN_MEASURED_SLACK
from engine_builder.util import environment

ENV = "TRTBUILD_ORT_SPINNING"

# Intra-op threads of this process's sessions that were let spin by a measured decision and keep spinning after
# their Runs: what others_busy leaves out as our own, although they take cores whenever they spin (a server that
# reloads). Sessions that take turns are left out: theirs spin only inside their own Run, so a target and its
# draft both spin (2-core machine, int4 draft step 8.8 ms spinning vs 10-11 not). Never decreased (a session's end
# is not seen here): the error is not spinning.
_spinning_in_process = 0


def allow_spinning(threads: int, load_average: float | None = None, cpus: int | None = None) -> tuple[bool, str]:
    """(spin, why) for a session of THREADS intra-op threads on a machine of CPUS with LOAD_AVERAGE."""
    mode = environment.read(ENV)
    if mode in ("on", "off"):
        return mode == "on", f"{ENV}={mode}"
    if threads <= 1:
        return False, "one thread: nothing to wait for"
    global _spinning_in_process
    measured = others_busy_now() if load_average is None else None
    if measured is not None:
        load, source = measured[0], f"other processes' CPU use over the last {measured[1]:.1f} s"
        if _spinning_in_process:
            load, source = load + _spinning_in_process, source + f" plus {_spinning_in_process} spinning threads " \
                                                                 "of this process's other sessions"
    else:
        load, source = (os.getloadavg()[0] if load_average is None else load_average), "load average"
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    idle = cpus - load
    # a measured window sees the kernel's own threads and the counters' 1/100 s steps: a quiet 2-CPU machine
    # reads 0.0-0.1 busy, which must not cost the spinning it measured for
    if idle >= threads - (SPIN_MEASURED_SLACK if measured is not None else 0.0):
        if measured is not None and not stop_spinning_after_run():
            _spinning_in_process += threads
        return True, f"{idle:.1f} of {cpus} CPUs idle by the {source}: enough for {threads} spinning threads"
    return False, f"{source} {load:.1f} on {cpus} CPUs leaves fewer than {threads} idle: spinning would " \
                  f"steal from other work and wait on preempted threads"


_TAKING_TURNS = contextvars.ContextVar("trtbuild_ort_sessions_take_turns", default=False)


@contextlib.contextmanager
def sessions_take_turns(on: bool = True) -> Iterator[None]:
    """onnxruntime sessions opened inside (in this context: copy it into threads that open them) stop their
    threads' spinning when a Run returns."""
    token = _TAKING_TURNS.set(on)
    try:
        yield
    finally:
        _TAKING_TURNS.reset(token)


def stop_spinning_after_run() -> bool:
    return _TAKING_TURNS.get()

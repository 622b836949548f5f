"""Ranks other than 0: follow the driver's commands (parallel_backend.py) until it says STOP."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

from engine_builder.runner.engine import EngineDir
from engine_builder.runner.parallel.collectives import Collectives
from engine_builder.runner.parallel.parallel_backend import COPY, HEADER, STEP, STOP, ZERO, default_threads
from engine_builder.runner.parallel.rank_runner import RankRunner


def follow(engine_dir: Path, verify: bool = True, threads: int | None = None, comm: Collectives | None = None) -> int:
    """Run this rank's part of every step the driver broadcasts; returns the number of steps run."""
    engine = EngineDir.load(engine_dir, verify=verify)
    engine.check_host_memory()  # before joining the other ranks, as they check too
    mapping = engine.manifest.mapping
    assert mapping is not None
    comm = comm or Collectives(mapping)
    runner = RankRunner(engine.path, engine.manifest, comm, threads or default_threads(comm))
    steps = 0
    # Ctrl-C in a terminal reaches every rank; a follower stops when rank 0 says STOP (or goes away), not before
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        while True:
            op, a, b, c = (int(v) for v in comm.broadcast_ints(None, HEADER))
            if op == STOP:
                return steps
            if op == STEP:  # a = first slot, b = rows, c = seq
                payload = comm.broadcast_ints(None, b * c + b)
                runner.step(a, payload[:b * c].reshape(b, c), payload[b * c:])
                steps += 1
            elif op == COPY:  # a = n, b = length
                payload = comm.broadcast_ints(None, 2 * a)
                runner.copy_rows(payload[:a].tolist(), payload[a:].tolist(), b)
            elif op == ZERO:
                runner.zero_rows(a, b)
            else:
                raise RuntimeError(f"unknown driver command {op}")
    except RuntimeError as exc:  # gloo / NCCL: the driver's connection closed (it crashed or was killed)
        print(f"rank {comm.rank}: lost rank 0 after {steps} steps ({str(exc).splitlines()[0]}); stopping",
              file=sys.stderr)
        raise SystemExit(1) from None
    finally:
        runner.close()
        comm.close()

"""Ranks other than 0: follow the driver's commands (parallel_backend.py) until it says STOP.

This is not a generation loop: the one step loop (schedule -> prepare -> execute -> sample -> update) runs on
rank 0, and its Backend.forward is a ParallelBackend, which broadcasts each engine step; a follower only runs its
part of that step (its shard, its KV rows), as vLLM's workers do under the engine core. It schedules nothing,
samples nothing and never sees a request.

The driver's first command (OPEN) says which runner every rank opens: the onnxruntime segments (rank_runner.py)
or the torch decoder (torch_ranks.py); each then executes its own commands, the loop here being the same.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from typing import Protocol

from engine_builder.runner.engine import EngineDir
from engine_builder.runner.parallel.collectives import Collectives
from engine_builder.runner.parallel.parallel_backend import (
    COPY,
    HEADER,
    OPEN,
    STEP,
    STOP,
    TORCH,
    ZERO,
    default_threads,
)
from engine_builder.runner.parallel.rank_runner import RankRunner


class Follower(Protocol):
    def command(self, op: int, a: int, b: int, c: int) -> bool:
        """Carry out the driver's command OP (its arguments A, B, C; any payload read from the control group);
        whether it was a step."""
        ...

    def close(self) -> None: ...


class SegmentFollower:
    """The onnxruntime segments of this rank (rank_runner.py)."""

    def __init__(self, engine: EngineDir, comm: Collectives, threads: int) -> None:
        self.comm = comm
        self.runner = RankRunner(engine.path, engine.manifest, comm, threads)

    def command(self, op: int, a: int, b: int, c: int) -> bool:
        if op == STEP:  # a = first slot, b = rows, c = seq
            payload = self.comm.broadcast_ints(None, b * c + b)
            self.runner.step(a, payload[:b * c].reshape(b, c), payload[b * c:])
            return True
        if op == COPY:  # a = n, b = length
            payload = self.comm.broadcast_ints(None, 2 * a)
            self.runner.copy_rows(payload[:a].tolist(), payload[a:].tolist(), b)
        elif op == ZERO:
            self.runner.zero_rows(a, b)
        else:
            raise RuntimeError(f"unknown driver command {op}")
        return False

    def close(self) -> None:
        self.runner.close()


def follow(engine_dir: Path, verify: bool = True, threads: int | None = None, comm: Collectives | None = None) -> int:
    """Run this rank's part of every step the driver broadcasts; returns the number of steps run."""
    engine = EngineDir.load(engine_dir, verify=verify)
    engine.check_host_memory()  # before joining the other ranks, as they check too
    mapping = engine.manifest.mapping
    assert mapping is not None
    comm = comm or Collectives(mapping)
    steps = 0
    runner: Follower | None = None
    # Ctrl-C in a terminal reaches every rank; a follower stops when rank 0 says STOP (or goes away), not before
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        op, kind, _, _ = (int(v) for v in comm.broadcast_ints(None, HEADER))
        if op == STOP:  # the driver failed before opening its runner
            return steps
        if op != OPEN:
            raise RuntimeError(f"the driver's first command is {op}, not OPEN")
        if kind == TORCH:
            from engine_builder.runner.parallel.torch_ranks import TorchFollower

            runner = TorchFollower(engine, comm, threads or default_threads(comm))
        else:
            runner = SegmentFollower(engine, comm, threads or default_threads(comm))
        while True:
            op, a, b, c = (int(v) for v in comm.broadcast_ints(None, HEADER))
            if op == STOP:
                return steps
            steps += runner.command(op, a, b, c)
    except RuntimeError as exc:  # gloo / NCCL: the driver's connection closed (it crashed or was killed)
        print(f"rank {comm.rank}: lost rank 0 after {steps} steps ({str(exc).splitlines()[0]}); stopping",
              file=sys.stderr)
        raise SystemExit(1) from None
    finally:
        if runner is not None:
            runner.close()
        comm.close()

"""Starting the ranks of a tp/pp engine: under torchrun or mpirun, or spawned here by one `trtbuild run`.

Whichever starts them, every rank runs the same command with the standard torch.distributed environment
(RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT): rank 0 generates and prints,
the others follow it (worker.py). `spawn_ranks` is what torchrun would do on one host, kept to
subprocesses of this same command line so the code path is identical. Under mpirun, mpi_env.py turns the
MPI launcher's variables into those first.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from engine_builder.formats.manifest import EngineManifest
from engine_builder.runner.parallel.mpi_env import adopt_mpi_environment
from engine_builder.util.errors import TrtbuildError

Role = Literal["single", "launcher", "driver", "worker"]
# a worker still running this long after rank 0 exited has nothing left to do (rank 0 said STOP or went away):
# stop it. Generous: on a loaded 2-core CI machine four ranks tearing down torch and onnxruntime at once took
# over 10 s (a test's run exited 1 with no message, the killed worker's only trace)
WORKER_GRACE_SECONDS = 30.0


def world_size_of(engine_dir: Path) -> int | None:
    """tp * pp of a tp/pp engine dir; None for a single-process dir (or one that fails to load: the normal
    path reports why)."""
    try:
        manifest = EngineManifest.load(Path(engine_dir))
    except TrtbuildError:
        return None
    if manifest.mapping is None:
        return None
    if manifest.model is not None:  # a hand-edited mapping fails here, in one line, before any rank starts
        manifest.mapping.check(manifest.model)
    return manifest.mapping.world_size


def role(engine_dir: Path) -> Role:
    """What this process does with ENGINE_DIR: run it alone, spawn its ranks, drive them, or follow."""
    if world_size_of(engine_dir) is None:
        return "single"
    adopt_mpi_environment(free_port)
    if "RANK" not in os.environ:
        return "launcher"
    return "driver" if int(os.environ["RANK"]) == 0 else "worker"


def dispatch_ranks(engine_dir: Path, verify: bool = True,
                   before_spawn: Callable[[], object] | None = None) -> int | None:
    """The tp/pp launch decision of `run` and `serve`, in one place: None when this process runs the engine
    (alone, or as rank 0 driving the others); otherwise it has done its part (spawned every rank and waited, or
    followed rank 0 as a worker) and this is the command's exit code. before_spawn: the launcher's checks of the
    command's own input, before any rank starts."""
    what = role(engine_dir)
    if what == "launcher":
        if before_spawn is not None:
            before_spawn()
        return spawn_ranks(world_size_of(engine_dir) or 1)
    if what == "worker":
        from engine_builder.runner.parallel.worker import follow

        follow(engine_dir, verify=verify)
        return 0
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(world_size: int, argv: list[str] | None = None) -> int:
    """Run this command line (default: sys.argv) once per rank on this host; rank 0 keeps stdin, stdout and
    stderr, the others' stdout is dropped. Returns rank 0's exit code (a worker's when rank 0 succeeded but
    a worker failed; a worker that outlives rank 0 by WORKER_GRACE_SECONDS is stopped with a warning)."""
    args = [sys.executable, "-m", "engine_builder.cli", *(sys.argv[1:] if argv is None else argv)]
    base = {**os.environ, "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    procs: list[subprocess.Popen] = []

    def forward(signum: int, _frame: object) -> None:  # a stop request goes to rank 0, which stops the others
        if procs:
            procs[0].send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for rank in range(world_size):
            env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank)}
            procs.append(subprocess.Popen(args, env=env, stdin=None if rank == 0 else subprocess.DEVNULL,
                                          stdout=None if rank == 0 else subprocess.DEVNULL))
        code = procs[0].wait()
        worst = 0
        for rank, p in enumerate(procs[1:], start=1):
            try:
                worst = worst or p.wait(timeout=WORKER_GRACE_SECONDS)
            except subprocess.TimeoutExpired:  # rank 0 printed everything: the command's work is done either way
                p.kill()
                p.wait()
                print(f"warning: rank {rank} was still running {WORKER_GRACE_SECONDS:.0f} s after rank 0 exited; "
                      "stopped it", file=sys.stderr)
        return code or worst
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for p in procs:  # an error here: no rank outlives the launcher
            if p.poll() is None:
                p.kill()
                p.wait()

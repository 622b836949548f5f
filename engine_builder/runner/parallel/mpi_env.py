"""Ranks started by `mpirun` / `mpiexec`: the MPI launcher's environment becomes torch.distributed's.

mpirun tells each process its place in variables of its own (Open MPI: OMPI_COMM_WORLD_RANK/SIZE and
..._LOCAL_RANK/_LOCAL_SIZE; MPICH and Intel MPI's Hydra: PMI_RANK/PMI_SIZE, MPI_LOCALRANKID/MPI_LOCALNRANKS)
but gives no rendezvous address. Rank 0 picks one (its host and a free port) and mpi4py broadcasts it. From
then on the ranks are indistinguishable from torchrun's (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT): the collectives stay torch.distributed's (gloo or NCCL), on the same code path.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

from engine_builder.util.errors import InputError

# (rank, size, local rank, local size) variables of each MPI family's launcher
_LAUNCHERS = (
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
)


@dataclass(frozen=True)
class MpiPlace:
    rank: int
    size: int
    local_rank: int
    local_size: int


def mpi_place(environ: dict[str, str] | os._Environ = os.environ) -> MpiPlace | None:
    """Where mpirun put this process, or None when no MPI launcher started it."""
    for rank, size, local_rank, local_size in _LAUNCHERS:
        if rank in environ and size in environ:
            r, n = int(environ[rank]), int(environ[size])
            return MpiPlace(r, n, int(environ.get(local_rank, r)), int(environ.get(local_size, n)))
    return None


def adopt_mpi_environment(free_port: Callable[[], int]) -> bool:
    """Under mpirun (and not already given RANK by torchrun): set the torch.distributed variables, with rank 0's
    address and FREE_PORT() broadcast over MPI. Returns whether it did."""
    place = mpi_place()
    if place is None or "RANK" in os.environ:
        return False
    try:
        from mpi4py import MPI
    except ImportError:
        raise InputError("mpirun started this rank but mpi4py is not installed: `pip install mpi4py` (or launch "
                         "with `trtbuild run DIR`, which spawns the ranks itself, or torchrun)") from None
    address = None
    if place.rank == 0:
        # one host: loopback; several: this host's address, which the other hosts must reach
        host = "127.0.0.1" if place.local_size == place.size else socket.gethostbyname(socket.gethostname())
        address = (host, free_port())
    host, port = MPI.COMM_WORLD.bcast(address, root=0)
    os.environ.update(RANK=str(place.rank), WORLD_SIZE=str(place.size), LOCAL_RANK=str(place.local_rank),
                      LOCAL_WORLD_SIZE=str(place.local_size), MASTER_ADDR=host, MASTER_PORT=str(port))
    return True

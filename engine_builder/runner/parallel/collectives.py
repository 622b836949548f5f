"""The collectives a tp/pp engine needs, over torch.distributed: gloo on CPU, NCCL on GPUs.

Ranks join from the standard environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), the one
torchrun sets and runner/parallel/launch.py sets when `trtbuild run` spawns the ranks itself. With NCCL each
rank takes GPU LOCAL_RANK and moves a tensor there for the collective (the segments themselves run on
onnxruntime, on the host); with gloo tensors stay on the host and all-reduce in place in the numpy buffer.

Groups: one all-reduce group per pipeline stage (its tp ranks), the world for stage-to-stage send/recv,
and a gloo group over every rank for the driver's step commands (small host tensors, whatever the
data backend).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from engine_builder.formats.parallel_mapping import ParallelMapping
from engine_builder.util import environment
from engine_builder.util.errors import InputError

BACKEND_ENV = "TRTBUILD_DIST_BACKEND"  # gloo | nccl; default: nccl when every local rank has a GPU, else gloo


@dataclass(frozen=True)
class RankEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    @classmethod
    def from_env(cls) -> RankEnv:
        try:
            rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            local = int(os.environ.get("LOCAL_RANK", rank))
            local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        except (KeyError, ValueError) as exc:
            raise InputError(f"a tp/pp rank needs RANK and WORLD_SIZE in its environment ({exc}); launch it with "
                             "`trtbuild run DIR ...` (spawns every rank), `torchrun --nproc-per-node N -m "
                             "engine_builder.cli run DIR ...` or `mpirun -n N trtbuild run DIR ...`") from None
        return cls(rank, world, local, local_world)


def choose_backend(env: RankEnv) -> str:
    wanted = environment.read(BACKEND_ENV)
    if wanted != "auto":
        return wanted
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return "nccl" if gpus >= env.local_world_size and dist.is_nccl_available() else "gloo"


def _to_torch(array: np.ndarray) -> torch.Tensor:
    """A tensor sharing ARRAY's memory (bfloat16, which numpy lacks, through an int16 view)."""
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def _to_numpy(tensor: torch.Tensor, like: np.dtype) -> np.ndarray:
    tensor = tensor.cpu()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(like)
    return tensor.numpy()


class Collectives:
    """This rank's place in the mapping and its collectives on numpy arrays."""

    def __init__(self, mapping: ParallelMapping, env: RankEnv | None = None, backend: str | None = None) -> None:
        self.env = env or RankEnv.from_env()
        if self.env.world_size != mapping.world_size:
            raise InputError(f"this engine has tp={mapping.tp} x pp={mapping.pp} = {mapping.world_size} ranks but "
                             f"WORLD_SIZE is {self.env.world_size}; launch {mapping.world_size} ranks "
                             f"(torchrun --nproc-per-node {mapping.world_size}), or drop torchrun and let "
                             "`trtbuild run` spawn them")
        self.mapping = mapping
        self.rank = self.env.rank
        self.backend = backend or choose_backend(self.env)
        if self.backend == "nccl":
            self.device = torch.device("cuda", self.env.local_rank)
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        if not dist.is_initialized():
            kwargs = {"device_id": self.device} if self.backend == "nccl" else {}
            dist.init_process_group(self.backend, init_method="env://", rank=self.rank,
                                    world_size=self.env.world_size, **kwargs)
        # every rank creates every group, in the same order (torch.distributed requires it)
        stage_groups = [dist.new_group(mapping.stage_ranks(s)) for s in range(mapping.pp)]
        self.tp_group = stage_groups[mapping.pp_rank(self.rank)]
        self.control = dist.new_group(list(range(mapping.world_size)), backend="gloo")
        self.tp_rank, self.pp_rank = mapping.tp_rank(self.rank), mapping.pp_rank(self.rank)

    # ---- tensor parallel -------------------------------------------------------------------------------
    def all_reduce(self, array: np.ndarray) -> np.ndarray:
        """The sum of ARRAY over this stage's tp ranks (in place on the host with gloo)."""
        if self.mapping.tp == 1:
            return array
        tensor = _to_torch(np.ascontiguousarray(array))
        if self.device.type == "cpu":
            dist.all_reduce(tensor, group=self.tp_group)
            return array if tensor.data_ptr() == array.ctypes.data else _to_numpy(tensor, array.dtype)
        on_device = tensor.to(self.device)
        dist.all_reduce(on_device, group=self.tp_group)
        return _to_numpy(on_device, array.dtype)

    def all_gather_last(self, array: np.ndarray) -> np.ndarray:
        """ARRAY of every tp rank of this stage, concatenated along the last axis in tp-rank order."""
        if self.mapping.tp == 1:
            return array
        tensor = _to_torch(np.ascontiguousarray(array)).to(self.device)
        parts = [torch.empty_like(tensor) for _ in range(self.mapping.tp)]
        dist.all_gather(parts, tensor, group=self.tp_group)
        return _to_numpy(torch.cat(parts, dim=-1), array.dtype)

    # ---- pipeline parallel -----------------------------------------------------------------------------
    def isend(self, array: np.ndarray, dst: int) -> tuple[dist.Work, torch.Tensor]:
        """Start sending ARRAY to rank DST; keep the returned pair until its work is waited on."""
        tensor = _to_torch(np.ascontiguousarray(array)).to(self.device)
        return dist.isend(tensor, dst), tensor

    def recv(self, shape: tuple[int, ...], dtype: np.dtype, src: int) -> np.ndarray:
        buffer = np.empty(shape, dtype)
        tensor = _to_torch(buffer).to(self.device)
        dist.recv(tensor, src)
        return buffer if tensor.device.type == "cpu" else _to_numpy(tensor, dtype)

    # ---- driver commands (host tensors over the gloo control group) ------------------------------------
    def broadcast_ints(self, values: np.ndarray | None, count: int) -> np.ndarray:
        """Rank 0's COUNT int64 values on every rank (VALUES on rank 0, None elsewhere)."""
        tensor = torch.from_numpy(np.ascontiguousarray(values, np.int64)) if self.rank == 0 else \
            torch.empty(count, dtype=torch.int64)
        dist.broadcast(tensor, 0, group=self.control)
        return tensor.numpy()

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

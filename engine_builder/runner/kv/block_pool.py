"""Storage of the paged KV cache: per layer one numpy pool of fixed-size blocks, and a reference count per block.

    keys[i], values[i]   [kv_heads, num_blocks, block_size, head_dim]   the graph's kv_pool_key.{i} / kv_pool_value.{i}
                                                                         (formats/graph_io.py PagedKVLayout)

Block 0 is the scratch block: never handed out, always referenced. Block-table entries past a sequence's
blocks and the rows of idle sequences point at it, so the graph's reads of unused entries see finite values
(masked) and its writes for rows that ride along idle land where nobody reads them.

A KV budget (block_budget.py) smaller than the pool caps it (cap): the blocks past the budget are withheld, by
count, from what take() hands out, so a budget can only lower what the pool holds.

A block is free when its count is 0. Sequences and the radix tree (radix_blocks.py) each hold one reference
per block they map, so a prefix shared by a cached tree node and three running sequences counts 4. An int8
cache (`convert --kv-cache int8`) stores int8 here; its per-channel scales are constants of the graph.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

from engine_builder.formats.graph_io import PagedKVLayout
from engine_builder.runner.tunables import HOST_KV_RAM_FRACTION
from engine_builder.util.errors import CapacityError, InputError

SCRATCH_BLOCK = 0


def available_ram() -> int:
    """MemAvailable of /proc/meminfo in bytes (total physical memory where it is missing)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def numpy_kv_dtype(dtype: str) -> np.dtype:
    if dtype == "bfloat16":  # numpy has no bfloat16; onnxruntime takes ml_dtypes' one
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


class BlockPool:
    def __init__(self, layout: PagedKVLayout, num_blocks: int, host_buffers: bool = True) -> None:
        """host_buffers=False: the bookkeeping only, for a backend whose pool lives on a GPU (runner/trt_paged.py):
        keys/values are then empty and copy() calls copy_blocks, which that backend sets."""
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 2:
            raise InputError(f"a KV block pool needs at least 2 blocks (one is scratch), got {num_blocks!r}; "
                             "raise kv_cache_memory (--kv-cache-memory)")
        self.layout, self.num_blocks, self.block_size = layout, num_blocks, layout.block_size
        self.dtype = numpy_kv_dtype(layout.dtype)
        shape = layout.pool_shape(num_blocks)
        # np.zeros maps zero pages lazily: blocks never written cost no RAM; zeros are finite, as the
        # graph's masked reads of unused blocks need
        layers = layout.num_layers if host_buffers else 0
        self.keys = tuple(np.zeros(shape, self.dtype) for _ in range(layers))
        self.values = tuple(np.zeros(shape, self.dtype) for _ in range(layers))
        self.copy_blocks: Callable[[Sequence[int], Sequence[int]], None] | None = None
        self.refcount = np.zeros(num_blocks, np.int64)
        self.refcount[SCRATCH_BLOCK] = 1
        self._free = list(range(num_blocks - 1, 0, -1))  # a stack: the lowest id comes out first
        self.withheld = 0  # free blocks take() may not hand out: the pool's blocks past a KV budget (cap)

    @classmethod
    def for_budget(cls, layout: PagedKVLayout, kv_cache_memory: int | None = None,
                   min_blocks: int = 2, max_blocks: int | None = None, host_buffers: bool = True) -> BlockPool:
        """As many blocks as kv_cache_memory bytes hold (default: a quarter of the available RAM, up to
        max_blocks), at least min_blocks."""
        if kv_cache_memory is None:
            kv_cache_memory = int(available_ram() * HOST_KV_RAM_FRACTION)
        if isinstance(kv_cache_memory, bool) or not isinstance(kv_cache_memory, int) or kv_cache_memory < 1:
            raise InputError(f"kv_cache_memory must be a positive number of bytes, got {kv_cache_memory!r}")
        blocks = kv_cache_memory // layout.bytes_per_block
        if max_blocks is not None:
            blocks = min(blocks, max_blocks)
        if blocks < min_blocks:
            raise CapacityError(f"kv_cache_memory (--kv-cache-memory) {kv_cache_memory} bytes holds {blocks} KV "
                                f"blocks of {layout.bytes_per_block} bytes, fewer than the {min_blocks} needed; give "
                                f"at least {min_blocks * layout.bytes_per_block} bytes")
        return cls(layout, int(blocks), host_buffers)

    @property
    def nbytes(self) -> int:
        return self.num_blocks * self.layout.bytes_per_block

    @property
    def num_free(self) -> int:
        """Free blocks take() may hand out (within the budget's cap)."""
        return max(0, len(self._free) - self.withheld)

    @property
    def usable_blocks(self) -> int:
        """Blocks sequences may hold together: all but the scratch block, at most the budget's cap."""
        return self.num_blocks - 1 - self.withheld

    def cap(self, blocks: int | None) -> None:
        """Hand out at most `blocks` (a KV budget's) of the pool's blocks; None: all of them."""
        self.withheld = 0 if blocks is None else max(0, self.num_blocks - 1 - blocks)

    @property
    def num_used(self) -> int:
        return self.num_blocks - 1 - len(self._free)

    def take(self, n: int) -> list[int]:
        """n free blocks, each with one reference (the caller's)."""
        if n > self.num_free:
            raise CapacityError(f"the KV cache needs {n} free blocks but has {self.num_free} of "
                                f"{self.usable_blocks}; wait for running requests to finish, or raise "
                                "kv_cache_memory (--kv-cache-memory)" + (" and the KV budget (--kv-budget-tokens)"
                                                                          if self.withheld else ""))
        out = [self._free.pop() for _ in range(n)]
        self.refcount[out] = 1
        return out

    def incref(self, blocks: Iterable[int]) -> None:
        for b in blocks:
            if self.refcount[b] < 1:
                raise ValueError(f"block {b} is free; only a referenced block can be shared")
            self.refcount[b] += 1

    def decref(self, blocks: Iterable[int]) -> None:
        for b in blocks:
            if b == SCRATCH_BLOCK or self.refcount[b] < 1:
                raise ValueError(f"block {b} is not referenced (freed twice?)")
            self.refcount[b] -= 1
            if self.refcount[b] == 0:
                self._free.append(int(b))

    def copy(self, src: Sequence[int], dst: Sequence[int]) -> None:
        """Block src[i]'s keys and values -> block dst[i], every layer."""
        if self.copy_blocks is not None:
            self.copy_blocks(src, dst)
            return
        for pool in (*self.keys, *self.values):  # head-major: blocks are axis 1 (io.POOL_BLOCK_AXIS)
            pool[:, list(dst)] = pool[:, list(src)]

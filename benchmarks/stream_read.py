"""Streaming-read bandwidth of this machine: the ceiling a memory-bound decode step runs into.

    OPENBLAS_NUM_THREADS=1 python benchmarks/stream_read.py [--threads N] [--mib 256] [--repeats 8]

A float32 matrix far larger than the caches, times a vector (OpenBLAS sgemv: the matrix is read
once, the vector stays in L1), split in row blocks over N Python threads; best of --repeats, in
GB/s (1e9 bytes). Decoding one token reads every weight once, so weight bytes / this figure is the
shortest step time a batch-1 decode can have. peers.py runs it in a child with one OpenBLAS thread
per Python thread (the variable must be set before numpy loads).
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def stream_read_gbs(threads: int, mib: int = 256, repeats: int = 8) -> float:
    matrix = np.ones(((mib << 20) // 4096, 1024), np.float32)
    vector = np.ones(1024, np.float32)
    blocks = np.array_split(matrix, threads)
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats):
            started = time.perf_counter()
            list(pool.map(lambda block: block @ vector, blocks))
            best = min(best, time.perf_counter() - started)
    return matrix.nbytes / best / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=8)
    args = parser.parse_args()
    print(json.dumps({"threads": args.threads, "mib": args.mib, "gb_s": stream_read_gbs(args.threads, args.mib,
                                                                                         args.repeats)}))


if __name__ == "__main__":
    main()

"""sha256 of a file, streamed through one reused buffer so hashing a multi-GB shard costs no memory.

hashlib releases the GIL while it hashes a large buffer, so several files hash in parallel on
threads; OpenSSL's sha256 uses the CPU's SHA extensions where present (measured figures:
README, "Integrity").
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CHUNK = 1 << 20  # 1 MiB: syscall overhead vanishes; 64 KiB..4 MiB all measured within noise (~1.1-1.5 GB/s)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            digest.update(view[:n])
    return digest.hexdigest()


def sha256_files(paths: list[Path]) -> list[str]:
    """sha256_file of each path, in order, hashed in parallel (one thread per core at most)."""
    if len(paths) <= 1:
        return [sha256_file(p) for p in paths]
    workers = min(len(paths), os.cpu_count() or 1)
    with ThreadPoolExecutor(workers, thread_name_prefix="sha256") as pool:
        return list(pool.map(sha256_file, paths))

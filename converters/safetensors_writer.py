"""Incremental safetensors writer.

The safetensors library only saves a dict of tensors held in memory. A checkpoint can be
larger than RAM, so we lay out the header up front from the planned shapes and dtypes,
then append each tensor's bytes as they are produced. Fused tensors are concatenated along
dim 0, which in row-major order is just their parts' bytes one after another, so a part
never needs to meet its siblings in memory, and a part whose dtype is unchanged is copied
file-to-file by the kernel without passing through Python at all.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

# dtype name (torch's spelling) -> (safetensors dtype name, bytes per element)
ST_DTYPES = {
    "float32": ("F32", 4), "float16": ("F16", 2), "bfloat16": ("BF16", 2), "float64": ("F64", 8),
    "int8": ("I8", 1), "uint8": ("U8", 1), "int32": ("I32", 4), "int64": ("I64", 8),
    "float8_e4m3fn": ("F8_E4M3", 1), "float8_e5m2": ("F8_E5M2", 1),
}
_COPY_CHUNK = 1 << 24  # bytes per copy_file_range call / fallback read


class StreamingSafetensorsWriter:
    def __init__(self, path: Path, layout: list[tuple[str, str, tuple[int, ...]]],
                 metadata: dict[str, str] | None = None):
        header: dict[str, object] = {"__metadata__": metadata} if metadata else {}
        offset = 0
        self._expected: list[tuple[str, int]] = []
        for name, dtype, shape in layout:
            st_name, size = ST_DTYPES[dtype]
            nbytes = math.prod(shape) * size
            header[name] = {"dtype": st_name, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            self._expected.append((name, nbytes))
            offset += nbytes
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # the spec pads the header to 8 bytes with spaces
        self._file = open(path, "wb")
        self._file.write(len(raw).to_bytes(8, "little") + raw)
        self._file.flush()
        self._next = 0
        self._pending = 0  # bytes still owed to the current tensor

    def _claim(self, name: str, nbytes: int) -> None:
        """Account for `nbytes` more of tensor `name`, which must be the one being written."""
        if self._pending == 0:
            if self._next == len(self._expected) or self._expected[self._next][0] != name:
                raise RuntimeError(f"writer got {name!r} out of the planned order")
            self._pending = self._expected[self._next][1]
            self._next += 1
        elif self._expected[self._next - 1][0] != name:
            raise RuntimeError(f"{self._expected[self._next - 1][0]!r} is incomplete")
        if nbytes > self._pending:
            raise RuntimeError(f"{name!r} received more bytes than its shape holds")
        self._pending -= nbytes

    def append(self, name: str, part: torch.Tensor | np.ndarray) -> None:
        """Write `part` (a torch tensor or a numpy array), the whole tensor `name` or its next dim-0 slice."""
        if isinstance(part, np.ndarray):  # numpy arrays spare the quantizer importing torch
            data = np.ascontiguousarray(part).reshape(-1).view(np.uint8)
        else:
            import torch

            data = part.contiguous().view(torch.uint8).numpy()
        self._claim(name, data.nbytes)
        self._file.write(memoryview(data))

    def append_range(self, name: str, src: Path, offset: int, nbytes: int) -> None:
        """Write `nbytes` of `src` starting at `offset` as the next bytes of tensor `name`."""
        self._claim(name, nbytes)
        self._file.flush()
        out_fd = self._file.fileno()
        with open(src, "rb") as f:
            done = 0
            while done < nbytes:
                want = min(_COPY_CHUNK, nbytes - done)
                try:
                    n = os.copy_file_range(f.fileno(), out_fd, want, offset + done)
                except OSError:  # filesystems without it: a bounded read/write loop
                    f.seek(offset + done)
                    n = os.write(out_fd, f.read(want))
                if n == 0:
                    raise OSError(f"{src} ended before byte {offset + nbytes}; the file is truncated")
                done += n
        # keep Python's buffered position in step with the bytes the kernel wrote
        self._file.seek(0, os.SEEK_END)

    def close(self) -> None:
        self._file.close()
        if self._pending or self._next != len(self._expected):
            raise RuntimeError("safetensors writer closed before every tensor was written")

    def __enter__(self) -> StreamingSafetensorsWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.close()
        else:
            self._file.close()

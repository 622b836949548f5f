"""Incremental safetensors writer.

The safetensors library only saves a dict of tensors held in memory. A checkpoint can be
larger than RAM, so we lay out the header up front from the planned shapes and dtypes,
then append each tensor's bytes as it is produced. Fused tensors are concatenated along
dim 0, which in row-major order is just their parts' bytes one after another, so a part
never needs to meet its siblings in memory.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import TracebackType

import torch

# torch dtype -> (safetensors dtype name, bytes per element)
ST_DTYPES = {
    torch.float32: ("F32", 4), torch.float16: ("F16", 2), torch.bfloat16: ("BF16", 2),
    torch.float64: ("F64", 8), torch.int8: ("I8", 1), torch.uint8: ("U8", 1),
    torch.int32: ("I32", 4), torch.int64: ("I64", 8),
    torch.float8_e4m3fn: ("F8_E4M3", 1), torch.float8_e5m2: ("F8_E5M2", 1),
}


class StreamingSafetensorsWriter:
    def __init__(self, path: Path, layout: list[tuple[str, torch.dtype, tuple[int, ...]]],
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
        self.header = header
        self.data_start = 8 + len(raw)
        self._file = open(path, "wb")
        self._file.write(len(raw).to_bytes(8, "little") + raw)
        self._next = 0
        self._pending = 0  # bytes still owed to the current tensor

    def append(self, name: str, part: torch.Tensor) -> None:
        """Write `part`, the whole tensor `name` or its next dim-0 slice."""
        if self._pending == 0:
            want, self._pending = self._expected[self._next]
            if want != name:
                raise RuntimeError(f"writer expected {want!r} next, got {name!r}")
            self._next += 1
        elif self._expected[self._next - 1][0] != name:
            raise RuntimeError(f"{self._expected[self._next - 1][0]!r} is incomplete")
        data = part.contiguous().view(torch.uint8).numpy()
        if data.nbytes > self._pending:
            raise RuntimeError(f"{name!r} received more bytes than its shape holds")
        self._file.write(memoryview(data))
        self._pending -= data.nbytes

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

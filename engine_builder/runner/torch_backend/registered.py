"""The `torch` backend as the registry sees it: can it run here, and open it (runtime.py does the work).

Registering imports no torch: `trtbuild run` on the CPU twin must not pay torch's import (tests/runner/
test_cold_start.py), so whether a CUDA GPU is present is asked of the driver library itself (cuInit and
cuDeviceGetCount through ctypes, a few milliseconds), and torch loads only when the backend opens.

Every engine dir qualifies: the backend runs rank0.safetensors (the checkpoint's canonical tensors, which
every build keeps) with the manifest's model config, not a graph. `auto` picks it where a CUDA GPU is present
and TensorRT cannot run the engine (preference between the two); on a CPU it runs only when asked
(`--backend torch`: float32, the CI path).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import ClassVar

from engine_builder.runner.backend import Backend, register_backend
from engine_builder.runner.engine import EngineDir


@functools.cache
def cuda_devices() -> int:
    """CUDA devices the driver reports (0 without a driver), asked without importing torch."""
    name = ctypes.util.find_library("cuda") or "libcuda.so.1"
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


@register_backend(preference=5)  # below TensorRT (10), above the onnxruntime twin (0)
class TorchBackend(Backend):
    name: ClassVar[str] = "torch"
    title: ClassVar[str] = "PyTorch"

    @classmethod
    def usable(cls, engine: EngineDir) -> tuple[bool, str]:
        ok, why = cls.usable_when_asked(engine)
        if not ok:
            return ok, why
        if not cuda_devices():
            return False, "no CUDA GPU here (`--backend torch` runs it on the CPU, in float32)"
        return True, "PyTorch on the CUDA GPU (no TensorRT runtime can run this engine here)"

    @classmethod
    def usable_when_asked(cls, engine: EngineDir) -> tuple[bool, str]:
        if engine.manifest.mapping is not None:
            return False, "a tp/pp engine dir runs on onnxruntime ranks (the torch backend runs tp=1, pp=1)"
        if not engine.weights_path.is_file():
            return False, f"{engine.weights_path} (the checkpoint's weights) is missing"
        return True, ""

    @classmethod
    def open(cls, engine: EngineDir, *, threads: int | None = None) -> Backend:
        from engine_builder.runner.torch_backend.runtime import TorchRuntime

        return TorchRuntime(engine, threads=threads)

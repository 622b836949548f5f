"""The `torch` backend as the registry sees it: can it run here, and open it (runtime.py does the work).

Registering imports no torch: `trtbuild run` on the CPU twin must not pay torch's import (tests/runner/
test_cold_start.py), so whether a CUDA GPU is present is asked of the driver library itself (cuInit and
cuDeviceGetCount through ctypes, a few milliseconds), and torch loads only when the backend opens.

Every engine dir qualifies: the backend runs rank0.safetensors (the checkpoint's canonical tensors, which
every build keeps) with the manifest's model config, not a graph; a tp engine dir (pp=1) runs one rank per
shard (rank{r}.safetensors) when asked for by name, driven through runner/parallel/ (torch_ranks.py). `auto`
picks it where a CUDA GPU is present and TensorRT cannot run the engine (preference between the two); on a CPU
it runs only when asked (`--backend torch`: float32, the CI path).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from pathlib import Path
from typing import ClassVar

from engine_builder.formats.checkpoint import weights_file
from engine_builder.formats.manifest import EngineManifest
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


@functools.cache
def cuda_total_memory() -> int | None:
    """Bytes of CUDA device 0 (None without a driver or a device), asked without importing torch."""
    if not cuda_devices():
        return None
    lib = ctypes.CDLL(ctypes.util.find_library("cuda") or "libcuda.so.1")
    device, total = ctypes.c_int(0), ctypes.c_size_t(0)
    if lib.cuDeviceGet(ctypes.byref(device), 0) != 0 or lib.cuDeviceTotalMem_v2(ctypes.byref(total), device) != 0:
        return None
    return total.value


def torch_verdict(manifest: EngineManifest, path: Path, asked: bool) -> tuple[bool, str]:
    """Can the torch backend run the engine dir at PATH here (asked: named by --backend torch, so a CPU will do)
    and why; from the manifest and the host alone (`trtbuild inspect` shows it)."""
    if manifest.model is None or manifest.model.encoder is not None:
        return False, "the torch backend runs decoders built from a checkpoint"
    mapping = manifest.mapping
    if mapping is not None and mapping.pp > 1:
        return False, (f"pp={mapping.pp}: the torch backend runs tensor parallel only (tp, pp=1); run this engine dir "
                       "with --backend onnxruntime")
    if mapping is not None and not asked:  # tp ranks run on the torch backend when named (runner/parallel/)
        return False, f"a tp={mapping.tp} engine dir runs on the torch backend's ranks when asked (--backend torch)"
    for rank in range(mapping.tp if mapping is not None else 1):
        if not (path / weights_file(rank)).is_file():
            return False, f"{path / weights_file(rank)} (the checkpoint's weights) is missing"
    if cuda_devices():
        return True, "PyTorch on the CUDA GPU (no TensorRT runtime can run this engine here)"
    if asked:
        return True, "PyTorch on the CPU, float32"
    return False, "no CUDA GPU here (`--backend torch` runs it on the CPU, in float32)"


@register_backend(preference=5)  # below TensorRT (10), above the onnxruntime twin (0)
class TorchBackend(Backend):
    name: ClassVar[str] = "torch"
    title: ClassVar[str] = "PyTorch"

    @classmethod
    def usable(cls, engine: EngineDir) -> tuple[bool, str]:
        return torch_verdict(engine.manifest, engine.path, asked=False)

    @classmethod
    def usable_when_asked(cls, engine: EngineDir) -> tuple[bool, str]:
        return torch_verdict(engine.manifest, engine.path, asked=True)

    @classmethod
    def open(cls, engine: EngineDir, *, threads: int | None = None) -> Backend:
        from engine_builder.runner.torch_backend.runtime import TorchRuntime

        return TorchRuntime(engine, threads=threads)

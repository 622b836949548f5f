"""Whether a built engine can run on this machine, decided without deserializing it.

Deserializing needs a CUDA driver (on our CPU-only build hosts TensorRT-RTX 1.7.1 fails with
"cudaError 35"), so the verdict works from the manifest, the engine header and the host's GPUs.
The runtime reads this module; the builder side's layer information is engine_layers.py.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine_builder.trt import compat as trt_compat
from engine_builder.util.errors import TrtbuildError

# --- the host ----------------------------------------------------------------------------------

def gpu_compute_capabilities() -> list[str]:
    """Compute capability ('sm86', ...) of each visible GPU via the CUDA driver; [] when none.

    ctypes on libcuda rather than torch.cuda: the CPU torch wheel says False even on a GPU box,
    and importing torch costs seconds.
    """
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            cuda = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        return []
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return []
    found = []
    for index in range(count.value):
        device, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        if cuda.cuDeviceGet(ctypes.byref(device), index) != 0:
            continue
        cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, device)  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
        cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, device)  # ..._MINOR
        found.append(f"sm{major.value}{minor.value}")
    return found


# --- the engine file ---------------------------------------------------------------------------

# Bit i of the header's target mask, as observed in TensorRT-RTX 1.7.1 engines (undocumented;
# the manifest stays authoritative, the header is a cross-check). Bit 6 is set by default builds.
_RTX_HEADER_CCS = ("sm75", "sm80", "sm86", "sm89", "sm120", "sm121", "later")


@dataclass(frozen=True)
class EngineHeader:
    version: str  # "1.7.1"
    targets: tuple[str, ...]


def read_rtx_header(engine: Path | bytes) -> EngineHeader | None:
    """Version and compute-capability targets from a TensorRT-RTX engine's first 64 bytes, or None."""
    if isinstance(engine, bytes):
        data = engine
    else:
        with Path(engine).open("rb") as f:
            data = f.read(64)
    if len(data) < 0x24 or data[:4] != b"vtrt" or data[0x1C:0x20] != b"vtrt":
        return None
    major, minor, patch = data[0x18], data[0x19], data[0x1A]
    (mask,) = struct.unpack_from("<I", data, 0x20)
    if major == 0 or mask == 0 or mask >> len(_RTX_HEADER_CCS):
        return None
    return EngineHeader(f"{major}.{minor}.{patch}",
                        tuple(cc for bit, cc in enumerate(_RTX_HEADER_CCS) if mask >> bit & 1))


# --- the verdict -------------------------------------------------------------------------------

@dataclass(frozen=True)
class EngineBuildInfo:
    """What the engine-dir manifest records about how rank0.engine was built."""
    flavour: str  # tensorrt | tensorrt_rtx
    trt_version: str  # e.g. 1.7.1.116
    targets: tuple[str, ...]  # ("sm80", "sm86"); () = the flavour's default set

    @classmethod
    def from_mapping(cls, info: Mapping[str, Any]) -> EngineBuildInfo:
        """Accepts a TrtBuildReport.to_json() dict or a manifest holding one under 'tensorrt'."""
        info = info.get("tensorrt", info)
        return cls(str(info["flavour"]), str(info["trt_version"]),
                   tuple(trt_compat.normalize_cc(t) for t in info.get("targets", ())))


def _release(version: str) -> tuple[str, ...]:
    return tuple(version.split(".")[:3])  # engines are tied to major.minor.patch, not the build number


def compatibility_verdict(info: EngineBuildInfo | Mapping[str, Any], *, engine_path: Path | None = None,
                          gpus: Sequence[str] | None = None, installed: str | None = None) -> tuple[bool, str]:
    """(ok, reason): can this engine run on this machine? Every problem found is named.

    gpus / installed override detection (GPU compute capabilities, installed TRT version) for tests.
    """
    if not isinstance(info, EngineBuildInfo):
        info = EngineBuildInfo.from_mapping(info)
    label = trt_compat.describe_name(info.flavour)
    problems: list[str] = []
    trt = None
    if installed is None:
        try:
            trt = trt_compat.load_trt(info.flavour)  # type: ignore[arg-type]
            installed = trt_compat.version_of(trt)
        except TrtbuildError:  # not installed is a verdict, not an error
            problems.append(f"built with {label} {info.trt_version}, which is not installed")
    if installed is not None and _release(installed) != _release(info.trt_version):
        problems.append(f"built with {label} {'.'.join(_release(info.trt_version))}, "
                        f"installed {'.'.join(_release(installed))}: rebuild the engine")

    if engine_path is not None and not Path(engine_path).is_file():
        problems.append(f"{engine_path} is missing: rebuild the engine")
        engine_path = None
    header = read_rtx_header(engine_path) if engine_path and info.flavour == "tensorrt_rtx" else None
    if header and _release(header.version) != _release(info.trt_version):
        problems.append(f"{engine_path} was written by {label} {header.version}, "
                        f"not {info.trt_version} as the manifest says")
    targets = info.targets or (tuple(c for c in header.targets if c != "later") if header else ())

    gpus = gpu_compute_capabilities() if gpus is None else [trt_compat.normalize_cc(g) for g in gpus]
    if not gpus:
        problems.append("cannot run here: no NVIDIA GPU (no CUDA driver found)")
    elif targets and not set(gpus) & set(targets):
        have = ", ".join(f"{trt_compat.cc_to_float(g):.1f}" for g in gpus)
        problems.append(f"compute capability {have} not among targets {','.join(targets)}")

    if not problems and trt is not None and engine_path is not None:
        problems += _runtime_validity(trt, engine_path)
    if problems:
        return False, "; ".join(problems)
    return True, f"ok: {label} {installed}, GPU {', '.join(gpus)} within targets {','.join(targets) or 'default'}"


def _runtime_validity(trt: Any, engine_path: Path) -> list[str]:
    """TensorRT-RTX's own header check (Runtime.get_engine_validity). Only called with a GPU
    present: without one, 1.7.1 answers (INVALID, no diagnostic bits) for every well-formed
    engine, even one whose header names another version -- it says nothing."""
    runtime = trt.Runtime(trt_compat.make_logger(trt))
    if not hasattr(runtime, "get_engine_validity"):
        return []
    size = int(getattr(runtime, "engine_header_size", 0)) or 64
    with Path(engine_path).open("rb") as f:
        validity, diagnostics = runtime.get_engine_validity(f.read(size))
    if validity == trt.EngineValidity.VALID:
        return []
    if validity == trt.EngineValidity.SUBOPTIMAL:
        return []  # runs, maybe slower: not a reason to refuse
    flags = [d for d in dir(trt.EngineInvalidityDiagnostics)
             if d.isupper() and int(diagnostics) & int(getattr(trt.EngineInvalidityDiagnostics, d))]
    return [f"{trt_compat.describe(trt)} reports the engine invalid here: {', '.join(flags) or 'no reason given'}"]

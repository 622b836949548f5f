"""One thin layer over the two TensorRT Python flavours: full `tensorrt` and `tensorrt_rtx`.

Their APIs mirror each other (Builder, OnnxParser, IBuilderConfig, Runtime); the helpers here
cover the places where they differ, so build code never branches on the flavour itself.

Verified against tensorrt_rtx 1.7.1 by introspection and real builds on a CPU-only host:
  - networks are always strongly typed (create_network(0) reports STRONGLY_TYPED); BuilderFlag
    has no FP16/INT8/BF16/FP8 members at all.
  - IBuilderConfig.set_compute_capability / num_compute_capabilities and ComputeCapability
    {SM75, SM80, SM86, SM89, SM120, SM121, CURRENT, NONE} exist; there is no SM90 member.
    CURRENT fails to build without a GPU ("cudaError 35: CUDA driver version is insufficient").
  - BuilderFlag has REFIT, REFIT_IDENTICAL, REFIT_INDIVIDUAL, STRIP_PLAN, WEIGHT_STREAMING.
  - IProgressMonitor, EngineInspector, LayerInformationFormat.JSON, Runtime.get_engine_validity
    and Runtime.engine_header_size exist; Runtime() can be created without a GPU.
  - trt.Logger prints to stdout, and Myelin prints "Internal Error: ..." straight to fd 2.
Assumed from NVIDIA's docs (full TensorRT cannot be installed here, DESIGN §4):
  - full TensorRT takes NetworkDefinitionCreationFlag.STRONGLY_TYPED explicitly and has no
    compute-capability targets (it builds for the GPU it runs on).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from types import ModuleType
from typing import Any, Literal

from engine_builder.util.errors import InputError, UnsupportedError

Flavour = Literal["auto", "tensorrt", "tensorrt_rtx"]
FLAVOURS: tuple[str, ...] = ("tensorrt", "tensorrt_rtx")
_LABELS = {"tensorrt": "TensorRT", "tensorrt_rtx": "TensorRT-RTX"}
INSTALL_HINT = (
    "install TensorRT-RTX for CPU-only ahead-of-time builds: `pip install tensorrt-rtx-cu13`; "
    "full TensorRT (Hopper/Blackwell data-center GPUs) comes only from NVIDIA's index: "
    "`pip install --extra-index-url https://pypi.nvidia.com tensorrt-cu13`"
)


def load_trt(flavour: Flavour = "auto") -> ModuleType:
    """Import TensorRT: `tensorrt` if it imports, else `tensorrt_rtx` (auto), or the one named."""
    if flavour not in ("auto", *FLAVOURS):
        raise InputError(f"unknown TensorRT flavour {flavour!r}; use one of auto, {', '.join(FLAVOURS)}")
    failures: list[str] = []
    for name in FLAVOURS if flavour == "auto" else (flavour,):
        try:
            return importlib.import_module(name)
        except (ImportError, OSError) as exc:  # OSError: wheel present but its shared libraries are not
            failures.append(f"{name}: {exc}")
    wanted = "TensorRT" if flavour == "auto" else _LABELS[flavour]
    raise UnsupportedError(f"{wanted} is not installed ({'; '.join(failures)}); {INSTALL_HINT}")


def flavour_of(trt: ModuleType) -> str:
    """'tensorrt' or 'tensorrt_rtx'."""
    return trt.__name__.split(".")[0]


def version_of(trt: ModuleType) -> str:
    return str(trt.__version__)


def describe_name(flavour: str) -> str:
    """'tensorrt_rtx' -> 'TensorRT-RTX'."""
    return _LABELS.get(flavour, flavour)


def describe(trt: ModuleType) -> str:
    """e.g. 'TensorRT-RTX 1.7.1.116', for messages and manifests."""
    return f"{describe_name(flavour_of(trt))} {version_of(trt)}"


def network_flags(trt: ModuleType) -> int:
    """Creation flags for a strongly typed network: precision comes from the graph's casts."""
    if flavour_of(trt) == "tensorrt_rtx":
        return 0  # always strongly typed; the flag is implied
    return 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)


# --- compute capability targets --------------------------------------------------------------

def normalize_cc(text: str) -> str:
    """'sm_86', 'SM86', '8.6', '86' -> 'sm86'; anything else is returned lower-cased for the error."""
    t = text.strip().lower().replace("_", "")
    if m := re.fullmatch(r"(\d+)\.(\d)", t):
        return f"sm{m[1]}{m[2]}"
    if t.isdigit():
        return f"sm{t}"
    return t


def valid_compute_capabilities(trt: ModuleType) -> tuple[str, ...]:
    """Targets this flavour can build for, read from its ComputeCapability enum (() if none)."""
    enum = getattr(trt, "ComputeCapability", None)
    if enum is None:
        return ()
    names = [n.lower() for n in dir(enum) if re.fullmatch(r"SM\d+", n)]
    return tuple(sorted(names, key=lambda n: int(n[2:])))


def cc_to_float(cc: str) -> float:
    """'sm86' -> 8.6, 'sm120' -> 12.0."""
    digits = cc[2:]
    return float(f"{digits[:-1]}.{digits[-1]}")


def set_compute_capabilities(trt: ModuleType, config: Any, targets: tuple[str, ...]) -> tuple[str, ...]:
    """Point `config` at explicit targets; returns them normalized. () keeps the flavour default."""
    normalized = tuple(dict.fromkeys(normalize_cc(t) for t in targets))
    if not normalized:
        return ()
    valid = valid_compute_capabilities(trt)
    if not valid:
        raise UnsupportedError(
            f"{describe(trt)} builds only for the GPU it runs on and cannot target "
            f"{', '.join(normalized)}; leave compute_capabilities empty, or build with TensorRT-RTX "
            "(`pip install tensorrt-rtx-cu13`) for explicit targets")
    unknown = [t for t in normalized if t not in valid]
    if unknown:
        raise InputError(
            f"{describe(trt)} cannot target compute capability {', '.join(unknown)}; valid targets: "
            f"{', '.join(valid)} (Hopper sm90 / Blackwell data-center sm100 need full TensorRT on that GPU)")
    config.num_compute_capabilities = len(normalized)
    for index, cc in enumerate(normalized):
        if not config.set_compute_capability(getattr(trt.ComputeCapability, cc.upper()), index):
            raise UnsupportedError(f"{describe(trt)} refused compute capability {cc}")
    return normalized


def default_targets(trt: ModuleType) -> tuple[str, ...]:
    """What an engine built without explicit targets runs on (RTX docs: Ampere and later)."""
    if flavour_of(trt) != "tensorrt_rtx":
        return ("current",)
    return tuple(cc for cc in valid_compute_capabilities(trt) if cc != "sm75")


# --- builder flags ---------------------------------------------------------------------------

def weight_flags(trt: ModuleType, *, refittable: bool, strip_weights: bool) -> list[Any]:
    """Builder flags for refittable / weight-stripped engines (same names in both flavours).

    strip_weights uses STRIP_PLAN + REFIT_IDENTICAL: the plan drops the weights the checkpoint
    already holds and may be refitted only with those same weights, which keeps every
    weight-dependent optimization; refittable alone (REFIT) allows different weights later.
    """
    flags = []
    if strip_weights:
        flags += [trt.BuilderFlag.STRIP_PLAN, trt.BuilderFlag.REFIT_IDENTICAL]
    if refittable:
        flags.append(trt.BuilderFlag.REFIT)
    return flags


# --- logging and progress --------------------------------------------------------------------

_LOGGERS: dict[str, Any] = {}


def make_logger(trt: ModuleType) -> Any:
    """The process-wide ILogger for this flavour; keeps (severity name, message) pairs.

    One per process because TensorRT registers the first logger it sees while any builder or
    runtime is alive and warns that later ones are ignored. Not for concurrent builds: each
    build calls .clear() and reads what arrived since.
    """
    name = flavour_of(trt)
    if name not in _LOGGERS:

        class CollectingLogger(trt.ILogger):  # type: ignore[misc, name-defined]
            def __init__(self) -> None:
                trt.ILogger.__init__(self)
                self.messages: list[tuple[str, str]] = []

            def log(self, severity: Any, msg: str) -> None:
                self.messages.append((severity.name, msg))

            def clear(self) -> None:
                self.messages = []

            def at(self, *severities: str) -> list[str]:
                return [m for s, m in self.messages if s in severities]

        _LOGGERS[name] = CollectingLogger()
    return _LOGGERS[name]


def make_progress_monitor(trt: ModuleType, on_event: Any) -> Any | None:
    """An IProgressMonitor forwarding (kind, phase, parent, step, total) to on_event, or None.

    on_event returning False cancels the build (TensorRT stops at the next step).
    """
    if not hasattr(trt, "IProgressMonitor"):
        return None

    class Monitor(trt.IProgressMonitor):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            on_event("start", phase_name, parent_phase, 0, num_steps)

        def step_complete(self, phase_name: str, step: int) -> bool:
            return on_event("step", phase_name, None, step + 1, -1) is not False

        def phase_finish(self, phase_name: str) -> None:
            on_event("finish", phase_name, None, -1, -1)

    return Monitor()


@contextlib.contextmanager
def captured_native_stderr() -> Iterator[list[str]]:
    """Collect what native code writes to fd 2 (Myelin's 'Internal Error: ...' lines).

    The CLI promises one line on stderr per user error; TensorRT's C++ side would add its own.
    The captured text is appended to the yielded list when the block ends.
    """
    sink: list[str] = []
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 (embedded interpreters): nothing to capture
        yield sink
        return
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield sink
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            sink.extend(line for line in tmp.read().decode(errors="replace").splitlines() if line.strip())

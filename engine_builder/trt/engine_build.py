"""ONNX file -> serialized TensorRT(-RTX) engine, with a report of what the builder made.

TensorRT-RTX builds on a machine without a GPU (DESIGN §4): nothing here deserializes or runs
the engine unless a CUDA driver is present.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Literal

from engine_builder.trt import compat as trt_compat
from engine_builder.trt.compatibility import gpu_compute_capabilities
from engine_builder.trt.engine_layers import (
    EngineLayer,
    count_layer_types,
    layers_from_builder_log,
    layers_from_inspector_json,
)
from engine_builder.util.errors import InputError, TrtbuildError, UnsupportedError
from engine_builder.util.memory import PeakRss

Shape = tuple[int, ...]
ProfileShapes = Mapping[str, tuple[Shape, Shape, Shape]]  # input name -> (min, opt, max)


@dataclass(frozen=True)
class TrtBuildOptions:
    compute_capabilities: tuple[str, ...] = ()  # ("sm80", "sm86"); () = the flavour's default set
    opt_level: int = 3  # builder_optimization_level 0..5
    # One profile per shape regime; the runtime picks by index. LLMs want two: decode (seq
    # pinned to 1, gets gemv attention kernels) and prefill (seq 2..max, gemm attention).
    profiles: tuple[ProfileShapes, ...] = ()
    refittable: bool = False  # REFIT: weights may be replaced after the build
    strip_weights: bool = False  # STRIP_PLAN + REFIT_IDENTICAL: plan without the checkpoint's weights
    # Lets attention without a dedicated kernel (fp32, odd head dims) build as plain ops (slower).
    decomposable_attention: bool = False
    flavour: trt_compat.Flavour = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "compute_capabilities", tuple(self.compute_capabilities))
        object.__setattr__(self, "profiles", tuple(self.profiles))
        if not 0 <= self.opt_level <= 5:
            raise InputError(f"opt_level must be 0..5 (TensorRT builder optimization level), got {self.opt_level}")


@dataclass(frozen=True)
class BuildProgress:
    kind: Literal["start", "step", "finish"]
    phase: str  # e.g. "Parsing ONNX", "Building engine", "Timing tactics"
    parent: str | None  # enclosing phase, None for top level (only on "start")
    step: int  # steps done so far in this phase
    total: int  # steps in this phase, -1 when TensorRT did not say


ProgressCallback = Callable[[BuildProgress], "bool | None"]  # return False to cancel the build


@dataclass(frozen=True)
class TrtBuildReport:
    engine_path: Path
    engine_bytes: int
    parse_seconds: float
    build_seconds: float
    peak_rss_bytes: int  # above the RSS at the start of build_engine
    flavour: str
    trt_version: str
    targets: tuple[str, ...]
    num_profiles: int
    network_layer_types: dict[str, int]  # what the parser made: ROTARY_EMBEDDING, KV_CACHE_UPDATE...
    engine_layer_types: dict[str, int]  # what the builder made: kgen, gemm, runtime_fusion...
    kernels: dict[str, int]  # engine kernel (tactic without its hash) -> count, e.g. _gemv_mha_v1
    engine_layers: tuple[EngineLayer, ...] = field(repr=False)
    layer_info_source: str  # "inspector" (GPU present), "builder_log", or "none"
    warnings: tuple[str, ...] = field(repr=False)
    unused_inputs: tuple[str, ...]  # graph inputs the engine ignores: usually a lowering bug

    def layers_for(self, onnx_node: str) -> list[EngineLayer]:
        """Engine layers that implement (part of) this ONNX node."""
        return [layer for layer in self.engine_layers if onnx_node in layer.onnx_nodes]

    def to_json(self) -> dict[str, Any]:
        """The manifest's 'tensorrt' block (trt/compatibility.py's EngineBuildInfo reads it back)."""
        return {
            "flavour": self.flavour, "trt_version": self.trt_version, "targets": list(self.targets),
            "engine_bytes": self.engine_bytes, "parse_seconds": round(self.parse_seconds, 3),
            "build_seconds": round(self.build_seconds, 3), "peak_rss_bytes": self.peak_rss_bytes,
            "num_profiles": self.num_profiles, "network_layer_types": self.network_layer_types,
            "engine_layer_types": self.engine_layer_types, "kernels": self.kernels,
            "layer_info_source": self.layer_info_source, "unused_inputs": list(self.unused_inputs),
        }


class EngineParseError(UnsupportedError):
    """The TensorRT ONNX parser rejected nodes; `issues` holds one dict per parser error."""

    def __init__(self, message: str, issues: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.issues = issues

    def __reduce__(self) -> tuple[Any, ...]:  # pickled from the build process
        return type(self), (str(self), self.issues), self.__dict__


class BuildCancelled(TrtbuildError):
    """The progress callback asked to stop."""


class EngineBuildError(UnsupportedError):
    """The builder failed after parsing; `log` holds TensorRT's error output."""

    def __init__(self, message: str, log: list[str]) -> None:
        super().__init__(message)
        self.log = log

    def __reduce__(self) -> tuple[Any, ...]:  # pickled from the build process
        return type(self), (str(self), self.log), self.__dict__


def build_engine(onnx_path: Path, out_path: Path, options: TrtBuildOptions = TrtBuildOptions(),
                 progress: ProgressCallback | None = None) -> TrtBuildReport:
    """Parse `onnx_path` (external data resolves beside it), build, write `out_path` atomically.

    The build runs in a child process: TensorRT holds the GIL for the whole build, so a signal
    would reach Python only at its next progress callback (tens of seconds apart). Here Ctrl-C or
    SIGTERM (as KeyboardInterrupt) stops the wait at once; the child is killed and leaves no file.
    PROGRESS still hears every event, and returning False from it cancels the build."""
    onnx_path, out_path = Path(onnx_path), Path(out_path)
    if not onnx_path.is_file():
        raise InputError(f"{onnx_path} does not exist; export the network first")
    parent_end, child_end = socket.socketpair()
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, json.dumps(sys.path), str(child_end.fileno())],
        pass_fds=(child_end.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    child_end.close()
    conn = Connection(parent_end.detach())
    try:
        conn.send((onnx_path, out_path, options))
        while True:
            try:
                kind, payload = conn.recv()
            except EOFError:
                raise EngineBuildError(f"the TensorRT build process ended without a result (exit code "
                                       f"{child.wait()}); rerun with --debug", []) from None
            if kind == "progress":
                conn.send(_notify(progress, payload))
            elif kind == "report":
                return payload
            else:
                error, child_traceback = payload
                error.add_note(f"in the TensorRT build process:\n{child_traceback}")
                raise error
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        conn.close()
        out_path.with_name(f".{out_path.name}.{child.pid}.tmp").unlink(missing_ok=True)


_PR_SET_PDEATHSIG = 1  # <sys/prctl.h>

# the child: ignores Ctrl-C (the parent decides), builds, sends progress events (waiting for the
# answer), then the report or the error
_CHILD = ("import json, sys; sys.path[:0] = json.loads(sys.argv[1]); "
          "from engine_builder.trt.engine_build import _child_main; _child_main(int(sys.argv[2]))")


def _child_main(fd: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform == "linux":  # the parent killed outright (SIGKILL, OOM killer): the build dies with it
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    conn = Connection(fd)
    onnx_path, out_path, options = conn.recv()

    def relay(event: BuildProgress) -> bool:
        conn.send(("progress", event))
        return bool(conn.recv())  # the parent gone: EOFError cancels the build

    try:
        conn.send(("report", _build_here(onnx_path, out_path, options, relay)))
    except BaseException as exc:  # noqa: BLE001 -- every failure goes to the parent, which raises it
        try:
            conn.send(("error", (exc, traceback.format_exc())))
        except Exception:  # noqa: BLE001 -- an exception that does not pickle, or the parent is gone
            with contextlib.suppress(OSError):
                conn.send(("error", (EngineBuildError(f"{type(exc).__name__}: {exc}", []), traceback.format_exc())))


def _build_here(onnx_path: Path, out_path: Path, options: TrtBuildOptions,
                progress: ProgressCallback | None) -> TrtBuildReport:
    trt = trt_compat.load_trt(options.flavour)
    peak = PeakRss()
    logger = trt_compat.make_logger(trt)
    logger.clear()
    builder = trt.Builder(logger)
    network = builder.create_network(trt_compat.network_flags(trt))
    parser = trt.OnnxParser(network, logger)

    _notify(progress, BuildProgress("start", "Parsing ONNX", None, 0, 1))
    started = time.perf_counter()
    with trt_compat.captured_native_stderr() as native:
        parsed = parser.parse_from_file(str(onnx_path))  # from the path: external data stays mmapped
    parse_seconds = time.perf_counter() - started
    if not parsed:
        raise _parse_failure(trt, parser, onnx_path, logger.at("ERROR", "INTERNAL_ERROR") + native)
    _notify(progress, BuildProgress("finish", "Parsing ONNX", None, 1, 1))

    config = builder.create_builder_config()
    targets = trt_compat.set_compute_capabilities(trt, config, options.compute_capabilities)
    config.builder_optimization_level = options.opt_level
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED  # the layer dump needs it
    for flag in trt_compat.weight_flags(trt, refittable=options.refittable, strip_weights=options.strip_weights):
        config.set_flag(flag)
    _add_profiles(builder, network, config, options.profiles)
    network_layers = _network_layer_types(trt, network, options.decomposable_attention)

    cancel: list[BaseException] = []
    monitor = trt_compat.make_progress_monitor(trt, _monitor_callback(progress, cancel))
    if monitor is not None:  # always installed: it is also how Ctrl-C reaches a running build
        config.progress_monitor = monitor
    started = time.perf_counter()
    with trt_compat.captured_native_stderr() as native:
        serialized = builder.build_serialized_network(network, config)
    build_seconds = time.perf_counter() - started
    if cancel:
        raise cancel[0]
    if serialized is None:
        raise _build_failure(trt, options, logger.at("ERROR", "INTERNAL_ERROR") + native)

    data = memoryview(serialized)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, out_path)
    finally:
        tmp.unlink(missing_ok=True)

    layers, source = _engine_layers(trt, logger, serialized)
    warnings = logger.at("WARNING")
    return TrtBuildReport(
        engine_path=out_path, engine_bytes=len(data), parse_seconds=parse_seconds,
        build_seconds=build_seconds, peak_rss_bytes=peak.above_baseline(), flavour=trt_compat.flavour_of(trt),
        trt_version=trt_compat.version_of(trt), targets=targets or trt_compat.default_targets(trt),
        num_profiles=len(options.profiles), network_layer_types=network_layers,
        engine_layer_types=count_layer_types(layers),
        kernels=dict(sorted(Counter(re.sub(r"_0x[0-9a-f]+", "", la.tactic) for la in layers if la.tactic).items())),
        engine_layers=tuple(layers), layer_info_source=source, warnings=tuple(warnings),
        unused_inputs=tuple(m.split(":", 1)[1].strip() for m in warnings if m.startswith("Unused Input:")),
    )


def _notify(progress: ProgressCallback | None, event: BuildProgress) -> bool:
    return progress is None or progress(event) is not False


def _monitor_callback(progress: ProgressCallback | None, cancel: list[BaseException]) -> Callable[..., bool]:
    def on_event(kind: str, phase: str, parent: str | None, step: int, total: int) -> bool:
        # An exception must not unwind through TensorRT's C++ frames: keep it, cancel the
        # build, and build_engine re-raises it (this is how KeyboardInterrupt gets out).
        if cancel:
            return False
        try:
            if _notify(progress, BuildProgress(kind, phase, parent, step, total)):  # type: ignore[arg-type]
                return True
            cancel.append(BuildCancelled("engine build cancelled; nothing was written"))
        except BaseException as exc:  # noqa: BLE001
            cancel.append(exc)
        return False
    return on_event


def _add_profiles(builder: Any, network: Any, config: Any, profiles: Sequence[ProfileShapes]) -> None:
    inputs = {network.get_input(i).name: tuple(network.get_input(i).shape) for i in range(network.num_inputs)}
    dynamic = [name for name, shape in inputs.items() if -1 in shape]
    if dynamic and not profiles:
        raise InputError(f"the graph has dynamic inputs ({', '.join(dynamic)}); "
                         "give at least one optimization profile (min/opt/max shape per input)")
    for index, shapes in enumerate(profiles):
        unknown = sorted(set(shapes) - set(inputs))
        if unknown:
            raise InputError(f"profile {index} names {', '.join(unknown)}, which the graph does not have; "
                             f"its inputs are {', '.join(inputs)}")
        missing = [name for name in dynamic if name not in shapes]
        if missing:
            raise InputError(f"profile {index} gives no shapes for dynamic input(s) {', '.join(missing)}")
        profile = builder.create_optimization_profile()
        for name, (lo, opt, hi) in shapes.items():
            want = inputs[name]
            for shape in (lo, opt, hi):
                if len(shape) != len(want) or any(w not in (-1, s) for w, s in zip(want, shape)):
                    raise InputError(f"profile {index}: shape {tuple(shape)} does not fit input {name} {want}")
            if not all(a <= b <= c for a, b, c in zip(lo, opt, hi)):
                raise InputError(f"profile {index}: input {name} needs min <= opt <= max, got {lo}, {opt}, {hi}")
            profile.set_shape(name, lo, opt, hi)
        if config.add_optimization_profile(profile) < 0:
            raise InputError(f"TensorRT rejected optimization profile {index}: {dict(shapes)}")


def _network_layer_types(trt: Any, network: Any, decomposable_attention: bool) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for index in range(network.num_layers):
        layer = network.get_layer(index)
        kind = layer.type.name
        counts[kind] += 1
        if decomposable_attention and kind == "ATTENTION_INPUT":
            layer.__class__ = trt.IAttentionInputLayer  # get_layer returns the base ILayer
            layer.attention.decomposable = True
    return dict(sorted(counts.items()))


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _parse_failure(trt: Any, parser: Any, onnx_path: Path, log: list[str]) -> UnsupportedError:
    issues = []
    for index in range(parser.num_errors):
        e = parser.get_error(index)
        issues.append({"node_index": e.node(), "node": e.node_name(), "op_type": e.node_operator(),
                       "code": e.code().name, "desc": e.desc(), "where": f"{e.file()}:{e.line()} {e.func()}"})
    if not issues:
        return EngineParseError(f"{trt_compat.describe(trt)} could not parse {onnx_path}: "
                                f"{_one_line(log[-1]) if log else 'no reason given'}", issues)
    parts = []
    for issue in issues:
        if issue["node_index"] < 0:  # graph-level: bad file, missing external data...
            parts.append(f"{issue['code']}: {issue['desc']}")
        else:
            parts.append(f"node {issue['node']!r} (op {issue['op_type']}, #{issue['node_index']}): "
                         f"{issue['code']} {issue['desc']} [{issue['where']}]")
    return EngineParseError(
        _one_line(f"{trt_compat.describe(trt)} cannot import {onnx_path}: {'; '.join(parts)}; "
                  "lower the graph for target tensorrt (or build for target onnxruntime)"), issues)


def _build_failure(trt: Any, options: TrtBuildOptions, log: list[str]) -> EngineBuildError:
    reason = next((m for m in reversed(log) if "Error Code" in m), log[-1] if log else "no reason given")
    reason = reason.split("MyelinCheckException: ")[-1].removesuffix(")")
    text = " ".join(log)
    if "Attention operation was not supported by a dedicated kernel" in text:
        hint = ("TensorRT's fused attention needs fp16/bf16 Q/K/V and head_dim 32..256: cast the "
                "attention inputs, or set decomposable_attention to build it from plain ops (slower)")
    elif (options.refittable or options.strip_weights) and ("sm_vers_" in text or "CUDA_SUCCESS" in text):
        hint = (f"{trt_compat.describe(trt)} builds refittable / weight-stripped engines only with a GPU "
                "present and for a single compute capability; build without refittable/strip_weights here")
    elif "cudaError" in text:
        hint = "this build step needs a GPU; name explicit compute capabilities (e.g. sm86) to build on a CPU"
    else:
        hint = "rerun with --debug for TensorRT's full log"
    return EngineBuildError(_one_line(f"{trt_compat.describe(trt)} failed to build the engine: {reason}; {hint}"), log)


def _engine_layers(trt: Any, logger: Any, data: Any) -> tuple[list[EngineLayer], str]:
    if gpu_compute_capabilities():  # deserializing needs a CUDA driver
        try:
            engine = trt.Runtime(logger).deserialize_cuda_engine(data)
            if engine is not None:
                inspector = engine.create_engine_inspector()
                layers = layers_from_inspector_json(
                    inspector.get_engine_information(trt.LayerInformationFormat.JSON))
                if layers:
                    return layers, "inspector"
        except Exception:  # noqa: BLE001 -- the builder log below still describes the engine
            pass
    layers = layers_from_builder_log(logger.at("VERBOSE", "INFO"))
    return layers, "builder_log" if layers else "none"

"""Which registered backend runs an engine dir on this machine, and why.

backend="auto" takes the most preferred backend whose `usable` says yes: TensorRT when the engine
dir has an engine that trt/compatibility.py says can run here, PyTorch on a CUDA GPU otherwise
(runner/torch_backend/), and onnxruntime on the ONNX twin on a CPU; the reasons are kept so
`trtbuild run --json` and LLM.backend_reason can say why.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine_builder.runner import ort_backend, ort_paged, trt_backend, trt_paged  # noqa: F401  (each registers its backend)
from engine_builder.runner.backend import Backend, registered_backends
from engine_builder.runner.engine import EngineDir
from engine_builder.runner.torch_backend import registered  # noqa: F401  (registers "torch"; imports no torch)
from engine_builder.util.errors import InputError, UnsupportedError

BACKENDS = ("auto", *sorted(cls.name for cls in registered_backends()))


@dataclass(frozen=True)
class BackendChoice:
    name: str  # onnxruntime | tensorrt | torch
    reason: str  # why this one: the TensorRT verdict, or the user's request


def choose_backend(engine: EngineDir, backend: str = "auto") -> BackendChoice:
    """Which backend `backend` means for this engine dir on this machine, and why."""
    if backend not in BACKENDS:
        raise InputError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
    if backend != "auto":
        cls = next(c for c in registered_backends() if c.name == backend)
        ok, verdict = cls.usable_when_asked(engine)
        if not ok:
            raise UnsupportedError(f"cannot use the {cls.title} engine in {engine.path}: {verdict}; run with "
                                   "--backend onnxruntime (or auto) to use the ONNX twin on CPU")
        return BackendChoice(backend, verdict or "requested")
    passed_over = []
    for cls in registered_backends():
        ok, verdict = cls.usable(engine)
        if ok:
            return BackendChoice(cls.name, "; ".join([*passed_over, verdict] if verdict else passed_over) or "usable")
        passed_over.append(f"{cls.title} not usable: {verdict}")
    raise UnsupportedError(f"no backend can run {engine.path} here: {'; '.join(passed_over)}")


def open_backend(engine: EngineDir, backend: str = "auto", *,
                 threads: int | None = None) -> tuple[Backend, BackendChoice]:
    """The chosen backend, opened. threads: onnxruntime intra-op threads (default: physical cores)."""
    if engine.model.encoder is not None:  # the backends step a decoder; encoders have runner/embedder.py
        raise InputError(f"{engine.path} is an encoder ({engine.model.architecture}) engine: it computes embeddings, "
                         "not text; use LLM.embed(texts), `trtbuild run --embed TEXT` or `trtbuild serve`")
    if engine.manifest.mapping is not None and backend == "torch":  # tp ranks of the torch decoder, rank 0 driving
        from engine_builder.runner.parallel.torch_ranks import TorchParallelBackend

        ranks = TorchParallelBackend.open(engine, threads=threads)
        return ranks, BackendChoice("torch", ranks.reason)
    if engine.manifest.mapping is not None:  # tp/pp: this is rank 0, driving the others (runner/parallel/)
        from engine_builder.runner.parallel.parallel_backend import ParallelBackend

        mapping = engine.manifest.mapping
        opened = ParallelBackend.open(engine, threads=threads)
        return opened, BackendChoice("onnxruntime", f"tp={mapping.tp} pp={mapping.pp}: each rank's segments on "
                                                    f"onnxruntime, collectives over {opened.comm.backend} between")
    choice = choose_backend(engine, backend)
    cls = next(c for c in registered_backends() if c.name == choice.name)
    return cls.open(engine, threads=threads), choice

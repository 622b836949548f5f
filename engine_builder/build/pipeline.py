"""`trtbuild build`: checkpoint -> engine dir with the TensorRT engine and its ONNX twin.

What the engine dir holds and its manifest: engine_builder/formats/manifest.py.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx_ir as ir

import passes  # noqa: F401  (registers every pass)
from engine_builder.build.encoder_profiles import encoder_profiles
from engine_builder.build.ort_prepack import prepacked_twin_wanted, write_prepacked_twin
from engine_builder.build.preflight import preflight
from engine_builder.build.target_check import check_target_ops
from engine_builder.build.vision_build import write_vision_graphs
from engine_builder.formats import graph_io as io
from engine_builder.formats.build_config import BuildConfig
from engine_builder.formats.checkpoint import CONFIG_FILE, WEIGHTS_FILE, CheckpointConfig
from engine_builder.formats.kv_update_graph import record_kv_update
from engine_builder.formats.manifest import (
    ENGINE_FILE,
    ENGINE_SCHEMA,
    ORT_MODEL,
    TRT_MODEL,
    BuildCost,
    CheckpointSummary,
    EngineManifest,
    OrtQuantization,
    Versions,
    file_digests,
)
from engine_builder.formats.vision_engine import VisionEngine
from engine_builder.network import NetworkOptions, build_decoder, save_graph
from engine_builder.network.encoder import build_encoder
from engine_builder.network.weights import link_weights
from engine_builder.util.atomic_dir import atomic_output_dir
from engine_builder.util.file_hash import sha256_file
from engine_builder.util.memory import PeakRss
from engine_builder.util.version import __version__
from passes.base import PassManager

_NOT_TOKENIZER = {CONFIG_FILE, WEIGHTS_FILE}

Stage = Callable[[str], None]


@dataclass(frozen=True)
class BuildResult:
    out: str
    targets: tuple[str, ...]
    dtype: str  # the TensorRT engine's
    passes: dict[str, list[dict[str, Any]]]
    graph_hashes: dict[str, str]
    engine_bytes: int
    seconds: float
    peak_rss_bytes: int
    tensorrt: dict[str, Any] | None
    fidelity: dict[str, Any] | None = None  # figures of the recipe's fidelity gate (engine_builder/eval/gate.py)
    twin_dtype: str | None = None  # the onnxruntime twin's (build/dtype_choice.py)
    vision_engine: VisionEngine | None = None  # a vision model built for tensorrt (build/vision_build.py)


def trt_profiles(config: BuildConfig, model_inputs: list[ir.Value]) -> tuple[dict, ...]:
    """Optimization profiles: decode (seq 1, gemv attention), verify (seq 2..logits_tail, optimized for a
    speculative step of the last token + logits_tail - 1 drafts; only when logits_tail > 1) and prefill
    (seq 2..max_input_len). The runtime takes the first whose range holds a step."""
    lim = config.limits
    longest = max(2, lim.max_input_len)
    verify_len = min(config.logits_tail, longest)
    seq_ranges = [((1, 1), (1, 1), (lim.max_batch, 1))]
    if verify_len > 1:
        seq_ranges.append(((1, 2), (1, verify_len), (lim.max_batch, verify_len)))
    seq_ranges.append(((1, 2), (1, min(longest, 128)), (lim.max_batch, longest)))
    profiles: list[dict[str, tuple]] = [{} for _ in seq_ranges]
    paged = paged_profile_shapes(config, model_inputs)  # --kv-layout paged: pool and block table
    for value in model_inputs:
        rest = tuple(int(d) for d in value.shape[1:]) if value.name.startswith(("past_key.", "past_value.")) else None
        for profile, seq_range in zip(profiles, seq_ranges):
            if value.name in paged:
                profile[value.name] = paged[value.name]
            elif rest is not None:  # [batch, kv_heads, max_seq, head_dim]
                profile[value.name] = ((1, *rest), (1, *rest), (lim.max_batch, *rest))
            elif value.name == io.PAST_LENGTHS:
                profile[value.name] = ((1,), (1,), (lim.max_batch,))
            elif value.name == io.IMAGE_EMBEDS:  # a vision model's [batch, seq, hidden]
                profile[value.name] = tuple((*shape, int(value.shape[2])) for shape in seq_range)
            else:  # input_ids, position_ids, a vision model's image_mask: [batch, seq]
                profile[value.name] = seq_range
    return tuple(profiles)


def paged_profile_shapes(config: BuildConfig, model_inputs: list[ir.Value]) -> dict[str, tuple]:
    """(min, opt, max) of a paged graph's pool inputs [kv_heads, num_blocks, B, head_dim] (up to
    PagedKVLayout.max_pool_blocks) and block_table [batch, max_blocks] (up to max_seq_len / B); empty for slots."""
    if config.kv_layout != "paged":
        return {}
    lim, size = config.limits, config.kv_block_size
    per_seq = -(-lim.max_seq_len // size)
    most = 4 * lim.max_batch * per_seq + 1  # formats/graph_io.py PagedKVLayout.max_pool_blocks
    shapes: dict[str, tuple] = {io.BLOCK_TABLE: ((1, 1), (1, min(per_seq, 8)), (lim.max_batch, per_seq))}
    for value in model_inputs:
        if value.name.startswith(("kv_pool_key.", "kv_pool_value.")):
            heads, rest = int(value.shape[0]), tuple(int(d) for d in value.shape[2:])  # kv_heads; [B, head_dim]
            shapes[value.name] = tuple((heads, n, *rest) for n in (1, lim.max_batch * per_seq + 1, most))
    return shapes


@dataclass(frozen=True)
class Lowered:
    """What each target's passes made: the written graphs and, for tensorrt, the engine."""

    targets: tuple[str, ...]
    passes: dict[str, list[dict[str, Any]]]
    graph_hashes: dict[str, str]
    tensorrt: dict[str, Any] | None
    vision_engine: VisionEngine | None = None


def check_pass_lists(config: BuildConfig) -> None:
    """Unknown pass names fail before any work."""
    for target in config.targets:
        PassManager(getattr(config.passes, target))


def lower_for_targets(out_dir: Path, config: BuildConfig, make_model: Callable[[str], ir.Model],
                      save: Callable[[ir.Model, Path], None], trt_options: Callable[[ir.Model], Any],
                      explain: bool = False, say: Stage = lambda _: None,
                      trt_progress: Callable | None = None) -> Lowered:
    """For each target (the onnxruntime twin always, first): a fresh graph, its passes, the op check,
    the graph written into OUT_DIR, and for tensorrt the engine built from that file."""
    targets = ("onnxruntime", *(t for t in config.targets if t != "onnxruntime"))
    reports: dict[str, list[dict[str, Any]]] = {}
    hashes: dict[str, str] = {}
    trt_report = None
    for target in targets:
        say(f"graph and passes for {target}")
        model = make_model(target)
        results = PassManager(getattr(config.passes, target)).run(model, explain=explain)
        reports[target] = [dataclasses.asdict(r) for r in results]
        check_target_ops(model, target)
        path = out_dir / (ORT_MODEL if target == "onnxruntime" else TRT_MODEL)
        save(model, path)
        if target == "onnxruntime":  # read by `run` from the session's metadata, not by parsing the graph again
            record_kv_update(path)
        hashes[target] = sha256_file(path)
        if target == "tensorrt":
            from engine_builder.trt.engine_build import build_engine

            say("TensorRT engine")
            options = trt_options(model)
            report = build_engine(path, out_dir / ENGINE_FILE, options, trt_progress)
            trt_report = {**report.to_json(), "profiles": [{k: [list(s) for s in v] for k, v in p.items()}
                                                           for p in options.profiles]}
    return Lowered(targets, reports, hashes, trt_report)


def build(ckpt: Path, out: Path, config: BuildConfig = BuildConfig(), force: bool = False,
          explain: bool = False, stage: Stage | None = None, trt_progress: Callable | None = None,
          gate: Callable[[Path, Stage], dict[str, Any]] | None = None) -> BuildResult:
    """Build engine dir OUT from checkpoint dir CKPT. `stage(text)` hears of each step. `gate(dir, stage)`
    checks the finished dir before it is renamed to OUT: it raises to discard it, or returns figures
    recorded in the manifest."""
    ckpt, out = Path(ckpt), Path(out)
    checked = preflight(ckpt, out, config, force)  # every refusal that needs no graph (build/preflight.py)
    checkpoint, config, choice = checked.checkpoint, checked.config, checked.dtypes
    encoder = checkpoint.model.encoder is not None  # BERT family: network/encoder.py, one dynamic profile
    emit = build_encoder if encoder else build_decoder
    twin = config.twin_dtype or config.dtype
    check_pass_lists(config)
    started, peak = time.perf_counter(), PeakRss()
    networks = {target: NetworkOptions(max_seq_len=config.limits.max_seq_len, logits_tail=config.logits_tail,
                                       dtype=twin if target == "onnxruntime" else config.dtype,
                                       kv_layout=config.kv_layout, kv_block_size=config.kv_block_size)
                for target in ("onnxruntime", "tensorrt")}
    with atomic_output_dir(out, force, (ckpt,), ENGINE_SCHEMA) as tmp:
        link_weights(ckpt, tmp, own_copy=True)  # the engine's own inode: later edits of CKPT cannot reach it
        lowered = lower_for_targets(
            tmp, config, make_model=lambda target: emit(ckpt, networks[target]),
            # weights stay external (rank0.safetensors at their offsets); pass-made ones go to <model>.data
            save=save_graph,
            trt_options=lambda model: _trt_options(config, list(model.graph.inputs), encoder),
            explain=explain, say=stage or (lambda _: None), trt_progress=trt_progress)
        if (vision := checkpoint.model.vision) is not None:  # the vision tower + projector, graphs of their own
            hashes, vision_engine = write_vision_graphs(
                ckpt, tmp, config, networks, vision, say=stage or (lambda _: None), trt_progress=trt_progress,
                trt_options=lambda profile: _trt_build_options(config, (profile,)))
            lowered = dataclasses.replace(lowered, graph_hashes={**lowered.graph_hashes, **hashes},
                                          vision_engine=vision_engine)
        for f in ckpt.iterdir():
            if f.is_file() and f.name not in _NOT_TOKENIZER:
                shutil.copyfile(f, tmp / f.name)
        # unquantized weights as the float32 twin holds them (a bfloat16 checkpoint's take twice its bytes)
        weight_bytes = (tmp / WEIGHTS_FILE).stat().st_size * (1 if checkpoint.dtype == "float32" else 2)
        if prepacked_twin_wanted(twin, checkpoint.quantization.scheme, weight_bytes):
            (stage or (lambda _: None))("prepacked onnxruntime twin")
            # run loads it without packing the weights (build/ort_prepack.py)
            write_prepacked_twin(tmp, twin, weight_bytes)
        result = build_result(out, config, lowered, started, peak)
        manifest = manifest_of(config, result, tmp, model=checkpoint.model,
                               quantization=_quantization(checkpoint, tmp / ORT_MODEL),
                               checkpoint=CheckpointSummary(checkpoint.dtype, checkpoint.quantization,
                                                            checkpoint.source),
                               dtype_choice=choice.reason)
        manifest.save(tmp)
        if gate is not None:  # runs on the complete engine dir (manifest included), before OUT exists
            result = dataclasses.replace(result, fidelity=gate(tmp, stage or (lambda _: None)))
            dataclasses.replace(manifest, fidelity=result.fidelity).save(tmp)
    return result


def build_result(out: Path, config: BuildConfig, lowered: Lowered, started: float, peak: PeakRss) -> BuildResult:
    trt = lowered.tensorrt
    return BuildResult(
        out=str(out), targets=lowered.targets, dtype=config.dtype, passes=lowered.passes,
        graph_hashes=lowered.graph_hashes, engine_bytes=trt["engine_bytes"] if trt else 0,
        seconds=round(time.perf_counter() - started, 3), peak_rss_bytes=peak.above_baseline(), tensorrt=trt,
        twin_dtype=config.twin_dtype or config.dtype, vision_engine=lowered.vision_engine)


def _trt_options(config: BuildConfig, inputs: list[ir.Value], encoder: bool = False) -> Any:
    return _trt_build_options(config, encoder_profiles(config, inputs) if encoder else trt_profiles(config, inputs))


def _trt_build_options(config: BuildConfig, profiles: tuple[dict, ...]) -> Any:
    """The build's TensorRT options with PROFILES: the decoder's, or the vision graph's one (build/vision_build.py)."""
    from engine_builder.trt.engine_build import TrtBuildOptions

    return TrtBuildOptions(
        compute_capabilities=config.compute_capabilities, opt_level=config.opt_level,
        profiles=profiles, flavour=config.trt_flavour,  # type: ignore[arg-type]
        refittable=config.weights == "refittable", strip_weights=config.weights == "stripped",
        # TensorRT-RTX has no fp32 attention kernel: let it build fp32 attention from plain ops
        decomposable_attention=config.dtype == "float32")


def _quantization(checkpoint: CheckpointConfig, ort_model: Path) -> OrtQuantization:
    """The scheme, and how the onnxruntime twin computes its quantized linears (None when not lowered)."""
    import onnx

    meta = {p.key: p.value for p in onnx.load(str(ort_model), load_external_data=False).metadata_props}
    # one level per graph (it follows the activation dtype), but for a gguf body at 0 beside its int8 lm_head
    # (--lm-head int8) at 4: the highest, as some linears quantize their activations
    level = meta.get(io.META_ORT_ACCURACY_LEVEL)
    return OrtQuantization(checkpoint.quantization.scheme, checkpoint.quantization.kv_cache,
                           max(map(int, level.split(","))) if level else None)


def manifest_of(config: BuildConfig, result: BuildResult, engine_dir: Path, **blocks: Any) -> EngineManifest:
    """The manifest every build writes into ENGINE_DIR, once every file the engine reads is in place (their
    sha256 and size are recorded: runner/engine_integrity.py checks them at load); BLOCKS adds what only
    some have (model, checkpoint, source_onnx...)."""
    import onnxruntime

    trt = result.tensorrt
    versions = Versions(trtbuild=__version__, onnxruntime=onnxruntime.__version__,
                        tensorrt={k: trt[k] for k in ("flavour", "trt_version")} if trt else None)
    return EngineManifest(versions=versions, build=config, targets=result.targets, passes=result.passes,
                          graph_hashes=result.graph_hashes, tensorrt=trt, files=file_digests(engine_dir),
                          cost=BuildCost(result.seconds, result.peak_rss_bytes), vision_engine=result.vision_engine,
                          **blocks)

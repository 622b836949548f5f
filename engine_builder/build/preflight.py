"""Everything `trtbuild build` can refuse before any work, decided in well under 3 s.

The checkpoint's config.json, the build config, this machine's memory and the TensorRT flavour's
targets are enough to refuse a dtype, quantization, target or limit that cannot work. Nothing here
imports the graph code, the passes or TensorRT itself (seconds each), so a refusal comes before them
and says what to change. `pipeline.build` runs the same checks (it may be called as a library).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from engine_builder.build.dtype_choice import DtypeChoice, choose_dtypes, resolved
from engine_builder.build.moe_check import check_moe_build
from engine_builder.build.target_check import check_quantized_build
from engine_builder.formats.build_config import BuildConfig
from engine_builder.formats.checkpoint import CheckpointConfig
from engine_builder.formats.manifest import ENGINE_SCHEMA
from engine_builder.formats.memory_plan import check_engine_memory
from engine_builder.util.atomic_dir import check_output_dir
from engine_builder.util.errors import InputError

# TensorRT-RTX 1.7's ComputeCapability members (trt/compat.py, verified by introspection); no sm90 / sm100
RTX_TARGETS = ("sm75", "sm80", "sm86", "sm89", "sm120", "sm121")


@dataclass(frozen=True)
class Preflight:
    checkpoint: CheckpointConfig
    config: BuildConfig  # with both dtypes resolved (dtype_choice.py)
    dtypes: DtypeChoice


def trt_flavour(config: BuildConfig) -> str:
    """The flavour `auto` will load (trt/compat.py's rule), found without importing it."""
    if config.trt_flavour != "auto":
        return config.trt_flavour
    return "tensorrt" if importlib.util.find_spec("tensorrt") is not None else "tensorrt_rtx"


def check_compute_capabilities(config: BuildConfig) -> None:
    """A --cc TensorRT-RTX cannot target fails now, not after the onnxruntime twin is built."""
    if "tensorrt" not in config.targets or trt_flavour(config) != "tensorrt_rtx":
        return  # full TensorRT builds for the GPU it runs on; compat.py says so at build time
    from engine_builder.trt.compat import normalize_cc

    wanted = [normalize_cc(cc) for cc in config.compute_capabilities]
    unknown = [cc for cc in wanted if cc not in RTX_TARGETS]
    if unknown:
        fits = [cc for cc in wanted if cc in RTX_TARGETS] or ["sm80", "sm86", "sm89", "sm120"]
        raise InputError(f"TensorRT-RTX cannot target {', '.join(unknown)} (it builds for {', '.join(RTX_TARGETS)}; "
                         f"Hopper sm90 and data-center Blackwell need full TensorRT on that GPU); build with "
                         f"--cc {','.join(fits)}, or --target onnxruntime for the CPU twin only")


def preflight(ckpt: Path, out: Path | None, config: BuildConfig, force: bool = False) -> Preflight:
    """The checks of a build of checkpoint CKPT into OUT (None: not checked) with CONFIG, in the order a user
    fixes them: the config itself, the checkpoint, dtypes and quantization per target, memory, OUT."""
    config.validate()
    ckpt = Path(ckpt)
    checkpoint = CheckpointConfig.load(ckpt)
    if checkpoint.model.encoder is not None:  # BERT family: limits cut to what the model takes
        from engine_builder.build.encoder_profiles import fit_encoder_limits

        config = fit_encoder_limits(config, checkpoint.model)
    quant = checkpoint.quantization
    choice = choose_dtypes(config, checkpoint.dtype, quant)
    config = resolved(config, choice)
    twin = config.twin_dtype or config.dtype
    # the twin is always built: its dtype is the one KV-cache and fp8 rules are about
    check_quantized_build(quant, config.targets, twin, config.compute_capabilities)
    check_compute_capabilities(config)
    check_moe_build(checkpoint.model, quant, config.targets)
    for dtype in dict.fromkeys((config.dtype, twin)):
        check_engine_memory(checkpoint.model, config.limits, dtype, quant.kv_cache, quant.weight_bits,
                            what=f"an engine of {ckpt} with these limits")
    if out is not None:
        check_output_dir(out, force, (ckpt,), ENGINE_SCHEMA)
    return Preflight(checkpoint, config, choice)

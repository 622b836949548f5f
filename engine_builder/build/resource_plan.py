"""`trtbuild plan`: what converting and building a source will take and give, before any of it runs.

From the source's config and tensor table (no tensor data read) and the options convert and build
would get: the checkpoint's exact size (the layout each quantized linear is stored in), the peak
memory of convert and build, the engine dir's size, the KV cache per token and for the limits
(formats/memory_plan.py, which the build and the runtime refuse over), and which targets and
compute capabilities can run the result.

The peaks are models of what the code holds at its worst moment, fitted to measurements on
SmolLM2-135M (tests/engine_builder/test_resource_plan.py checks them within 20 %):
  convert   the source's own parse (a GGUF's metadata tables), plus the largest tensor dequantized
            and cast (float32, then the target dtype), plus quantizing's float32 working copy and its
            codes, plus calibration's float32 model run on one window (memory_plan.plan_engine).
  build     the graph of each target held by onnx_ir with its weights as external references (about
            0.85 MB per decoder layer: SmolLM2's 30 layers measured 25 MB for the twin, 33 MB with the
            TensorRT graph too), plus, quantized, the bytes lowering re-lays out one linear at a time.
            TensorRT builds in a child process, about 1.5x the engine's bytes, reported apart; so does
            onnxruntime saving a float32 twin's prepacked graph (build/ort_prepack.py), about 2x the float
            weights, which the engine dir then holds too (the weights and their packed copies).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine_builder.build.dtype_choice import DtypeChoice, choose_dtypes
from engine_builder.build.ort_prepack import prepacked_twin_wanted
from engine_builder.build.preflight import RTX_TARGETS, trt_flavour
from engine_builder.build.target_check import FP8_CAPABLE
from engine_builder.formats.build_config import BuildConfig
from engine_builder.formats.device_plan import plan_device
from engine_builder.formats.graph_io import KVCacheLayout
from engine_builder.formats.memory_plan import GB, machine_memory, plan_engine
from engine_builder.formats.model_config import ModelConfig
from engine_builder.formats.quantization import Quantization

ITEM = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1, "uint8": 1, "float8_e4m3fn": 1}
MB = 1e6
# fitted on SmolLM2-135M (the module docstring says what each term stands for)
GGUF_PARSE_BYTES_PER_VOCAB = 8_700  # gguf's reader (ours and transformers'): numpy views per token and merge
CONVERT_TENSOR_COPIES = 2.0  # the largest tensor as float32 and as the target dtype, side by side
QUANTIZE_TENSOR_COPIES = 2.0  # float32 working copy + temporaries of the tensor being quantized
BUILD_BYTES_PER_LAYER = 0.85 * MB  # onnx_ir graph + passes + protobuf of one decoder layer (weights external)
BUILD_TENSORRT_GRAPH = 0.3  # the second target's graph, built after the twin's is written
QUANTIZED_TENSOR_COPIES = 2.0  # MatMulNBits' re-laid-out bytes of one linear at a time (read lazily)
TRT_CHILD_ENGINE_FACTOR = 1.5


@dataclass(frozen=True)
class TargetVerdict:
    target: str
    ok: bool
    runs_on: str  # compute capabilities, or the CPU
    why: str = ""


@dataclass(frozen=True)
class ResourcePlan:
    source: str
    model: dict[str, Any]
    quantization: dict[str, Any]
    dtypes: dict[str, str]  # engine / twin / why
    checkpoint_bytes: int
    convert_peak_bytes: int
    build_peak_bytes: int  # this process (graph, passes, twin)
    trt_builder_peak_bytes: int  # TensorRT's build child process
    twin_prepack_peak_bytes: int  # onnxruntime's child saving the prepacked twin (0: none is made)
    engine_bytes: int  # rank0.engine (TensorRT)
    engine_dir_bytes: int  # the engine dir: its own weights copy, the engine, the twin's extra bytes
    kv_bytes_per_token: dict[str, int]  # per target
    kv_cache_bytes: dict[str, int]  # per target, for max_batch x max_seq_len
    runtime_bytes: dict[str, int]  # weights + KV cache + activations while it runs, per target
    limits: dict[str, int]
    targets: tuple[TargetVerdict, ...]
    machine_bytes: int
    machine_source: str
    notes: tuple[str, ...] = field(default_factory=tuple)
    # the torch backend on one GPU (formats/device_plan.py): its figures, where the GPU's size came from, a line
    torch_gpu: dict[str, Any] | None = None

    @property
    def fits_here(self) -> bool:
        need = max(self.convert_peak_bytes, self.build_peak_bytes + self.trt_builder_peak_bytes,
                   self.build_peak_bytes + self.twin_prepack_peak_bytes,
                   *self.runtime_bytes.values())
        return need <= self.machine_bytes


def _float_bytes(shape: tuple[int, ...], dtype: str) -> int:
    return math.prod(shape) * ITEM[dtype]


def checkpoint_layout(model: ModelConfig, tensors: dict[str, tuple[int, ...]], dtype: str,
                      quant: Any) -> tuple[int, Quantization]:
    """(bytes of rank0.safetensors' tensors, the quantization block) convert would write for TENSORS
    (canonical name -> shape) in DTYPE under QuantOptions QUANT."""
    from converters.quantize.quant_options import select_linears
    from converters.quantize.scheme import get_scheme

    if quant.scheme in ("none", "gguf"):
        return sum(_float_bytes(s, dtype) for s in tensors.values()), Quantization(kv_cache=quant.kv_cache)
    scheme, int8 = get_scheme(quant.scheme), get_scheme("int8_wo")
    quantized, excluded = select_linears(model, quant)
    lm_int8 = quant.lm_head_mode == "int8" and "lm_head" in quantized
    total = 0
    for name, shape in tensors.items():
        prefix = name.removesuffix(".weight")
        if prefix not in quantized:
            total += _float_bytes(shape, dtype)
    if model.tie_word_embeddings and "lm_head" in quantized:
        tensors = {**tensors, "lm_head.weight": tensors["embed.weight"]}
    for prefix in quantized:
        out, inp = tensors[f"{prefix}.weight"]
        use, groups = (int8, None) if (lm_int8 and prefix == "lm_head") else (scheme, quant.groups)
        total += sum(math.prod(s) * ITEM.get(t, 1) for _, t, s in use.layout(prefix, out, inp, dtype, groups))
    block = Quantization(scheme=quant.scheme, weight_bits=scheme.weight_bits, group_size=quant.groups,
                         activation=scheme.activation, kv_cache=quant.kv_cache, quantized=quantized,
                         excluded=excluded, lm_head="int8" if lm_int8 else "same")
    return total, block


def target_verdicts(config: BuildConfig, q: Quantization, choice: DtypeChoice) -> tuple[TargetVerdict, ...]:
    """Which targets and compute capabilities can run the engine (build/target_check.py's rules)."""
    fp8 = q.scheme == "fp8" or q.activation == "fp8"
    if q.kv_cache != "none":
        trt = TargetVerdict("tensorrt", False, "-", f"an {q.kv_cache} KV cache: TensorRT-RTX updates only float caches")
    elif q.zero_point:
        trt = TargetVerdict("tensorrt", False, "-", "int4 zero points: TensorRT refuses them")
    elif trt_flavour(config) == "tensorrt":
        trt = TargetVerdict("tensorrt", True, "the GPU it is built on (full TensorRT)")
    else:
        ccs = [cc for cc in RTX_TARGETS if cc in FP8_CAPABLE] if fp8 else list(RTX_TARGETS)
        trt = TargetVerdict("tensorrt", True, ",".join(ccs) + f" ({choice.engine}; TensorRT-RTX: no sm90 / sm100)",
                            "fp8 needs FP8 tensor cores" if fp8 else "")
    ort = TargetVerdict("onnxruntime", True, f"CPU ({choice.twin}, the onnxruntime twin every engine dir carries)")
    return trt, ort


def peaks(model: ModelConfig, tensors: dict[str, tuple[int, ...]], source_kind: str, source_dtype: str,
          dtype: str, q: Quantization, calib_seq_len: int, targets: tuple[str, ...]) -> tuple[int, int]:
    """(convert peak, build peak) above each command's start, in bytes."""
    largest = max(math.prod(s) for s in tensors.values())
    convert = 0.0
    if source_kind == "gguf":
        convert += GGUF_PARSE_BYTES_PER_VOCAB * model.vocab_size + CONVERT_TENSOR_COPIES * largest * 4
    elif source_dtype != dtype:  # cast in 4 MB chunks; a same-dtype copy runs in the kernel
        convert += 2 * (4 << 20)
    if q.scheme not in ("none", "gguf"):
        convert += QUANTIZE_TENSOR_COPIES * largest * 4
    if q.calibration is not None or q.activation != "none" or q.kv_cache != "none" or q.scheme == "int4_awq":
        from engine_builder.formats.build_config import Limits

        convert += plan_engine(model, Limits(1, calib_seq_len, calib_seq_len), "float32").total
    build = BUILD_BYTES_PER_LAYER * model.num_layers * (1 + BUILD_TENSORRT_GRAPH * ("tensorrt" in targets))
    if q.quantized:
        linear = max(math.prod(tensors.get(f"{p}.weight", tensors["embed.weight"])) for p in q.quantized)
        build += QUANTIZED_TENSOR_COPIES * linear * (q.weight_bits or 8) / 8
    return int(convert), int(build)


def plan_resources(src: Path, config: BuildConfig = BuildConfig(), quant: str = "none",
                   group_size: int | None = None, lm_head: str | None = None, kv_cache: str = "none",
                   dtype: str = "auto", exclude: tuple[str, ...] = (),
                   gpu: tuple[int, float, int, str] | None = None) -> ResourcePlan:
    """The plan of `trtbuild convert SRC --quant ...` then `trtbuild build` with CONFIG; SRC may also be a
    checkpoint dir (then the convert figures are of what it already is). gpu: (bytes, utilization, reserve, where
    the size came from) of the GPU the torch backend's plan is made for."""
    from converters.quantize.quant_options import QuantOptions
    from engine_builder.formats.checkpoint import CheckpointConfig, expected_shapes

    src = Path(src)
    options = QuantOptions(quant, group_size, kv_cache, None, None, None, tuple(exclude), lm_head)
    options.validate()
    notes: list[str] = []
    if (src / "config.json").is_file() and _is_checkpoint(src):
        ckpt = CheckpointConfig.load(src)
        model, ckpt_dtype, kind, source_dtype = ckpt.model, ckpt.dtype, "checkpoint", ckpt.dtype
        tensors = {k: v[0] for k, v in expected_shapes(model).items()}
        q = ckpt.quantization
        from converters.sources.source import safetensors_header

        weights = src / "rank0.safetensors"
        ckpt_bytes = weights.stat().st_size - 8 - safetensors_header(weights)[0]  # the tensors, as convert counts
        if quant != "none":
            notes.append(f"{src} is already a checkpoint ({q.scheme}): --quant applies to `trtbuild convert`")
    else:
        from converters.convert import plan as conversion_plan

        cp = conversion_plan(src, "float32" if quant != "none" and dtype == "auto" else dtype, quant, tuple(exclude),
                             lm_head)
        model, ckpt_dtype, kind = cp.model, cp.dtype, cp.source.kind
        source_dtype = cp.infos[cp.plan.tensors[0].sources[0]].dtype
        tensors = {t.name: t.shape for t in cp.plan.tensors}
        ckpt_bytes, q = checkpoint_layout(model, tensors, ckpt_dtype, options)
        if quant == "gguf":
            q = cp.quantization
            notes.append("--quant gguf keeps the file's blocks: the checkpoint size counts them as float")
    choice = choose_dtypes(config, ckpt_dtype, q)
    calib = 256
    convert_peak, build_peak = peaks(model, tensors, kind, source_dtype, ckpt_dtype, q, calib, config.targets)
    if kind == "checkpoint":
        convert_peak = 0
    limits = config.limits
    kv_per_token, kv_bytes, runtime = {}, {}, {}
    for target, dt in (("tensorrt", choice.engine), ("onnxruntime", choice.twin)):
        layout = KVCacheLayout.of(model, limits.max_seq_len, dt, q.kv_cache)
        kv_per_token[target] = layout.bytes_per_token
        kv_bytes[target] = layout.bytes_per_token * limits.max_batch * limits.max_seq_len
        runtime[target] = plan_engine(model, limits, dt, q.kv_cache, q.weight_bits).total
    engine = int(plan_engine(model, limits, choice.engine, "none", q.weight_bits).weights * 1.05)
    targets = target_verdicts(config, q, choice)
    trt_ok = "tensorrt" in config.targets and targets[0].ok
    twin_extra = 0 if q.scheme in ("none", "fp8") else ckpt_bytes - sum(
        _float_bytes(s, ckpt_dtype) for n, s in tensors.items() if n.removesuffix(".weight") not in q.quantized)
    float32_bytes = sum(_float_bytes(s, "float32") for s in tensors.values())
    prepacked = 2 * float32_bytes if prepacked_twin_wanted(choice.twin, q.scheme, float32_bytes) else 0
    budget, where = machine_memory()
    torch_gpu = None
    if gpu is not None:
        device = plan_device(model, limits, choice.engine, gpu[0], utilization=gpu[1], reserve=gpu[2],
                             block_size=config.kv_block_size)
        torch_gpu = device.shown(gpu[3])
    return ResourcePlan(
        source=str(src), model={"architecture": model.architecture, "layers": model.num_layers,
                                "hidden": model.hidden_size, "vocab": model.vocab_size, "source": kind},
        quantization={"scheme": q.scheme, "group_size": q.group_size, "kv_cache": q.kv_cache,
                      "lm_head": ("float" if "lm_head" not in q.quantized else
                                  "as the body" if q.lm_head != "int8" else "int8 per output channel"
                                  if q.lm_head_group_size is None else f"int8 per {q.lm_head_group_size} inputs"),
                      "checkpoint_dtype": ckpt_dtype},
        dtypes={"engine": choice.engine, "twin": choice.twin, "why": choice.reason},
        checkpoint_bytes=ckpt_bytes, convert_peak_bytes=convert_peak, build_peak_bytes=build_peak,
        trt_builder_peak_bytes=int(TRT_CHILD_ENGINE_FACTOR * engine) if trt_ok else 0,
        twin_prepack_peak_bytes=prepacked,
        engine_bytes=engine if trt_ok else 0,
        engine_dir_bytes=ckpt_bytes + (engine if trt_ok else 0) + max(0, twin_extra) + prepacked,
        kv_bytes_per_token=kv_per_token, kv_cache_bytes=kv_bytes, runtime_bytes=runtime,
        limits={"max_batch": limits.max_batch, "max_input_len": limits.max_input_len,
                "max_seq_len": limits.max_seq_len},
        targets=targets, machine_bytes=budget, machine_source=where, notes=tuple(notes), torch_gpu=torch_gpu)


def _is_checkpoint(path: Path) -> bool:
    import json

    try:
        return json.loads((path / "config.json").read_text()).get("schema") == "trtbuild.checkpoint"
    except (OSError, ValueError, AttributeError):
        return False


def describe(plan: ResourcePlan) -> list[str]:
    """The plan as lines a person reads."""
    q, m = plan.quantization, plan.model
    group = f" g{q['group_size']}" if q["group_size"] else ""
    trt_child = (f" (+ TensorRT builder process ~{plan.trt_builder_peak_bytes / MB:.0f} MB)"
                 if plan.trt_builder_peak_bytes else "")
    if plan.twin_prepack_peak_bytes:
        trt_child += f" (+ onnxruntime prepacking process ~{plan.twin_prepack_peak_bytes / MB:.0f} MB)"
    engine = f" (TensorRT engine ~{plan.engine_bytes / MB:.1f} MB)" if plan.engine_bytes else ""
    lines = [f"{plan.source}: {m['architecture']}, {m['layers']} layers, hidden {m['hidden']}, vocab {m['vocab']} "
             f"({m['source']})",
             f"checkpoint: {plan.checkpoint_bytes / MB:.1f} MB ({q['checkpoint_dtype']}, --quant {q['scheme']}{group}, "
             f"lm_head {q['lm_head']}); convert peak RAM ~{plan.convert_peak_bytes / MB:.0f} MB",
             f"dtypes: {plan.dtypes['why']}",
             f"build peak RAM ~{plan.build_peak_bytes / MB:.0f} MB{trt_child}",
             f"engine dir: {plan.engine_dir_bytes / MB:.1f} MB{engine}"]
    lim = plan.limits
    for target in ("tensorrt", "onnxruntime"):
        lines.append(f"KV cache ({target}): {plan.kv_bytes_per_token[target]} bytes/token, "
                     f"{plan.kv_cache_bytes[target] / MB:.1f} MB for max_batch {lim['max_batch']} x max_seq_len "
                     f"{lim['max_seq_len']}; running needs ~{plan.runtime_bytes[target] / MB:.0f} MB")
    for t in plan.targets:
        lines.append(f"{t.target}: {'yes' if t.ok else 'no'}, {t.runs_on}" + (f" ({t.why})" if t.why else ""))
    if plan.torch_gpu is not None:
        lines.append(f"torch backend {plan.torch_gpu['line']} ({plan.torch_gpu['source']})")
    lines.append(f"this machine: {plan.machine_bytes / GB:.1f} GB ({plan.machine_source}): "
                 + ("fits" if plan.fits_here else "DOES NOT FIT: lower the limits or use a larger machine"))
    return [*lines, *plan.notes]

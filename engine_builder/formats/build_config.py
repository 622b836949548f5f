"""What `trtbuild build` builds: limits, dtype, targets, passes. Loaded from flags, recipes, --set.

Precedence: defaults < recipe file < command-line flags < --set key=value.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from engine_builder.formats.dataclass_io import from_dict
from engine_builder.formats.runtime_config import RuntimeConfig
from engine_builder.util.errors import ConfigError

TARGETS = ("tensorrt", "onnxruntime")
DTYPES = ("float16", "bfloat16", "float32")
# "auto": the TensorRT engine in float16 (bfloat16 for a bfloat16 checkpoint) and the onnxruntime twin in
# the fastest faithful dtype of the CPU it is built on (build/dtype_choice.py); the manifest records both

# The default pipelines, in order.
FUSIONS = ("fold_constants", "remove_redundant_ops", "fuse_qkv", "fuse_gate_up", "fuse_rms_norm", "fuse_rotary",
           "fuse_kv_cache_update", "fuse_attention")
DEFAULT_PASSES: dict[str, tuple[str, ...]] = {
    # TensorRT-RTX takes Attention-24 with an explicit mask (it ignores nonpad_kv_seqlen and aligns
    # is_causal top-left), TensorScatter-24 and RotaryEmbedding-23, but no Attention softcap
    "tensorrt": (*FUSIONS, "eliminate_dead_code"),
    # onnxruntime: GroupQueryAttention updating a shared past/present buffer in place; quantized
    # linears as MatMulNBits (the tensorrt graph keeps DequantizeLinear -> MatMul, which TRT fuses); float32
    # weights read untransposed by FusedMatMul (no transposed copy at session creation: cold start, issue 16)
    "onnxruntime": (*FUSIONS, "fuse_attention_softcap", "lower_ort_attention", "drop_ort_attention_fallback",
                    "lower_ort_paged_attention",
                    "lower_ort_norms", "lower_ort_matmulnbits", "lower_ort_moe", "lower_ort_matmul_transb",
                    "eliminate_dead_code"),
}


# Above these no model or machine is plausible: a typo (an extra zero or three), refused before the
# memory plan (formats/memory_plan.py) weighs what the limits cost on this machine
MAX_LIMITS = {"max_batch": 1 << 16, "max_input_len": 1 << 24, "max_seq_len": 1 << 24, "max_images": 1 << 10}
MAX_RECIPE_BYTES = 1 << 20
MAX_YAML_ALIASES = 32  # anchors a recipe may reuse: enough for sharing a pass list, too few to bomb
MAX_YAML_DEPTH = 32


def check_limit(name: str, value: object) -> None:
    """The rule every engine limit (a count of sequences or tokens) follows, wherever it is given."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    top = MAX_LIMITS.get(name)
    if top is not None and value > top:
        raise ConfigError(f"{name} {value} is above {top}, more than any model or machine handles; "
                          f"pass a realistic {name}")


def check_kv_layout(layout: object, block_size: object) -> None:
    if layout not in ("slots", "paged"):
        raise ConfigError(f"kv_layout {layout!r} is not one of slots, paged")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or not 1 <= block_size <= 1024:
        raise ConfigError(f"kv_block_size must be an integer in 1..1024, got {block_size!r}")


@dataclass(frozen=True)
class Limits:
    max_batch: int = 8
    max_input_len: int = 1024  # longest prompt (prefill) the engine is optimized for
    max_seq_len: int = 2048  # KV slots per sequence: prompt + generated tokens
    # vision-language models: images per call of the vision engine (its TensorRT profile's max, images 1..this);
    # 8, as many as a request takes by default (runner/vision/image_limits.py), so one request's images are one call
    max_images: int = 8

    def validate(self) -> None:
        for name in ("max_batch", "max_input_len", "max_seq_len", "max_images"):
            check_limit(name, getattr(self, name))
        if self.max_input_len > self.max_seq_len:
            raise ConfigError(f"max_input_len {self.max_input_len} exceeds max_seq_len {self.max_seq_len}; "
                              f"a prompt must fit the KV cache")


@dataclass(frozen=True)
class PassLists:
    tensorrt: tuple[str, ...] = DEFAULT_PASSES["tensorrt"]
    onnxruntime: tuple[str, ...] = DEFAULT_PASSES["onnxruntime"]


@dataclass(frozen=True)
class BuildConfig:
    targets: tuple[str, ...] = TARGETS
    dtype: str = "auto"  # the TensorRT engine's (and, unless twin_dtype says otherwise, the twin's)
    twin_dtype: str | None = None  # the onnxruntime twin's; None: the same as dtype
    limits: Limits = field(default_factory=Limits)
    compute_capabilities: tuple[str, ...] = ("sm80", "sm86", "sm89", "sm120")
    opt_level: int = 3
    trt_flavour: str = "auto"
    # embedded: the engine carries its weights. refittable: weights can be swapped after the
    # build. stripped: the plan omits the weights the checkpoint holds and is refitted from
    # rank0.safetensors at load (TensorRT-RTX 1.7 cannot build either without a GPU).
    weights: str = "embedded"
    passes: PassLists = field(default_factory=PassLists)
    # logits of the last min(seq, logits_tail) positions: a speculative verify step (last token + up to
    # logits_tail - 1 drafts) reads them all; TensorRT gets a verify profile (seq 2..logits_tail) for it
    logits_tail: int = 16
    # KV cache of the emitted graphs: slots (one max_seq_len row per sequence) or paged (a pool of
    # kv_block_size-token blocks read through a block table; formats/graph_io.py)
    kv_layout: str = "slots"
    kv_block_size: int = 16

    def validate(self) -> None:
        self.limits.validate()
        check_kv_layout(self.kv_layout, self.kv_block_size)
        check_limit("logits_tail", self.logits_tail)
        if not self.targets or any(t not in TARGETS for t in self.targets):
            raise ConfigError(f"targets {list(self.targets)} must be drawn from {', '.join(TARGETS)} (or 'all')")
        if self.dtype not in ("auto", *DTYPES):
            raise ConfigError(f"dtype {self.dtype!r} is not one of auto, {', '.join(DTYPES)}")
        if self.twin_dtype is not None and self.twin_dtype not in DTYPES:
            raise ConfigError(f"twin_dtype {self.twin_dtype!r} is not one of {', '.join(DTYPES)}")
        if self.trt_flavour not in ("auto", "tensorrt", "tensorrt_rtx"):
            raise ConfigError(f"trt_flavour {self.trt_flavour!r} is not one of auto, tensorrt, tensorrt_rtx")
        if not 0 <= self.opt_level <= 5:
            raise ConfigError(f"opt_level must be 0..5, got {self.opt_level}")
        if self.weights not in ("embedded", "refittable", "stripped"):
            raise ConfigError(f"weights {self.weights!r} is not one of embedded, refittable, stripped")


@dataclass(frozen=True)
class Fidelity:
    """A recipe's fidelity gate: `trtbuild eval` figures the built onnxruntime twin must meet before the
    engine dir is renamed into place. Paths are relative to the recipe file; unset bounds are not checked."""

    reference: str | None = None  # checkpoint or engine dir to compare against (needed by the last three bounds)
    text: str | None = None  # .txt / .jsonl; None = the shipped eval text
    max_tokens: int | None = None  # None = eval's default
    context: int | None = None  # window length; None = eval's default
    max_ppl: float | None = None
    max_ppl_ratio: float | None = None  # ppl / reference ppl
    max_kl: float | None = None  # mean KL(reference || engine), nats per position
    min_top1_agreement: float | None = None

    def __post_init__(self) -> None:
        for name in ("reference", "text"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"fidelity.{name} must be a path (relative to the recipe), got {value!r}")
        for name in ("max_tokens", "context"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 2):
                raise ConfigError(f"fidelity.{name} must be an integer >= 2, got {value!r}")
        for name in ("max_ppl", "max_ppl_ratio", "max_kl", "min_top1_agreement"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not math.isfinite(value) or value < 0):
                raise ConfigError(f"fidelity.{name} must be a non-negative number, got {value!r}")
        if self.min_top1_agreement is not None and self.min_top1_agreement > 1:
            raise ConfigError(f"fidelity.min_top1_agreement is a fraction in [0, 1], got {self.min_top1_agreement}")
        needs_reference = [n for n in ("max_ppl_ratio", "max_kl", "min_top1_agreement") if getattr(self, n) is not None]
        if needs_reference and self.reference is None:
            raise ConfigError(f"fidelity.{needs_reference[0]} compares against a reference: set fidelity.reference "
                              f"to a checkpoint or engine dir (relative to the recipe)")


@dataclass(frozen=True)
class Recipe:
    """A YAML recipe: the build settings plus what it is for (model, quantization), and its fidelity gate."""

    model: str = ""  # what the recipe builds, e.g. "SmolLM2-135M-Instruct"; informational
    quantization: str = "none"
    build: BuildConfig = field(default_factory=BuildConfig)
    fidelity: Fidelity | None = None
    runtime: RuntimeConfig | None = None  # how the built engine runs by default (runtime_config.py)


def load_recipe(path: Path) -> Recipe:
    path = Path(path)
    try:
        if path.stat().st_size > MAX_RECIPE_BYTES:
            raise ConfigError(f"recipe {path} is over {MAX_RECIPE_BYTES >> 10} KiB; a recipe is a few lines of YAML")
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read recipe {path}: {exc.strerror}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"recipe {path} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                          f"save it as UTF-8") from None
    data = safe_yaml(text, f"recipe {path}")
    return from_dict(Recipe, _normalize({} if data is None else data), where=f"recipe {path.name}")


class _BoundedLoader(yaml.SafeLoader):
    """yaml.SafeLoader with a cap on aliases (a "billion laughs" document expands exponentially once
    walked) and on nesting (deep nesting exhausts the recursion limit)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.aliases = 0
        self.open_anchors: list[str] = []  # anchors of the nodes being composed: depth and recursion

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_YAML_ALIASES:
                raise _YamlBomb(f"more than {MAX_YAML_ALIASES} aliases (*name)")
            if event.anchor in self.open_anchors:  # a node that holds itself: endless once walked
                raise _YamlBomb(f"a recursive alias (*{event.anchor})")
            return super().compose_node(parent, index)
        self.open_anchors.append(event.anchor)
        try:
            if len(self.open_anchors) > MAX_YAML_DEPTH:
                raise _YamlBomb(f"nested deeper than {MAX_YAML_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self.open_anchors.pop()


class _YamlBomb(Exception):
    pass


def safe_yaml(text: str, what: str) -> Any:
    """TEXT as plain data (mappings, lists, scalars), refusing alias bombs and deep nesting: one
    ConfigError naming WHAT."""
    loader = None
    try:
        loader = _BoundedLoader(text)  # its reader refuses control characters here already
        return loader.get_single_data()
    except _YamlBomb as exc:
        raise ConfigError(f"{what} has {exc}; write the values out") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} is not valid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise ConfigError(f"{what} is nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


def apply_overrides(config: BuildConfig, overrides: dict[str, Any]) -> BuildConfig:
    """Merge flat or dotted keys (limits.max_seq_len) over `config`; unknown keys are rejected."""
    data = dataclasses.asdict(config)
    for key, value in overrides.items():
        node = data
        *parents, leaf = key.split(".")
        for p in parents:
            if not isinstance(node.get(p), dict):
                raise ConfigError(f"--set {key}: {p!r} is not a section; sections: limits, passes")
            node = node[p]
        if leaf not in node:
            raise ConfigError(f"--set {key}: unknown key {leaf!r}; valid keys: {', '.join(node)}")
        node[leaf] = value
    return from_dict(BuildConfig, _normalize(data), where="build config")


def parse_set(items: list[str]) -> dict[str, Any]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r} is not key=value (e.g. --set limits.max_seq_len=4096)")
        out[key.strip()] = safe_yaml(value, f"--set {key.strip()}")
    return out


def _normalize(data: Any) -> Any:
    """YAML spellings we accept: targets: all, a single target or dtype as a string."""
    if isinstance(data, dict):
        data = {k: _normalize(v) for k, v in data.items()}
        if data.get("targets") == "all":
            data["targets"] = list(TARGETS)
        elif isinstance(data.get("targets"), str):
            data["targets"] = [data["targets"]]
        if isinstance(data.get("compute_capabilities"), str):
            data["compute_capabilities"] = [c.strip() for c in data["compute_capabilities"].split(",")]
    return data

"""Frozen dataclasses for the normalized model config and the checkpoint manifest.

`from_dict` rejects unknown keys (listing the valid ones) so a typo in a recipe or a
config from a newer schema fails loudly instead of being ignored.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from engine_builder.errors import ConfigError

CHECKPOINT_SCHEMA = "trtbuild.checkpoint"
CHECKPOINT_SCHEMA_VERSION = 1

Activation = Literal["silu", "gelu_tanh"]
LayerType = Literal["full_attention", "sliding_attention"]
RopeType = Literal["default", "linear", "dynamic", "llama3", "yarn", "longrope"]


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling; fields unused by a type stay at their defaults."""

    type: RopeType = "default"
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    # llama3
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    # yarn
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool | None = None
    # yarn / longrope: multiplies cos and sin
    attention_factor: float | None = None
    # longrope: per-frequency divisors, chosen by sequence length
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    # rotary dims per head (partial rotary when < head_dim)
    dim: int = 0
    interleaved: bool = False
    scaling: RopeScaling = field(default_factory=RopeScaling)
    # sliding-window layers of gemma3 use their own base and no scaling
    local_theta: float | None = None


@dataclass(frozen=True)
class ModelConfig:
    """Everything the graph needs, independent of the source format."""

    architecture: str  # HF model_type the converter was registered for
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rope: RopeConfig
    rms_norm_eps: float = 1e-6
    activation: Activation = "silu"
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # per-head RMSNorm on q and k (qwen3, gemma3)
    # gemma stores RMSNorm weights as w and applies (1 + w)
    norm_offset: float = 0.0
    # gemma multiplies embeddings by sqrt(hidden_size)
    embedding_multiplier: float = 1.0
    # gemma2/3 normalize the attention and MLP outputs before the residual add
    post_attention_norm: bool = False
    post_mlp_norm: bool = False
    # softmax scale; None means 1/sqrt(head_dim)
    attention_scale: float | None = None
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    sliding_window: int | None = None
    layer_types: tuple[LayerType, ...] = ()

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def validate(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"model config: {name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"model config: num_heads {self.num_heads} is not a multiple of "
                f"num_kv_heads {self.num_kv_heads}; check num_key_value_heads in config.json")
        if len(self.layer_types) != self.num_layers:
            raise ConfigError(
                f"model config: {len(self.layer_types)} layer_types for {self.num_layers} layers")
        if "sliding_attention" in self.layer_types and not self.sliding_window:
            raise ConfigError("model config: sliding_attention layers need sliding_window")
        if not 0 < self.rope.dim <= self.head_dim or self.rope.dim % 2:
            raise ConfigError(f"model config: rotary dim {self.rope.dim} must be even and in (0, head_dim]")


@dataclass(frozen=True)
class SourceFile:
    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class SourceFingerprint:
    format: Literal["hf-safetensors", "gguf"]
    model_type: str
    architectures: tuple[str, ...]
    files: tuple[SourceFile, ...]


QuantScheme = Literal["none", "int8_wo", "int4_wo", "int4_awq", "w8a8_sq", "fp8", "awq", "gptq", "gguf"]


@dataclass(frozen=True)
class CalibrationInfo:
    """Where the activation statistics of a calibrated scheme came from."""

    source: str  # file name, or "builtin:<name>" for the shipped text
    sha256: str
    samples: int
    seq_len: int


@dataclass(frozen=True)
class Quantization:
    """config.json's quantization block; the tensor layout it implies is in converters/quantize/FORMAT.md.

    scheme: how the weights were made. int8_wo / int4_wo are round-to-nearest, int4_awq adds
    activation-aware scales, w8a8_sq SmoothQuant, fp8 per-tensor e4m3; awq / gptq are
    pre-quantized Hugging Face checkpoints ingested as they are; gguf keeps a GGUF's Q4_0/Q4_1/Q4_K blocks.
    """

    scheme: QuantScheme = "none"
    weight_bits: int | None = None  # 8 or 4; None for none / fp8 (the dtype says it)
    group_size: int | None = None  # input channels per scale; None = one scale per output channel
    zero_point: bool = False  # asymmetric uint4 with zeros (ingested awq/gptq); TensorRT refuses it
    activation: Literal["none", "int8", "fp8"] = "none"  # static per-tensor activation quantization
    kv_cache: Literal["none", "int8", "fp8"] = "none"
    quantized: tuple[str, ...] = ()  # canonical linear prefixes stored quantized, e.g. "layers.0.attn.qkv"
    excluded: tuple[str, ...] = ()  # linear prefixes kept in full precision (--exclude; gguf: other block types)
    calibration: CalibrationInfo | None = None


@dataclass(frozen=True)
class CheckpointConfig:
    """config.json of a checkpoint dir written by `trtbuild convert`."""

    model: ModelConfig
    dtype: str
    source: SourceFingerprint
    quantization: Quantization = field(default_factory=Quantization)
    num_tensors: int = 0
    trtbuild_version: str = ""
    schema: str = CHECKPOINT_SCHEMA
    schema_version: int = CHECKPOINT_SCHEMA_VERSION

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2) + "\n"

    @classmethod
    def load(cls, ckpt_dir: Path) -> CheckpointConfig:
        path = Path(ckpt_dir) / "config.json"
        if not path.is_file():
            raise ConfigError(f"{ckpt_dir} has no config.json; is it a dir written by `trtbuild convert`?")
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path} is not valid JSON ({exc}); re-run `trtbuild convert`") from exc
        if data.get("schema") != CHECKPOINT_SCHEMA:
            raise ConfigError(f"{path} is not a trtbuild checkpoint config; run `trtbuild convert` first")
        if data.get("schema_version") != CHECKPOINT_SCHEMA_VERSION:
            raise ConfigError(
                f"{path} has checkpoint schema {data.get('schema_version')}, this trtbuild reads "
                f"{CHECKPOINT_SCHEMA_VERSION}; re-run `trtbuild convert` with this version")
        return from_dict(cls, data)


def from_dict(cls: type, data: Any, where: str = "") -> Any:
    """Build dataclass `cls` from plain data, recursing into nested dataclasses.

    Unknown keys raise ConfigError naming the valid keys.
    """
    where = where or cls.__name__
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(fields)}")
    hints = typing.get_type_hints(cls)
    return cls(**{k: _coerce(hints[k], v, f"{where}.{k}") for k, v in data.items()})


def _coerce(hint: Any, value: Any, where: str) -> Any:
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, where)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        return _coerce(inner[0], value, where)
    if origin is tuple and isinstance(value, list | tuple):
        args = typing.get_args(hint)
        return tuple(_coerce(args[0], v, where) for v in value)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value

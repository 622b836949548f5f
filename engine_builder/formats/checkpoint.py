"""The checkpoint format written by `trtbuild convert`: config.json, tensor names, rank files."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from engine_builder.formats.dataclass_io import from_dict
from engine_builder.formats.encoder_spec import encoder_linears, encoder_shapes
from engine_builder.formats.model_config import ModelConfig
from engine_builder.formats.moe_layout import MOE_LINEARS, moe_mlp_shapes
from engine_builder.formats.parallel_mapping import ParallelMapping
from engine_builder.formats.quantization import Quantization
from engine_builder.formats.vision_spec import vision_shapes
from engine_builder.util.errors import ConfigError

CHECKPOINT_SCHEMA = "trtbuild.checkpoint"
# 2: the model block nests the architecture's BlockSpec (model_config.py)
CHECKPOINT_SCHEMA_VERSION = 2
CONFIG_FILE = "config.json"  # in a checkpoint dir and, as the manifest, in an engine dir


def weights_file(rank: int = 0) -> str:
    """The safetensors file of RANK in a checkpoint dir (hard-linked into the engine dir)."""
    return f"rank{rank}.safetensors"


WEIGHTS_FILE = weights_file(0)


Shapes = dict[str, tuple[tuple[int, ...], tuple[int, ...] | None]]


def expected_shapes(cfg: ModelConfig) -> Shapes:
    """Canonical name -> (shape, rows of each fused part or None), in file order."""
    if cfg.encoder is not None:
        return encoder_shapes(cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_layers,
                              cfg.max_position_embeddings, cfg.encoder)
    h, res = cfg.hidden_size, cfg.block.residual
    shapes: Shapes = {"embed.weight": ((cfg.vocab_size, h), None)}
    if cfg.position_embedding == "learned":
        shapes["pos_embed.weight"] = ((cfg.max_position_embeddings, h), None)
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        shapes.update(_norm_shapes(cfg, p + "attn_norm", h))
        shapes.update(_attention_shapes(cfg, p + "attn."))
        if res.post_attention_norm:
            shapes.update(_norm_shapes(cfg, p + "post_attn_norm", h))
        shapes.update(_norm_shapes(cfg, p + "mlp_norm", h))
        shapes.update(_MLP_SHAPES[cfg.block.mlp.kind](cfg, p + "mlp."))
        if res.post_mlp_norm:
            shapes.update(_norm_shapes(cfg, p + "post_mlp_norm", h))
    shapes.update(_norm_shapes(cfg, "final_norm", h))
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = ((cfg.vocab_size, h), None)
    if cfg.vision is not None:  # a vision-language model: its tower and projector after the decoder (vision_spec.py)
        shapes.update(vision_shapes(cfg.vision, h))
    return shapes


def _norm_shapes(cfg: ModelConfig, name: str, size: int) -> Shapes:
    """A norm's weight, and its bias when the norm kind has one (layer_norm)."""
    shapes: Shapes = {name + ".weight": ((size,), None)}
    if cfg.block.norm.bias:
        shapes[name + ".bias"] = ((size,), None)
    return shapes


def _attention_shapes(cfg: ModelConfig, p: str) -> Shapes:
    h, q, kv, attn = cfg.hidden_size, cfg.q_dim, cfg.kv_dim, cfg.block.attention
    shapes: Shapes = {p + "qkv.weight": ((q + 2 * kv, h), (q, kv, kv))}
    if attn.qkv_bias:
        shapes[p + "qkv.bias"] = ((q + 2 * kv,), (q, kv, kv))
    if attn.qk_norm:
        shapes.update(_norm_shapes(cfg, p + "q_norm", cfg.head_dim))
        shapes.update(_norm_shapes(cfg, p + "k_norm", cfg.head_dim))
    shapes[p + "o.weight"] = ((h, q), None)
    if attn.o_bias:
        shapes[p + "o.bias"] = ((h,), None)
    return shapes


def _gated_mlp_shapes(cfg: ModelConfig, p: str) -> Shapes:
    h, inter = cfg.hidden_size, cfg.intermediate_size
    shapes: Shapes = {p + "gate_up.weight": ((2 * inter, h), (inter, inter))}
    if cfg.block.mlp.bias:
        shapes[p + "gate_up.bias"] = ((2 * inter,), (inter, inter))
    shapes[p + "down.weight"] = ((h, inter), None)
    if cfg.block.mlp.bias:
        shapes[p + "down.bias"] = ((h,), None)
    return shapes


def _plain_mlp_shapes(cfg: ModelConfig, p: str) -> Shapes:
    h, inter = cfg.hidden_size, cfg.intermediate_size
    shapes: Shapes = {p + "up.weight": ((inter, h), None)}
    if cfg.block.mlp.bias:
        shapes[p + "up.bias"] = ((inter,), None)
    shapes[p + "down.weight"] = ((h, inter), None)
    if cfg.block.mlp.bias:
        shapes[p + "down.bias"] = ((h,), None)
    return shapes


# MlpSpec.kind -> its tensors and its linears (the quantizable ones, FORMAT.md)
_MLP_SHAPES = {"gated": _gated_mlp_shapes, "plain": _plain_mlp_shapes, "moe": moe_mlp_shapes}
_MLP_LINEARS = {"gated": ("mlp.gate_up", "mlp.down"), "plain": ("mlp.up", "mlp.down"), "moe": MOE_LINEARS}


def linear_prefixes(model: ModelConfig) -> tuple[str, ...]:
    """Every linear a scheme may quantize, by canonical prefix (FORMAT.md), in checkpoint order.

    lm_head is listed for tied models too: quantized, it gets its own tensors beside embed.weight."""
    if model.encoder is not None:
        return encoder_linears(model.num_layers)
    per_layer = ("attn.qkv", "attn.o", *_MLP_LINEARS[model.block.mlp.kind])
    shapes = expected_shapes(model)  # an MoE without a shared expert has no mlp.shared.* linears
    return (*(f"layers.{i}.{p}" for i in range(model.num_layers) for p in per_layer
              if f"layers.{i}.{p}.weight" in shapes), "lm_head")


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


@dataclass(frozen=True)
class CheckpointConfig:
    """config.json of a checkpoint dir written by `trtbuild convert`."""

    model: ModelConfig
    dtype: str
    source: SourceFingerprint
    quantization: Quantization = field(default_factory=Quantization)
    num_tensors: int = 0
    trtbuild_version: str = ""
    # `convert --tp/--pp`: rank{i}.safetensors hold each rank's shard (formats/parallel_mapping.py)
    mapping: ParallelMapping | None = None
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

"""The normalized model config: everything the graph needs, independent of the source format.

An architecture is dims + rope + a typed block spec (BlockSpec): which norm, which attention
variant, which MLP, how the residual branches are normalized. The network emitter dispatches
on these specs, never on the architecture name. A new family (MoE, LayerNorm) adds a value to a
`kind` Literal here and one branch where that kind is emitted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, get_args

from engine_builder.formats.dataclass_io import check_types
from engine_builder.formats.encoder_spec import EncoderSpec
from engine_builder.formats.vision_spec import VisionSpec
from engine_builder.util.errors import ConfigError

NormKind = Literal["rms_norm", "layer_norm"]
MlpKind = Literal["gated", "plain", "moe"]
Activation = Literal["silu", "gelu_tanh", "gelu"]
PositionKind = Literal["rotary", "learned"]
ResidualLayout = Literal["sequential", "parallel"]
LayerType = Literal["full_attention", "sliding_attention"]
RopeType = Literal["default", "linear", "dynamic", "llama3", "yarn", "longrope"]

# Far above any published model (vocab ~262k, hidden ~25k, ~130 layers, head_dim 256): a config past
# these is a typo or an attack, refused before anything is sized from it (formats/memory_plan.py then
# weighs real sizes against this machine)
MAX_DIMS = {"vocab_size": 1 << 22, "hidden_size": 1 << 17, "intermediate_size": 1 << 19, "num_layers": 1 << 10,
            "num_heads": 1 << 12, "num_kv_heads": 1 << 12, "head_dim": 1 << 12}
MAX_EXPERTS = 1 << 12  # published MoEs route over 8..384


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
class NormSpec:
    """Every norm of the model: the block's, q/k norms and the final norm."""

    kind: NormKind = "rms_norm"
    eps: float = 1e-6
    # gemma stores the weight as w and applies (1 + w)
    weight_offset: float = 0.0
    # layer_norm (gpt2, gpt-neox): every norm adds a bias (`<norm>.bias`) after its weight
    bias: bool = False


@dataclass(frozen=True)
class AttentionSpec:
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False  # per-head norm on q and k before rotary (qwen3, gemma3)
    # softmax scale; None means 1/sqrt(head_dim)
    scale: float | None = None
    logit_softcap: float | None = None  # gemma2: cap * tanh(scores / cap) before the mask
    sliding_window: int | None = None
    layer_types: tuple[LayerType, ...] = ()  # one per layer


@dataclass(frozen=True)
class MlpSpec:
    # gated: down(act(gate) * up); plain (gpt2, gpt-neox): down(act(up)); moe: top_k of num_experts gated experts
    kind: MlpKind = "gated"
    activation: Activation = "silu"
    bias: bool = False
    # moe only: experts of intermediate_size each, softmax router over them, top_k per token,
    # the top_k weights renormalized to sum 1 when norm_topk (mixtral always; qwen per config)
    num_experts: int = 0
    top_k: int = 0
    norm_topk: bool = False
    # moe only: an always-on gated expert of this width (0: none) beside the routed ones, scaled
    # by sigmoid(shared_gate(x)) when shared_expert_gate (qwen2_moe)
    shared_expert_size: int = 0
    shared_expert_gate: bool = False


@dataclass(frozen=True)
class ResidualSpec:
    """Pre-norm residual blocks; gemma2/3 also normalize each branch's output ("sandwich" norms).

    sequential: x += attn(attn_norm(x)); x += mlp(mlp_norm(x))
    parallel (gpt-neox use_parallel_residual): x += mlp(mlp_norm(x)) + attn(attn_norm(x)), both from the same x"""

    layout: ResidualLayout = "sequential"
    post_attention_norm: bool = False
    post_mlp_norm: bool = False


@dataclass(frozen=True)
class BlockSpec:
    """One decoder layer, the same for every layer (per-layer attention differences are layer_types)."""

    norm: NormSpec = field(default_factory=NormSpec)
    attention: AttentionSpec = field(default_factory=AttentionSpec)
    mlp: MlpSpec = field(default_factory=MlpSpec)
    residual: ResidualSpec = field(default_factory=ResidualSpec)


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
    block: BlockSpec
    # gemma multiplies embeddings by sqrt(hidden_size)
    embedding_multiplier: float = 1.0
    tie_word_embeddings: bool = False
    final_logit_softcap: float | None = None
    # rotary: RoPE inside attention (rope); learned (gpt2): pos_embed.weight [max_position_embeddings, hidden]
    # added to the token embeddings, no rotary, and no position past max_position_embeddings
    position_embedding: PositionKind = "rotary"
    # BERT-family encoders (formats/encoder_spec.py): no KV cache, no rotary; pooled embeddings out
    encoder: EncoderSpec | None = None
    # vision-language decoders (LLaVA; formats/vision_spec.py): the vision tower and projector beside the decoder
    vision: VisionSpec | None = None

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def validate(self) -> None:
        # types first (a config.json edited by hand, a converter fed strings): every later check compares numbers
        check_types(self, "model config")
        for name, top in MAX_DIMS.items():
            value = getattr(self, name)
            if value <= 0:
                raise ConfigError(f"model config: {name} must be positive, got {value}")
            if value > top:
                raise ConfigError(f"model config: {name} {value} is above {top}, larger than any published model; "
                                  f"check config.json")
        if self.max_position_embeddings <= 0:
            raise ConfigError(f"model config: max_position_embeddings must be positive, got "
                              f"{self.max_position_embeddings}")
        rope, scaling = self.rope, self.rope.scaling
        _positive("rope.theta", rope.theta, required=True)
        _positive("rope.local_theta", rope.local_theta)
        _positive("rope.scaling.factor", scaling.factor, required=True)
        for name in ("low_freq_factor", "high_freq_factor", "attention_factor"):
            _positive(f"rope.scaling.{name}", getattr(scaling, name))
        for name in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim"):  # 0 is meaningful for mscale_all_dim
            _finite(f"rope.scaling.{name}", getattr(scaling, name))
        for name in ("short_factor", "long_factor"):
            for i, factor in enumerate(getattr(scaling, name) or ()):
                _positive(f"rope.scaling.{name}[{i}]", factor)
        _positive("embedding_multiplier", self.embedding_multiplier, required=True)
        _finite("block.norm.weight_offset", self.block.norm.weight_offset)
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"model config: num_heads {self.num_heads} is not a multiple of "
                f"num_kv_heads {self.num_kv_heads}; check num_key_value_heads in config.json")
        _one_of("position_embedding", self.position_embedding, PositionKind)
        if self.position_embedding == "learned" and self.rope.dim:
            raise ConfigError(f"model config: learned position embeddings take no rotary, but rope.dim is "
                              f"{self.rope.dim}; set it to 0")
        if self.encoder is not None:
            self.encoder.validate(self.max_position_embeddings)
        elif self.position_embedding == "rotary" and (not 0 < self.rope.dim <= self.head_dim or self.rope.dim % 2):
            raise ConfigError(f"model config: rotary dim {self.rope.dim} must be even and in (0, head_dim]")
        if self.vision is not None:
            if self.encoder is not None:
                raise ConfigError("model config: an encoder (encoder) takes no vision tower (vision); set one of them")
            self.vision.validate(self.vocab_size)
        _positive("final_logit_softcap", self.final_logit_softcap)
        norm, attn, mlp = self.block.norm, self.block.attention, self.block.mlp
        # check_types / from_dict check Literal values already; these name what a newer schema may add
        _one_of("block.norm.kind", norm.kind, NormKind)
        _one_of("block.mlp.kind", mlp.kind, MlpKind)
        _one_of("block.mlp.activation", mlp.activation, Activation)
        _one_of("block.residual.layout", self.block.residual.layout, ResidualLayout)
        if norm.bias and norm.kind != "layer_norm":
            raise ConfigError(f"model config: block.norm.bias applies to layer_norm, not {norm.kind}")
        _check_moe(mlp)
        for layer_type in attn.layer_types:
            _one_of("block.attention.layer_types", layer_type, LayerType)
        _positive("block.norm.eps", norm.eps)
        _positive("block.attention.scale", attn.scale)
        _positive("block.attention.logit_softcap", attn.logit_softcap)
        _positive("block.attention.sliding_window", attn.sliding_window)
        if len(attn.layer_types) != self.num_layers:
            raise ConfigError(
                f"model config: {len(attn.layer_types)} block.attention.layer_types for {self.num_layers} layers")
        if "sliding_attention" in attn.layer_types and not attn.sliding_window:
            raise ConfigError("model config: sliding_attention layers need block.attention.sliding_window")


def _check_moe(mlp: MlpSpec) -> None:
    """An MoE MLP needs a router over >= 1 experts choosing 1..num_experts; a dense one has none."""
    if mlp.kind != "moe":
        if mlp.num_experts or mlp.top_k or mlp.shared_expert_size:
            raise ConfigError(f"model config: block.mlp.kind {mlp.kind!r} has no experts; set kind 'moe' or "
                              "num_experts, top_k and shared_expert_size to 0")
        return
    if mlp.num_experts <= 0 or mlp.num_experts > MAX_EXPERTS:
        raise ConfigError(f"model config: block.mlp.num_experts must be in 1..{MAX_EXPERTS}, got {mlp.num_experts}")
    if not 0 < mlp.top_k <= mlp.num_experts:
        raise ConfigError(f"model config: block.mlp.top_k must be in 1..num_experts ({mlp.num_experts}), "
                          f"got {mlp.top_k}; check num_experts_per_tok in config.json")
    if mlp.shared_expert_size < 0 or mlp.shared_expert_size > MAX_DIMS["intermediate_size"]:
        raise ConfigError(f"model config: block.mlp.shared_expert_size must be in 0..{MAX_DIMS['intermediate_size']}, "
                          f"got {mlp.shared_expert_size}")
    if mlp.shared_expert_gate and not mlp.shared_expert_size:
        raise ConfigError("model config: block.mlp.shared_expert_gate without a shared expert (shared_expert_size 0)")
    if mlp.bias:
        raise ConfigError("model config: MoE experts with biases are not supported (block.mlp.bias)")


def _one_of(name: str, value: object, kinds: object) -> None:
    if value not in get_args(kinds):
        raise ConfigError(f"model config: {name} {value!r} is not one of {', '.join(get_args(kinds))} "
                          "(a checkpoint from a newer trtbuild?)")


def _positive(name: str, value: float | None, required: bool = False) -> None:
    """None means unset (unless REQUIRED); a set value must be finite and > 0 (NaN compares false)."""
    if value is None and not required:
        return
    if value is None or not (math.isfinite(value) and value > 0):
        raise ConfigError(f"model config: {name} must be a positive finite number{'' if required else ' when set'}, "
                          f"got {value}")


def _finite(name: str, value: float | None) -> None:
    if value is not None and not math.isfinite(value):
        raise ConfigError(f"model config: {name} must be a finite number when set, got {value}")

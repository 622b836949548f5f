"""The tensor / pipeline parallel mapping: which rank holds which heads, rows and layers (Megatron's rules).

    rank = pp_rank * tp + tp_rank          (ranks of one pipeline stage are consecutive, as in TensorRT-LLM)
    stage pp_rank holds layers [pp_rank * L/pp, (pp_rank + 1) * L/pp); stage 0 the embedding, the last
    stage the final norm and lm_head (and a copy of the embedding's shard when they are tied)

Within a stage, tp ranks split each layer:
    qkv, gate_up      column-parallel: rank r keeps its heads' q rows (heads/tp of them), its KV heads'
                      k and v rows, and its slice of gate and of up (intermediate/tp rows each)
    o, down           row-parallel: rank r keeps its heads' / its intermediate slice's input columns; the
                      ranks' outputs are partial sums that an all-reduce adds up
    embed, lm_head    vocab-parallel: rank r keeps vocab rows [r * V/tp, (r + 1) * V/tp); embedding rows
                      outside the shard give zeros (all-reduce), lm_head logits are all-gathered
    norms, q/k norms  replicated
    MoE (mixtral, qwen2_moe, qwen3_moe)
                      tensor-parallel inside every expert (TensorRT-LLM's "MoE TP"): rank r keeps its
                      slice of each expert's gate/up rows and down columns, and of the shared expert's;
                      the router (and qwen2_moe's shared-expert gate) is replicated, so every rank routes
                      each token to the same experts and their partial sums all-reduce to the whole MLP.
                      Not expert parallelism: no rank holds whole experts.
KV heads split when tp divides them; when fewer than tp, each KV head is replicated on tp/kv_heads ranks
(every rank then holds one KV head: the one its query heads read).

A rank's graph is split at every collective (ONNX has no collective op, and TensorRT would need a
plugin): the segments below, each one ONNX graph / engine, run in order with the collective between.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from engine_builder.formats.model_config import ModelConfig
from engine_builder.util.errors import InputError, UnsupportedError

# llama-family decoders: gated MLP, pre-norm residual, no o / MLP biases (qwen2's qkv bias splits by rows)
PARALLEL_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe")

SegmentKind = Literal["embed", "attn", "mlp", "head"]

# segment graph I/O (beside graph_io's input_ids / position_ids / past_lengths / past_* / present_*)
HIDDEN = "hidden"  # [batch, seq, hidden]: the residual stream entering an attn / mlp / head segment
PARTIAL = "partial"  # [batch, seq, hidden]: this rank's partial sum (embed, o_proj, down), to all-reduce
LOCAL_LOGITS = "local_logits"  # [batch, 1, vocab / tp] float32: this rank's vocab shard of the last position


@dataclass(frozen=True)
class Segment:
    kind: SegmentKind
    layer: int | None = None  # attn / mlp: the global layer index

    @property
    def name(self) -> str:
        return self.kind if self.layer is None else f"layers.{self.layer}.{self.kind}"

    def file(self, rank: int, suffix: str = "onnx") -> str:
        """The segment's graph (suffix onnx) or engine (suffix engine), flat beside rank{i}.safetensors."""
        return f"rank{rank}.{self.name}.{suffix}"


@dataclass(frozen=True)
class ParallelMapping:
    tp: int = 1
    pp: int = 1

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    def tp_rank(self, rank: int) -> int:
        return rank % self.tp

    def pp_rank(self, rank: int) -> int:
        return rank // self.tp

    def rank_of(self, tp_rank: int, pp_rank: int) -> int:
        return pp_rank * self.tp + tp_rank

    def stage_ranks(self, pp_rank: int) -> list[int]:
        """The tp ranks of one pipeline stage (one all-reduce group)."""
        return [self.rank_of(t, pp_rank) for t in range(self.tp)]

    def layers(self, pp_rank: int, num_layers: int) -> range:
        per = num_layers // self.pp
        return range(pp_rank * per, (pp_rank + 1) * per)

    def segments(self, rank: int, num_layers: int) -> list[Segment]:
        """Rank's segments in execution order."""
        stage = self.pp_rank(rank)
        out = [Segment("embed")] if stage == 0 else []
        for i in self.layers(stage, num_layers):
            out += [Segment("attn", i), Segment("mlp", i)]
        if stage == self.pp - 1:
            out.append(Segment("head"))
        return out

    # ---- what a rank holds --------------------------------------------------------------------------------
    def kv_heads(self, cfg: ModelConfig) -> int:
        """KV heads per rank: split, or 1 (replicated) when the model has fewer than tp."""
        return max(1, cfg.num_kv_heads // self.tp)

    def first_kv_head(self, cfg: ModelConfig, tp_rank: int) -> int:
        if cfg.num_kv_heads >= self.tp:
            return tp_rank * self.kv_heads(cfg)
        return tp_rank * cfg.num_kv_heads // self.tp  # the KV head this rank's query heads read

    def vocab_start(self, cfg: ModelConfig, tp_rank: int) -> int:
        return tp_rank * (cfg.vocab_size // self.tp)

    def local_model(self, cfg: ModelConfig) -> ModelConfig:
        """The model config one tp rank's segments compute: its heads, KV heads, MLP slice (of every expert's,
        and the shared expert's) and vocab shard."""
        mlp = cfg.block.mlp
        block = dataclasses.replace(cfg.block, mlp=dataclasses.replace(
            mlp, shared_expert_size=mlp.shared_expert_size // self.tp))
        return dataclasses.replace(cfg, num_heads=cfg.num_heads // self.tp, num_kv_heads=self.kv_heads(cfg),
                                   intermediate_size=cfg.intermediate_size // self.tp,
                                   vocab_size=cfg.vocab_size // self.tp, block=block)

    def rank_tensors(self, cfg: ModelConfig, rank: int, all_shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple]:
        """Name -> shape of what rank{rank}.safetensors holds; ALL_SHAPES: checkpoint.expected_shapes of
        local_model(cfg) (passed in: this module sits below checkpoint.py)."""
        stage = self.pp_rank(rank)
        layers = {f"layers.{i}." for i in self.layers(stage, cfg.num_layers)}
        last = stage == self.pp - 1

        def held(name: str) -> bool:
            if name.startswith("layers."):
                return name[:name.index(".", 7) + 1] in layers
            if name == "embed.weight":
                return stage == 0 or (last and cfg.tie_word_embeddings)
            return last  # final_norm, lm_head

        return {name: shape for name, shape in all_shapes.items() if held(name)}

    # ---- refusals -----------------------------------------------------------------------------------------
    def check(self, cfg: ModelConfig) -> None:
        """Refuse a mapping this model cannot take, listing the values that it can."""
        for name, value in (("tp", self.tp), ("pp", self.pp)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"--{name} must be a positive integer, got {value!r}")
        if self.world_size == 1:
            return
        if cfg.architecture not in PARALLEL_ARCHITECTURES:
            raise UnsupportedError(f"--tp/--pp shard llama-family decoders ({', '.join(PARALLEL_ARCHITECTURES)}) "
                                   f"only, not {cfg.architecture}; convert without --tp/--pp")
        spec = cfg.block
        if spec.mlp.kind not in ("gated", "moe") or spec.mlp.bias or spec.attention.o_bias \
                or spec.residual.layout != "sequential" or cfg.position_embedding != "rotary" \
                or cfg.embedding_multiplier != 1.0 or cfg.final_logit_softcap:
            raise UnsupportedError(f"this {cfg.architecture} config has a block --tp/--pp do not shard (MLP or "
                                   "o_proj biases, parallel residual, learned positions or soft-capping); convert "
                                   "without --tp/--pp")
        tp_ok, pp_ok = valid_tp(cfg), valid_pp(cfg)
        if self.tp not in tp_ok:
            shared = f", shared expert {cfg.block.mlp.shared_expert_size}" if cfg.block.mlp.shared_expert_size else ""
            raise InputError(f"--tp {self.tp} does not divide this {cfg.architecture} model ({cfg.num_heads} heads, "
                             f"{cfg.num_kv_heads} KV heads, intermediate {cfg.intermediate_size}{shared}, vocab "
                             f"{cfg.vocab_size}); valid --tp values: {', '.join(map(str, tp_ok))}")
        if self.pp not in pp_ok:
            raise InputError(f"--pp {self.pp} does not divide this model's {cfg.num_layers} layers; valid --pp "
                             f"values: {', '.join(map(str, pp_ok))}")


def _tp_divides(cfg: ModelConfig, tp: int) -> bool:
    kv = cfg.num_kv_heads
    return (cfg.num_heads % tp == 0 and (kv % tp == 0 or tp % kv == 0) and cfg.intermediate_size % tp == 0
            and cfg.vocab_size % tp == 0 and cfg.block.mlp.shared_expert_size % tp == 0)


def valid_tp(cfg: ModelConfig) -> list[int]:
    return [tp for tp in range(1, cfg.num_heads + 1) if _tp_divides(cfg, tp)]


def valid_pp(cfg: ModelConfig) -> list[int]:
    return [pp for pp in range(1, cfg.num_layers + 1) if cfg.num_layers % pp == 0]

"""The decoder in torch, built from the ModelConfig block spec, over a paged KV pool and a flat batch of tokens.

    decoder = TorchDecoder.from_dir(engine_or_ckpt_dir, device="cuda", dtype=torch.bfloat16)
    k_pools, v_pools = decoder.new_pools(num_blocks, block_size)
    logits = decoder(token_ids, positions, PagedKV(k_pools, v_pools, block_tables, context_lens, query_start,
                                                   slots), logits_indices)                  # [N, vocab] float32

It dispatches on the block spec exactly as the graph emitter (engine_builder/network/decoder.py, attention.py)
does, never on the architecture name, and computes each op in transformers' order and precision (layers.py,
rope_tables.py, experts.py), so float32 logits equal transformers' to float rounding. A step is the flat batch
of runner/core/model_input.py: every sequence's new tokens back to back; each layer rotates its queries and keys
and writes its new keys and values into the pool through `kv_write` (rotary_write_ref's signature), then attends
through `attention` (paged_attention_ref's); on the GPU Triton kernels replace both (the rotary there rounds its
float32 products and sum once, as inductor's fused rotary did, where transformers' 16-bit rotary rounds each:
the last bit of a channel may differ). Everything per model
(weights, rotary tables) is made at construction, and the forward holds no host synchronization outside the
attention function (no .item(), no branch on a tensor's value; only on shapes), so the GPU path can capture it
in a CUDA graph.

Tensor parallel (tp > 1, tensor_parallel.py): rank r's decoder is the model of mapping.local_model(cfg) (its
heads, KV heads, MLP and expert slices, vocab rows) over rank{r}.safetensors; the embedding, every o_proj and
MLP output, and the logits pass through the tp group's collectives, so every rank ends a step with the whole
model's logits.

Vision-language (a checkpoint with a vision tower): a prefill may carry an ImageSplice, the image features that
replace the image tokens' embeddings (the features come from vision.onnx on onnxruntime, runner/vision/); the
decoder itself is the text model's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F

from engine_builder.formats.checkpoint import expected_shapes
from engine_builder.formats.model_config import LayerType, ModelConfig
from engine_builder.formats.quantization import Quantization
from engine_builder.formats.rope_frequencies import rope_frequencies
from engine_builder.runner.torch_backend.checkpoint_tensors import (
    check_quantization,
    expect,
    float_weight,
    read_model_dir,
)
from engine_builder.runner.torch_backend.device_kv_attention import paged_attention_ref, rotary_write_ref
from engine_builder.runner.torch_backend.experts import MoeWeights, moe_mlp
from engine_builder.runner.torch_backend.layers import (
    DenseMlpWeights,
    NormWeights,
    dense_mlp,
    linear,
    norm,
    residual_add,
)
from engine_builder.runner.torch_backend.rope_tables import RotaryTable, rotary_tables
from engine_builder.runner.torch_backend.tensor_parallel import TensorParallel
from engine_builder.util.errors import ConfigError, UnsupportedError


class AttentionFn(Protocol):
    """paged_attention_ref's signature: q [T, heads, head_dim] -> [T, heads, head_dim]."""

    def __call__(self, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_tables: torch.Tensor,
                 context_lens: torch.Tensor, query_start: torch.Tensor, *, scale: float,
                 softcap: float | None = None, sliding_window: int | None = None,
                 image_ids: torch.Tensor | None = None) -> torch.Tensor: ...


class KVWriteFn(Protocol):
    """rotary_write_ref's signature: norm (qwen3) and rotate q and k, write k and v into the pools; returns the
    rotated q."""

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor | None,
                 sin: torch.Tensor | None, k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor, *,
                 interleaved: bool, q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None,
                 norm_eps: float = 0.0) -> torch.Tensor: ...


@dataclass(frozen=True)
class PagedKV:
    """One step's KV: the pools of every layer and where this step's sequences are in them (device_kv_attention.py).
    All on the decoder's device (paged_attention_ref also takes query_start and context_lens on the host)."""

    k_pools: Sequence[torch.Tensor]  # per layer [num_blocks, block_size, kv_heads, head_dim]
    v_pools: Sequence[torch.Tensor]
    block_tables: torch.Tensor  # [S, max_blocks] int32: each sequence's pool blocks in order
    context_lens: torch.Tensor  # [S] int64: positions each sequence holds once this step's tokens are written
    query_start: torch.Tensor  # [S + 1] int64: sequence i's tokens are query_start[i]:query_start[i + 1]
    slots: torch.Tensor  # [T] int64: the flat pool slot of each new token (attention.slot_mapping)


@dataclass(frozen=True)
class ImageSplice:
    """A vision-language prefill's image features on the decoder's device (ModelInput.images, runtime.py)."""

    token_index: torch.Tensor  # [k] int64: the flat tokens whose embedding a feature replaces
    embeds: torch.Tensor  # [k, hidden] float32, as vision.onnx gives them
    # [T] int64: 1, 2.. per run of image tokens, 0 for text: set where an image's tokens attend to each other both
    # ways (Gemma 3), None where they attend causally (llava)
    image_ids: torch.Tensor | None = None


@dataclass(frozen=True)
class AttentionWeights:
    qkv: torch.Tensor  # [q_dim + 2 kv_dim, hidden]: q rows, then k, then v
    o: torch.Tensor  # [hidden, q_dim]
    qkv_bias: torch.Tensor | None = None
    o_bias: torch.Tensor | None = None
    q_norm: NormWeights | None = None  # per head, [head_dim] (qwen3, gemma3)
    k_norm: NormWeights | None = None


@dataclass(frozen=True)
class LayerWeights:
    attn_norm: NormWeights
    attn: AttentionWeights
    mlp_norm: NormWeights
    mlp: DenseMlpWeights | MoeWeights
    post_attn_norm: NormWeights | None = None  # gemma's sandwich norms
    post_mlp_norm: NormWeights | None = None


class TorchDecoder:
    """A decoder-only model's forward over the canonical checkpoint tensors (formats/checkpoint.py names)."""

    def __init__(self, cfg: ModelConfig, tensors: Mapping[str, torch.Tensor], *, device: torch.device | str,
                 dtype: torch.dtype, quantization: Quantization = Quantization(), max_positions: int | None = None,
                 attention: AttentionFn = paged_attention_ref, kv_write: KVWriteFn = rotary_write_ref,
                 tp: TensorParallel | None = None):
        """TENSORS: canonical name -> tensor as stored (a quantized checkpoint's linears dequantized here, per
        QUANTIZATION). MAX_POSITIONS: the rotary tables' bound (positions 0..max_positions - 1; default
        max_position_embeddings; an engine's max_seq_len may be larger). TP: this rank's tp group, CFG and
        TENSORS then being its shard's (mapping.local_model, rank{r}.safetensors)."""
        if cfg.encoder is not None:
            raise UnsupportedError(f"{cfg.architecture} is an encoder (pooled embeddings), not a decoder: the torch "
                                   "backend runs decoders only; run it with the onnxruntime backend")
        cfg.validate()
        check_quantization(quantization)
        self.cfg, self.device, self.dtype, self.attention = cfg, torch.device(device), dtype, attention
        self.kv_write = kv_write
        self.tp = tp if tp is not None and tp.size > 1 else None
        # set by compiled_forward.py: the pool write and attention as one op torch.compile does not look into, and
        # the layer and the head through torch.compile (one compiled layer serves every layer)
        self.kv_attention: Callable[..., torch.Tensor] | None = None
        self.decoder_layer = self._decoder_layer
        self.logits = self._logits
        self.max_positions = max_positions or cfg.max_position_embeddings
        if cfg.position_embedding == "learned" and self.max_positions > cfg.max_position_embeddings:
            raise ConfigError(f"max positions {self.max_positions} is past the {cfg.max_position_embeddings} "
                              f"positions this {cfg.architecture} model learned (max_position_embeddings)")
        self._shapes = {name: shape for name, (shape, _) in expected_shapes(cfg).items()}
        self._tensors, self._quant = tensors, quantization
        self.embed = self._float("embed.weight")  # [vocab, hidden]
        # gemma: sqrt(hidden) as a constant of the model dtype, as transformers rounds it
        self.embed_scale = torch.tensor(cfg.embedding_multiplier, dtype=dtype, device=self.device) \
            if cfg.embedding_multiplier != 1.0 else None
        self.pos_embed = self._float("pos_embed.weight") if cfg.position_embedding == "learned" else None
        self.layers = tuple(self._layer(i) for i in range(cfg.num_layers))
        self.final_norm = self._norm("final_norm")
        if cfg.tie_word_embeddings and "lm_head" not in quantization.quantized:
            self.lm_head = self.embed
        else:  # a quantized lm_head has its own tensors, tied or not (FORMAT.md)
            self.lm_head = self._linear("lm_head", (cfg.vocab_size, cfg.hidden_size))
        self.rotary: dict[LayerType, RotaryTable] = {} if cfg.position_embedding != "rotary" else \
            rotary_tables(cfg, self.max_positions, self.device, dtype)
        # longrope and dynamic NTK pick their frequencies by each token's sequence length
        self._needs_seq_lens = cfg.position_embedding == "rotary" and cfg.rope.scaling.type in ("longrope", "dynamic")
        del self._tensors  # the stored tensors (and the file behind them) are no longer needed

    @classmethod
    def from_dir(cls, path: Path, *, device: torch.device | str, dtype: torch.dtype, max_positions: int | None = None,
                 attention: AttentionFn = paged_attention_ref, kv_write: KVWriteFn = rotary_write_ref,
                 tp: TensorParallel | None = None) -> TorchDecoder:
        """A checkpoint dir or an engine dir (rank0.safetensors beside config.json); an engine dir's rotary
        tables cover its max_seq_len unless MAX_POSITIONS says otherwise. TP: a tp dir's rank, which reads its own
        shard (rank{tp.rank}.safetensors)."""
        found = read_model_dir(Path(path), tp_rank=tp.rank if tp is not None else None)
        bound = max_positions or max(found.max_seq_len or 0, found.model.max_position_embeddings)
        if found.model.position_embedding == "learned":
            bound = min(bound, found.model.max_position_embeddings)
        return cls(found.model, found.tensors, device=device, dtype=dtype, quantization=found.quantization,
                   max_positions=bound, attention=attention, kv_write=kv_write, tp=tp)

    @property
    def reprefill_after(self) -> int | None:
        """longrope: once a sequence grows past this many tokens its cached keys (rotated with the short
        factors) are stale and it must be prefilled again (the Backend's reprefill_after, as the graph's
        trtbuild.reprefill_after metadata says it); None otherwise."""
        if self.cfg.position_embedding != "rotary" or self.cfg.rope.scaling.type != "longrope":
            return None
        return rope_frequencies(self.cfg, "full_attention").long_after

    def new_pools(self, num_blocks: int, block_size: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Zeroed key and value pools, one [num_blocks, block_size, kv_heads, head_dim] pair per layer."""
        shape = (num_blocks, block_size, self.cfg.num_kv_heads, self.cfg.head_dim)

        def pools() -> list[torch.Tensor]:
            return [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.cfg.num_layers)]

        return pools(), pools()

    @torch.no_grad()
    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor, kv: PagedKV,
                logits_indices: torch.Tensor, images: ImageSplice | None = None) -> torch.Tensor:
        """token_ids, positions [T] int64 -> logits [N, vocab] float32 of the tokens at logits_indices [N]. IMAGES: a
        vision-language prefill's features, spliced over their tokens' embeddings."""
        # [T, hidden]; vocab-parallel under tp: this rank's rows, the others' zeros, all-reduced
        h = self.tp.embed(token_ids, self.embed) if self.tp else F.embedding(token_ids, self.embed)
        if self.embed_scale is not None:
            h = h * self.embed_scale
        if images is not None:  # after the scale, unscaled: gemma3's scale is inside its embedding module, and
            # transformers' masked_scatter puts the features (cast to the embeddings' dtype) over its output, as the
            # graph's splice does (network/decoder.py _splice_images); before gpt2-style learned positions
            h = h.index_copy(0, images.token_index, images.embeds.to(h.dtype))
        if self.pos_embed is not None:  # gpt2: token + position embeddings
            h = h + F.embedding(positions, self.pos_embed)
        seq_lens = None
        if self._needs_seq_lens:  # each token's sequence length, as the graph's max(position_ids) + 1 per row
            tokens = torch.arange(token_ids.shape[0], device=token_ids.device, dtype=kv.query_start.dtype)
            seq_of_token = torch.searchsorted(kv.query_start[1:], tokens, right=True)  # [T]
            # tokens past the last query (a CUDA-graph bucket's padding) belong to no sequence: any index will do
            seq_of_token = seq_of_token.clamp_(max=kv.context_lens.shape[0] - 1)
            seq_lens = kv.context_lens.to(token_ids.device)[seq_of_token]
        by_table = {id(t): t.cos_sin(positions, seq_lens) for t in self.rotary.values()}  # once per distinct table
        image_ids = images.image_ids if images is not None else None
        attn = self.cfg.block.attention
        branch = torch.zeros_like(h)  # each layer's last branch, added to the stream at the next one's start
        for i, layer in enumerate(self.layers):
            layer_type = attn.layer_types[i]
            table = self.rotary.get(layer_type)
            window = attn.sliding_window if layer_type == "sliding_attention" else None
            h, branch = self.decoder_layer(h, branch, layer, table, by_table[id(table)] if table else None, window,
                                           kv.k_pools[i], kv.v_pools[i], kv, image_ids)
        return self.logits(h, branch, logits_indices)

    __call__ = forward

    def _logits(self, h: torch.Tensor, branch: torch.Tensor, logits_indices: torch.Tensor) -> torch.Tensor:
        """The last layer's stream and branch [T, hidden] -> logits [N, vocab] float32 of the tokens at logits_indices
        (the residual added for those tokens only)."""
        h = residual_add(h[logits_indices], branch[logits_indices])
        h = norm(h, self.final_norm, self.cfg.block.norm)  # [N, hidden]
        logits = linear(h, self.lm_head)  # [N, vocab] (under tp [N, vocab / tp], gathered)
        if self.tp:
            logits = self.tp.gather_vocab(logits)
        if self.cfg.final_logit_softcap:
            cap = self.cfg.final_logit_softcap
            logits = torch.tanh(logits / cap) * cap
        return logits.float()

    def _decoder_layer(self, x: torch.Tensor, last: torch.Tensor, w: LayerWeights, table: RotaryTable | None,
                       cos_sin: tuple[torch.Tensor, torch.Tensor] | None, window: int | None, k_pool: torch.Tensor,
                       v_pool: torch.Tensor, kv: PagedKV,
                       image_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Pre-norm residual block (ResidualSpec): sequential, or parallel (gpt-neox), where both branches read the
        same x and are added as transformers adds them. x, last [T, hidden]: the stream and the last layer's final
        branch (zeros before the first), whose residual add is this layer's first op; returns this layer's pair.
        Deferred, the add is a pointwise input of this layer's first norm, which inductor fuses into it (returned
        summed, it was the compiled graph's output, and inductor made it a copy and an addmm: residual_add)."""
        x = residual_add(x, last)
        spec = self.cfg.block
        h = self._attention(norm(x, w.attn_norm, spec.norm), w.attn, table, cos_sin, window, k_pool, v_pool, kv,
                            image_ids)
        if self.tp:  # o_proj's partial sums (row-parallel; the mapping refuses an o bias)
            h = self.tp.all_reduce(h)
        if w.post_attn_norm is not None:
            h = norm(h, w.post_attn_norm, spec.norm)
        attn_out = h
        if spec.residual.layout != "parallel":
            x = residual_add(x, h)
        h = norm(x, w.mlp_norm, spec.norm)
        h = moe_mlp(h, w.mlp, spec.mlp) if isinstance(w.mlp, MoeWeights) else dense_mlp(h, w.mlp, spec.mlp)
        if self.tp:  # down's partial sums (every expert's slice, and the shared expert's)
            h = self.tp.all_reduce(h)
        if w.post_mlp_norm is not None:
            h = norm(h, w.post_mlp_norm, spec.norm)
        if spec.residual.layout == "parallel":  # (mlp + attn) + x, transformers' order of the float sums
            return x, residual_add(h, attn_out)
        return x, h

    def _attention(self, x: torch.Tensor, w: AttentionWeights, table: RotaryTable | None,
                   cos_sin: tuple[torch.Tensor, torch.Tensor] | None, window: int | None, k_pool: torch.Tensor,
                   v_pool: torch.Tensor, kv: PagedKV, image_ids: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, hidden] (normalized) -> [T, hidden]: qkv, attend (_attend), o."""
        out = self._attend(linear(x, w.qkv, w.qkv_bias), w, table, cos_sin, window, k_pool, v_pool, kv, image_ids)
        return linear(out.flatten(-2), w.o, w.o_bias)

    def _attend(self, qkv: torch.Tensor, w: AttentionWeights, table: RotaryTable | None,
                cos_sin: tuple[torch.Tensor, torch.Tensor] | None, window: int | None, k_pool: torch.Tensor,
                v_pool: torch.Tensor, kv: PagedKV, image_ids: torch.Tensor | None = None) -> torch.Tensor:
        """qkv [T, q_dim + 2 kv_dim] -> [T, heads, head_dim]: q/k norms, rotary, write the pool, attend. IMAGE_IDS:
        ImageSplice.image_ids, a bidirectional image's prefill (the attention function's mask beyond causality)."""
        cfg, spec = self.cfg, self.cfg.block.attention
        q, k, v = qkv.split([cfg.q_dim, cfg.kv_dim, cfg.kv_dim], dim=-1)
        q = q.unflatten(-1, (cfg.num_heads, cfg.head_dim))  # [T, heads, head_dim]
        k = k.unflatten(-1, (cfg.num_kv_heads, cfg.head_dim))  # [T, kv_heads, head_dim]
        v = v.unflatten(-1, (cfg.num_kv_heads, cfg.head_dim))
        q_norm = k_norm = None
        if w.q_norm is not None and w.k_norm is not None:  # qwen3, gemma3: per-head norm before rotary
            if cfg.block.norm.weight_offset:  # gemma3's (1 + w) in float32: here
                q, k = norm(q, w.q_norm, cfg.block.norm), norm(k, w.k_norm, cfg.block.norm)
            else:  # llama's RMSNorm (qwen3): in the KV write, which rotates and writes the normed heads
                q_norm, k_norm = w.q_norm.weight, w.k_norm.weight
        cos, sin = cos_sin if table is not None and cos_sin is not None else (None, None)
        interleaved = table is not None and table.interleaved
        scale = spec.scale if spec.scale is not None else cfg.head_dim ** -0.5
        eps = cfg.block.norm.eps
        if self.kv_attention is not None and image_ids is None:  # rotary + write + attend: one op (compiled_forward)
            return self.kv_attention(q, k, v, cos, sin, interleaved, q_norm, k_norm, eps, k_pool, v_pool, kv.slots,
                                     kv.block_tables, kv.context_lens, kv.query_start, scale, spec.logit_softcap,
                                     window)
        q = self.kv_write(q, k, v, cos, sin, k_pool, v_pool, kv.slots, interleaved=interleaved, q_norm=q_norm,
                          k_norm=k_norm, norm_eps=eps)
        return self.attention(q, k_pool, v_pool, kv.block_tables, kv.context_lens, kv.query_start, scale=scale,
                              softcap=spec.logit_softcap, sliding_window=window, image_ids=image_ids)

    # -- loading: every tensor to the device, in the model dtype --

    def _float(self, name: str) -> torch.Tensor:
        return expect(self._tensors, name, self._shapes[name], self.device).to(self.dtype)

    def _linear(self, prefix: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        """A linear's weight [out, in] (MoE experts' [E * out, in]) for layers.linear, as stored, also on a CPU: a
        column-major copy streamed 1.4x faster through MKL, but through OpenBLAS decode was the same either way
        (benchmarks/results/cpu-torch-backend-2026-12-05b.txt)."""
        shape = shape or self._shapes[prefix + ".weight"]
        return float_weight(self._tensors, self._quant, prefix, shape, self.device).to(self.dtype)

    def _optional(self, name: str) -> torch.Tensor | None:
        return self._float(name) if name in self._shapes else None

    def _norm(self, name: str) -> NormWeights:
        return NormWeights(self._float(name + ".weight"), self._optional(name + ".bias"))

    def _layer(self, i: int) -> LayerWeights:
        p, cfg = f"layers.{i}.", self.cfg
        a = p + "attn."
        attn = AttentionWeights(
            qkv=self._linear(a + "qkv"), o=self._linear(a + "o"), qkv_bias=self._optional(a + "qkv.bias"),
            o_bias=self._optional(a + "o.bias"),
            q_norm=self._norm(a + "q_norm") if cfg.block.attention.qk_norm else None,
            k_norm=self._norm(a + "k_norm") if cfg.block.attention.qk_norm else None)
        res = cfg.block.residual
        return LayerWeights(
            attn_norm=self._norm(p + "attn_norm"), attn=attn, mlp_norm=self._norm(p + "mlp_norm"),
            mlp=self._moe(p + "mlp.") if cfg.block.mlp.kind == "moe" else self._dense(p + "mlp."),
            post_attn_norm=self._norm(p + "post_attn_norm") if res.post_attention_norm else None,
            post_mlp_norm=self._norm(p + "post_mlp_norm") if res.post_mlp_norm else None)

    def _dense(self, p: str) -> DenseMlpWeights:
        up = p + ("gate_up" if self.cfg.block.mlp.kind == "gated" else "up")
        return DenseMlpWeights(up=self._linear(up), down=self._linear(p + "down"),
                               up_bias=self._optional(up + ".bias"), down_bias=self._optional(p + "down.bias"))

    def _moe(self, p: str) -> MoeWeights:
        """The expert stacks [E * out, in] as [E, out, in] views (formats/moe_layout.py)."""
        experts, shared = self.cfg.block.mlp.num_experts, p + "shared."
        has_shared = shared + "gate_up.weight" in self._shapes
        return MoeWeights(
            router=self._float(p + "router.weight"),
            gate_up=self._linear(p + "experts.gate_up").unflatten(0, (experts, -1)),
            down=self._linear(p + "experts.down").unflatten(0, (experts, -1)),
            shared_gate_up=self._linear(shared + "gate_up") if has_shared else None,
            shared_down=self._linear(shared + "down") if has_shared else None,
            shared_gate=self._optional(p + "shared_gate.weight"))

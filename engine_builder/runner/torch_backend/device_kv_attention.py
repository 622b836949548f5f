"""Paged KV on a torch device: where a step's keys and values go, and attention that reads them back.

The pool of one layer is two tensors [num_blocks, block_size, kv_heads, head_dim] (keys, values): block b of a
sequence holds its positions b * block_size .. (b + 1) * block_size - 1, and a sequence's block table row lists
its pool blocks in order (the PagedKVCacheManager's table, runner/kv/paged_kv_cache.py). A step is a flat batch
(runner/core/model_input.py): num_tokens new tokens, sequence i's at query_start[i]:query_start[i + 1], being
the last positions of the context_lens[i] that sequence holds once they are written.

    write_kv              the step's keys/values into their pool slots (block * block_size + offset)
    rotary_write_ref      a layer's q/k norms (qwen3) and rotary of q and k, then write_kv: what the model
                          does between its qkv projection and attention, and the oracle of the Triton kernel
                          that does it in one launch (rotary_kv_write_triton.py)
    paged_attention_ref   every query attends to its own sequence's positions up to its own (causal),
                          and within sliding_window of it when given (transformers' rule: q - k < window);
                          gather, then per sequence torch SDPA (a lone query, or soft-capped scores: two
                          products and a softmax): correct for any shape, on any device, and slow.
                          It is the oracle of the Triton kernel (paged_attention_triton.py) and the CPU path.
                          With image_ids (Gemma 3's prefill of an image) the tokens of one image also see each
                          other ahead of themselves; the runtime sends such a step here, not to the kernel.

Queries, keys and values are [tokens, heads, head_dim]; any query/KV head ratio (SmolLM2 is 9:3). Scores are
computed in float32 whatever the pool's dtype; soft-capping (gemma2: cap * tanh(s / cap)) comes before the mask.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine_builder.formats.model_config import NormSpec
from engine_builder.runner.torch_backend.layers import NormWeights, norm
from engine_builder.runner.torch_backend.rope_tables import apply_rotary


def slot_mapping(block_tables: torch.Tensor, positions: torch.Tensor, seq_of_token: torch.Tensor,
                 block_size: int) -> torch.Tensor:
    """[tokens] int64: the flat pool slot (block * block_size + offset) each new token's key/value goes to."""
    blocks = block_tables[seq_of_token, positions // block_size].to(torch.int64)
    return blocks * block_size + positions % block_size


def write_kv(k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor) -> None:
    """k, v [tokens, kv_heads, head_dim] into the pools [num_blocks, block_size, kv_heads, head_dim] at slots."""
    kv_heads, head_dim = k_pool.shape[2], k_pool.shape[3]
    k_pool.view(-1, kv_heads, head_dim).index_copy_(0, slots, k.to(k_pool.dtype))
    v_pool.view(-1, kv_heads, head_dim).index_copy_(0, slots, v.to(v_pool.dtype))


def rotary_write_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor | None,
                     sin: torch.Tensor | None, k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor, *,
                     interleaved: bool, q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None,
                     norm_eps: float = 0.0) -> torch.Tensor:
    """q [T, heads, head_dim], k, v [T, kv_heads, head_dim]; cos, sin [T, 1, rot_dim] (RotaryTable.cos_sin; None: no
    rotary) -> q rotated; k rotated and v written into the pools at slots. Q_NORM, K_NORM [head_dim]: each head of q
    and k first through llama's RMSNorm with these weights (qwen3's q/k norms)."""
    if q_norm is not None and k_norm is not None:
        spec = NormSpec(eps=norm_eps)
        q, k = norm(q, NormWeights(q_norm), spec), norm(k, NormWeights(k_norm), spec)
    if cos is not None and sin is not None:
        q, k = apply_rotary(q, cos, sin, interleaved), apply_rotary(k, cos, sin, interleaved)
    write_kv(k_pool, v_pool, slots, k, v)
    return q


def paged_attention_ref(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_tables: torch.Tensor,
                        context_lens: torch.Tensor, query_start: torch.Tensor, *, scale: float,
                        softcap: float | None = None, sliding_window: int | None = None,
                        image_ids: torch.Tensor | None = None) -> torch.Tensor:
    """[tokens, heads, head_dim] in q's dtype: attention of each sequence's queries over its cached positions.

    block_tables [seqs, max_blocks] int32/64, context_lens [seqs], query_start [seqs + 1] (host or device).
    image_ids [tokens] int64: 1, 2.. for each image's run of tokens in this step, 0 for text; a query also sees the
    keys of its own image's run (network/masks.py image_block_visible: OR(causal, same image), then the window)."""
    kv_heads, block_size = k_pool.shape[2], k_pool.shape[1]
    out = torch.empty_like(q)
    starts, lens = query_start.tolist(), context_lens.tolist()
    for i, ctx in enumerate(lens):
        lo, hi = starts[i], starts[i + 1]
        if hi == lo:
            continue
        blocks = block_tables[i, :-(-ctx // block_size)].to(device=k_pool.device, dtype=torch.int64)
        # index_select, not k_pool[blocks]: advanced indexing took 2-3 ms a call on 2 CPU threads, this 3 us
        k = k_pool.index_select(0, blocks).reshape(-1, kv_heads, k_pool.shape[3])[:ctx]  # [ctx, kv_heads, head_dim]
        v = v_pool.index_select(0, blocks).reshape(-1, kv_heads, v_pool.shape[3])[:ctx]
        visible = None  # a lone query with no window sees its whole context: no mask (a CPU decode step's case)
        if hi - lo > 1 or sliding_window or image_ids is not None:
            q_pos = torch.arange(ctx - (hi - lo), ctx, device=q.device)[:, None]  # [q_len, 1]
            k_pos = torch.arange(ctx, device=q.device)[None, :]  # [1, ctx]
            visible = k_pos <= q_pos
            if image_ids is not None:  # only this step's tokens are numbered: an image is prefilled in one call
                q_id = image_ids[lo:hi].to(q.device)
                k_id = torch.cat([torch.zeros(ctx - (hi - lo), dtype=q_id.dtype, device=q.device), q_id])
                visible |= (q_id[:, None] == k_id[None, :]) & (q_id[:, None] > 0)
            if sliding_window:
                visible &= q_pos - k_pos < sliding_window
        if hi - lo == 1 or softcap:
            o = _attend(q[lo:hi], k, v, visible, scale, softcap)
        else:  # with a batch axis (4-d) SDPA takes its flash kernel on a CPU, tiled: a long prompt's [heads, n, ctx]
            # scores are never all in memory (3-d took the math one: 4-5x slower for 300 queries over 400 keys)
            o = F.scaled_dot_product_attention(q[None, lo:hi].transpose(1, 2).float(), k[None].transpose(1, 2).float(),
                                               v[None].transpose(1, 2).float(), attn_mask=visible, scale=scale,
                                               enable_gqa=True)[0].transpose(0, 1)
        out[lo:hi] = o.to(q.dtype)
    return out


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor | None, scale: float,
            softcap: float | None) -> torch.Tensor:
    """q [n, heads, head_dim] over k, v [ctx, kv_heads, head_dim] -> [n, heads, head_dim] float32, VISIBLE [n, ctx]
    (None: all). Each KV head's group of query heads is one matrix product, the KV never repeated per head. A
    decode query's path (and soft-capping's, which SDPA lacks): torch's CPU SDPA took 150-170 us for one query over
    200 keys (SmolLM2's 9:3 heads, 1 or 2 EPYC threads), these two products and a softmax 60 us."""
    n, heads, head_dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    # [kv_heads, group * n, head_dim]: kv head j's query heads j * group .. (j + 1) * group - 1, each n rows
    qg = q.float().reshape(n, kv_heads, group, head_dim).permute(1, 2, 0, 3).reshape(kv_heads, group * n, head_dim)
    scores = torch.bmm(qg, k.float().permute(1, 2, 0)) * scale  # [kv_heads, group * n, ctx]
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    if visible is not None:
        scores = scores.masked_fill(~visible.repeat(group, 1), float("-inf"))
    o = torch.bmm(torch.softmax(scores, dim=-1), v.float().transpose(0, 1))  # [kv_heads, group * n, head_dim]
    return o.reshape(kv_heads, group, n, head_dim).permute(2, 0, 1, 3).reshape(n, heads, head_dim)

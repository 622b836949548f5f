"""A layer's q/k norms (qwen3), rotary embedding and paged KV write as one Triton kernel: device_kv_attention.py's
rotary_write_ref.

Between the qkv projection and the attention kernel a compiled decode step ran four kernels a layer: inductor's
rotary of q, its rotary of k, and the pool write's two index_copy_ (keys, values); at batch 1 SmolLM2's 30 layers
spent 120 of the step's 480 launches there (benchmarks/results/gpu-step-profile-compiled-h100-2026-12-05.txt).
This kernel is one launch: program (token, head) rotates one query head into a new q, or, for a KV head, rotates
the key and writes it and the value into their pool slot. Rotary is rotate-half (transformers' default) or GPT-J's
interleaved pairs, over the first ROT_DIM channels (partial rotary), none at all with ROT_DIM 0 (learned
positions): q then comes back as a copy. Qwen3's per-head q/k norms (llama's RMSNorm over head_dim) come first, in
the same program: its row is all in registers (the partner channels of the rotation are normed alike).

Arithmetic in float32, rounded once to the pool's dtype, as inductor's fused rotary rounded it; transformers' eager
bf16 rotary rounds each product and the sum, so the two may differ in the last bit of a channel.

CUDA-graph capturable: the grid is (tokens, heads + kv_heads), host ints from the shapes; nothing is read back.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _normed(x, rstd, w_ptr, idx, mask, dtype):
    """llama's RMSNorm of channels IDX of a row (x float32, rstd its row's): normalized, rounded to DTYPE, times the
    weight, rounded again; float32 out."""
    w = tl.load(w_ptr + idx, mask=mask, other=0.0).to(tl.float32)
    return ((x * rstd).to(dtype).to(tl.float32) * w).to(dtype).to(tl.float32)


@triton.jit
def _rotated(row_ptr, cos_ptr, sin_ptr, norm_ptr, offs, d_ok, eps, ROT_DIM: tl.constexpr, INTERLEAVED: tl.constexpr,
             NORM: tl.constexpr, HEAD_DIM: tl.constexpr):
    """One head's row [HEAD_DIM_PAD] in float32, normed first where NORM (qwen3's q/k norms, weights at NORM_PTR),
    its first ROT_DIM channels rotated by the token's cos/sin rows."""
    dtype = row_ptr.dtype.element_ty
    x = tl.load(row_ptr + offs, mask=d_ok, other=0.0).to(tl.float32)
    if NORM:
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / HEAD_DIM + eps)
        x = _normed(x, rstd, norm_ptr, offs, d_ok, dtype)
    if ROT_DIM > 0:
        rot = offs < ROT_DIM
        if INTERLEAVED:  # GPT-J: (x0, x1) -> (-x1, x0) per channel pair
            partner = offs ^ 1
            sign = tl.where(offs % 2 == 0, -1.0, 1.0)
        else:  # rotate_half: cat(-x2, x1)
            partner = tl.where(offs < ROT_DIM // 2, offs + ROT_DIM // 2, offs - ROT_DIM // 2)
            sign = tl.where(offs < ROT_DIM // 2, -1.0, 1.0)
        x_partner = tl.load(row_ptr + partner, mask=rot, other=0.0).to(tl.float32)
        if NORM:
            x_partner = _normed(x_partner, rstd, norm_ptr, partner, rot, dtype)
        cos = tl.load(cos_ptr + offs, mask=rot, other=1.0).to(tl.float32)
        sin = tl.load(sin_ptr + offs, mask=rot, other=0.0).to(tl.float32)
        x = tl.where(rot, x * cos + sign * x_partner * sin, x)
    return x


@triton.jit
def _rotary_write_kernel(
        q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, q_norm_ptr, k_norm_ptr, q_out_ptr, k_pool_ptr, v_pool_ptr, slots_ptr,
        stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ct, stride_st,
        stride_ks, stride_kh_pool, stride_vs, stride_vh_pool, eps,
        HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, ROT_DIM: tl.constexpr,
        INTERLEAVED: tl.constexpr, NORM: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs = tl.arange(0, HEAD_DIM_PAD)
    d_ok = offs < HEAD_DIM
    cos_row = cos_ptr + tok * stride_ct
    sin_row = sin_ptr + tok * stride_st
    if head < HEADS:
        x = _rotated(q_ptr + tok * stride_qt + head * stride_qh, cos_row, sin_row, q_norm_ptr, offs, d_ok, eps,
                     ROT_DIM, INTERLEAVED, NORM, HEAD_DIM)
        tl.store(q_out_ptr + (tok * HEADS + head) * HEAD_DIM + offs, x.to(q_out_ptr.dtype.element_ty), mask=d_ok)
    else:
        kv_head = head - HEADS
        slot = tl.load(slots_ptr + tok).to(tl.int64)
        x = _rotated(k_ptr + tok * stride_kt + kv_head * stride_kh, cos_row, sin_row, k_norm_ptr, offs, d_ok, eps,
                     ROT_DIM, INTERLEAVED, NORM, HEAD_DIM)
        tl.store(k_pool_ptr + slot * stride_ks + kv_head * stride_kh_pool + offs,
                 x.to(k_pool_ptr.dtype.element_ty), mask=d_ok)
        v = tl.load(v_ptr + tok * stride_vt + kv_head * stride_vh + offs, mask=d_ok)
        tl.store(v_pool_ptr + slot * stride_vs + kv_head * stride_vh_pool + offs,
                 v.to(v_pool_ptr.dtype.element_ty), mask=d_ok)


def rotary_write_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor | None,
                        sin: torch.Tensor | None, k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor, *,
                        interleaved: bool, q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None,
                        norm_eps: float = 0.0) -> torch.Tensor:
    """rotary_write_ref's result (device_kv_attention.py): q rotated [tokens, heads, head_dim] (a new tensor in q's
    dtype), k rotated and v written into the pools [num_blocks, block_size, kv_heads, head_dim] at slots [tokens].
    q, k, v may be views of a fused projection (the last dim contiguous); cos, sin [tokens, 1, rot_dim] (or
    [tokens, rot_dim]) in the model dtype, None where the model has no rotary; q_norm, k_norm [head_dim]: qwen3's
    per-head norms first (llama's RMSNorm, eps norm_eps)."""
    tokens, heads, head_dim = q.shape
    kv_heads = k.shape[1]
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    q_out = torch.empty((tokens, heads, head_dim), dtype=q.dtype, device=q.device)
    if tokens == 0:
        return q_out
    k_slots = k_pool.view(-1, kv_heads, head_dim)  # [slots, kv_heads, head_dim]: a view, the pool is contiguous
    v_slots = v_pool.view(-1, kv_heads, head_dim)
    if cos is None or sin is None:
        rot_dim, cos, sin = 0, q, q  # never read: ROT_DIM 0 compiles the rotation out
    else:
        cos, sin = cos.reshape(tokens, -1), sin.reshape(tokens, -1)
        rot_dim = cos.shape[-1]
        cos, sin = (t if t.stride(-1) == 1 else t.contiguous() for t in (cos, sin))
    norm = q_norm is not None and k_norm is not None
    _rotary_write_kernel[(tokens, heads + kv_heads)](
        q, k, v, cos, sin, q_norm if norm else q, k_norm if norm else q, q_out, k_slots, v_slots, slots,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos.stride(0), sin.stride(0),
        k_slots.stride(0), k_slots.stride(1), v_slots.stride(0), v_slots.stride(1), norm_eps,
        HEADS=heads, HEAD_DIM=head_dim, HEAD_DIM_PAD=triton.next_power_of_2(head_dim), ROT_DIM=rot_dim,
        INTERLEAVED=interleaved, NORM=norm, num_warps=1)
    return q_out

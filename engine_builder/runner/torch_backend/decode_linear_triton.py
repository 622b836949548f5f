"""A decode step's linear as one Triton kernel, with the residual add and RMSNorm before it and the gated
activation after it fused in: fused_decode.py's building block.

The sixth session's H100 profile of a compiled SmolLM2 decode step at batch 1 had ~16 kernels a layer
(benchmarks/results/gpu-step-profile-compiled-h100-2026-12-05.txt); after the rotary + write kernel, the
in-launch split-K combine and the deferred residual add, ~10 remain by the profile's kernel names: a norm, four
cuBLAS gemms (nvjet at M=1, ~3.8 us each, ~5x the time their 0.7-3.5 MB of weights take to stream), the
activation, rotary + write, attention. A layer through this kernel is six launches: [add + norm + qkv], rotary +
write, attention, [o], [add + norm + gate_up + act * up], [down].

    y = linear(norm(x + r), W, b)       (NORM, RESIDUAL; s = x + r is also written: the stream)
    y = act(gate) * up                  (GATED: gate, up = the two halves of W's rows, as layers.gated_mlp)

For the few tokens of a decode step (M <= MAX_ROWS): program n holds output columns [n * BLOCK_N, ...) for every
row, streams its slice of W once over K, and multiplies on the tensor cores with the rows padded to 16 (mma), or
to 64 past 16 rows (Hopper's wgmma): M=1 wastes compute, which a decode step has to spare; the bytes of W are the
cost. The norm needs each row's mean square first, so a program reads its rows twice (K values each, from L2:
nothing beside W); the first program writes the new stream in that first pass.

Rounding as transformers' eager modules round, so the float32 CPU path and a 16-bit GPU agree to the products' sum
order: the residual sum to the model dtype; llama's RMSNorm (x * rsqrt(mean(x^2) + eps)) to the model dtype, then
times the weight, rounded; the linear's float32 sum plus bias rounded once (cuBLAS's epilogue); gate and up
rounded, silu(gate) rounded, the product rounded.

CUDA-graph capturable: the grid is host ints from the shapes, nothing is read back. On CUDA the block sizes are
Triton's autotune over a few configs (keyed by N, K and the padded rows: the decode buckets of each padding share
them), which runs at the first call of each shape: LLM.warm_up's steps, before any capture.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_ROWS = 64  # rows a call takes at most (tunables.FUSED_DECODE_MAX_TOKENS is at most this)


def padded_rows(rows: int) -> int:
    """The tile's rows: mma's 16, or wgmma's 64 past that."""
    return 16 if rows <= 16 else 64


@triton.jit
def _stream_tile(x_ptr, r_ptr, offs_m, kk, mask, stride_xm, stride_rm, RESIDUAL: tl.constexpr):
    """x (+ r) [BLOCK_M, BLOCK_K] in float32, the sum rounded to x's dtype first (residual_add)."""
    a = tl.load(x_ptr + offs_m[:, None] * stride_xm + kk[None, :], mask=mask, other=0.0)
    if RESIDUAL:
        r = tl.load(r_ptr + offs_m[:, None] * stride_rm + kk[None, :], mask=mask, other=0.0)
        a = (a.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
    return a.to(tl.float32)


@triton.jit
def _decode_linear_kernel(
        x_ptr, r_ptr, s_ptr, g_ptr, w_ptr, b_ptr, y_ptr,
        M, N, K, stride_xm, stride_rm, stride_sm, stride_wn, stride_ym, eps,
        NORM: tl.constexpr, RESIDUAL: tl.constexpr, GATED: tl.constexpr, HAS_BIAS: tl.constexpr,
        PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    dtype = w_ptr.dtype.element_ty
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    if NORM or RESIDUAL:  # a first pass over K: each row's mean square (the scale of every product below), and
        # the new stream, written once (here, so the loop of W's loads below holds nothing else)
        sumsq = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + offs_k
            a_mask = m_ok[:, None] & (kk < K)[None, :]
            a = _stream_tile(x_ptr, r_ptr, offs_m, kk, a_mask, stride_xm, stride_rm, RESIDUAL)
            if RESIDUAL:
                if pid == 0:
                    tl.store(s_ptr + offs_m[:, None] * stride_sm + kk[None, :], a.to(dtype), mask=a_mask)
            sumsq += tl.sum(a * a, axis=1)
        rstd = 1.0 / tl.sqrt(sumsq / K + eps)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        k_ok = kk < K
        a = _stream_tile(x_ptr, r_ptr, offs_m, kk, m_ok[:, None] & k_ok[None, :], stride_xm, stride_rm, RESIDUAL)
        if NORM:  # llama: normalized, back to the model dtype, times the weight (rounded)
            g = tl.load(g_ptr + kk, mask=k_ok, other=0.0).to(tl.float32)
            a = (a * rstd[:, None]).to(dtype).to(tl.float32) * g[None, :]
        a = a.to(dtype)
        w_mask = n_ok[None, :] & k_ok[:, None]
        w = tl.load(w_ptr + offs_n[None, :] * stride_wn + kk[:, None], mask=w_mask, other=0.0)
        acc = tl.dot(a, w, acc, input_precision=PRECISION)
        if GATED:  # up's rows follow gate's: [gate; up] is one weight (layers.DenseMlpWeights)
            w = tl.load(w_ptr + (offs_n[None, :] + N) * stride_wn + kk[:, None], mask=w_mask, other=0.0)
            acc_up = tl.dot(a, w, acc_up, input_precision=PRECISION)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        if GATED:
            acc_up += tl.load(b_ptr + N + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if GATED:  # silu(gate) * up, each rounded to the model dtype as the eager ops round
        gate = acc.to(dtype).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
        acc = act * acc_up.to(dtype).to(tl.float32)
    tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], acc.to(dtype),
             mask=m_ok[:, None] & n_ok[None, :])


# memory-bound: enough W bytes in flight per multiprocessor (BLOCK_N x BLOCK_K x stages) and enough programs
_CONFIGS = [triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=4, num_stages=stages)
            for n, k, stages in ((16, 128, 4), (16, 256, 3), (32, 128, 4), (32, 256, 3), (64, 128, 3), (64, 64, 4))]
_tuned = triton.autotune(_CONFIGS, key=["N", "K", "NORM", "GATED", "BLOCK_M"])(_decode_linear_kernel)
# what the interpreter (Triton's CPU checks) and a CPU run take: autotune would time every config there
_UNTUNED = {"BLOCK_N": 32, "BLOCK_K": 64}


def decode_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                  residual: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None,
                  eps: float = 1e-6, gated: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x [M, K] (M <= MAX_ROWS), weight [N_w, K] (rows contiguous), bias [N_w] -> (y, s):

    s = x + residual (the new stream, [M, K]) where RESIDUAL is given, else None;
    h = rmsnorm(s or x) * norm_weight (llama's) where NORM_WEIGHT is given, else s or x;
    y = h @ weight.T + bias [M, N_w], or GATED: silu(gate) * up [M, N_w / 2] of its two halves.
    Every output a new tensor in x's dtype."""
    rows, k = x.shape
    if rows > MAX_ROWS:
        raise ValueError(f"decode_linear takes at most {MAX_ROWS} rows, got {rows}")
    n = weight.shape[0] // 2 if gated else weight.shape[0]
    x = x if x.stride(-1) == 1 else x.contiguous()
    weight = weight if weight.stride(-1) == 1 else weight.contiguous()
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    s = torch.empty_like(x, memory_format=torch.contiguous_format) if residual is not None else None
    if residual is not None and residual.stride(-1) != 1:
        residual = residual.contiguous()
    if rows == 0:
        return y, s
    # pointers never read where their flag is off
    r, g, b = (residual if residual is not None else x), (norm_weight if norm_weight is not None else x), \
        (bias if bias is not None else x)
    args = (x, r, s if s is not None else x, g, weight, b, y, rows, n, k, x.stride(0), r.stride(0),
            s.stride(0) if s is not None else 0, weight.stride(0), y.stride(0), eps)
    flags = dict(NORM=norm_weight is not None, RESIDUAL=residual is not None, GATED=gated, HAS_BIAS=bias is not None,
                 PRECISION="ieee" if x.dtype == torch.float32 else "tf32", BLOCK_M=padded_rows(rows))
    if x.device.type == "cuda":
        _tuned[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)](*args, **flags)
    else:
        _decode_linear_kernel[(triton.cdiv(n, _UNTUNED["BLOCK_N"]),)](*args, **flags, **_UNTUNED)
    return y, s

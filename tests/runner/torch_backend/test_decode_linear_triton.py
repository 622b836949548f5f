"""decode_linear_triton against the eager ops it replaces (layers.py: residual_add, llama's RMSNorm, F.linear, silu
* up) and float64 arithmetic, on the CPU (Triton's interpreter), and its sm_90 builds.

The interpreter cases run in a child process with TRITON_INTERPRET=1, this file being the child's script
(tests/triton_interpreter.py says why); where a CUDA device is, the same cases run compiled on it
(benchmarks/gpu_run.sh's `tests` part). Runtime on 2 shared cores: about 10 s.
"""

from __future__ import annotations

import pytest
from triton_interpreter import report_cases, run_interpreted

triton = pytest.importorskip("triton", reason="triton is not installed (the `test` extra brings it)")

# name -> rows M, K, N (output columns; gated: of each half), what is fused, dtype. K and N off the block sizes
# (the tails' masks), M from one decode token to the kernel's 64 rows.
CASES: dict[str, dict] = {
    "qkv_m1_bf16": dict(m=1, k=200, n=120, residual=True, norm=True, dtype="bfloat16"),
    "gate_up_m3_bf16_bias": dict(m=3, k=96, n=80, residual=True, norm=True, gated=True, bias=True,
                                 dtype="bfloat16"),
    "o_m16_f32_bias": dict(m=16, k=130, n=72, bias=True, dtype="float32"),
    "down_m5_f16": dict(m=5, k=160, n=64, dtype="float16"),
    "head_m2_f32": dict(m=2, k=64, n=320, residual=True, norm=True, dtype="float32"),
    "norm_only_m4_bf16": dict(m=4, k=72, n=40, norm=True, dtype="bfloat16"),
    "gate_up_m7_f32": dict(m=7, k=64, n=96, residual=True, norm=True, gated=True, dtype="float32"),
    # past 16 rows the tile is 64 (wgmma on Hopper)
    "gate_up_m33_bf16": dict(m=33, k=96, n=80, residual=True, norm=True, gated=True, dtype="bfloat16"),
    "o_m64_f16_bias": dict(m=64, k=136, n=72, bias=True, dtype="float16"),
}
EPS = 1e-5


def run_case(spec: dict, seed: int, device: str = "cpu") -> dict:
    """Random operands made on the CPU, run on DEVICE: the kernel's y and stream against the eager ops' (in the
    dtype, as transformers computes them) and against float64."""
    import torch
    import torch.nn.functional as F

    from engine_builder.formats.model_config import NormSpec
    from engine_builder.runner.torch_backend.decode_linear_triton import decode_linear
    from engine_builder.runner.torch_backend.layers import NormWeights, norm, residual_add

    gen = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, spec["dtype"])
    m, k, n, gated = spec["m"], spec["k"], spec["n"], spec.get("gated", False)
    rows = 2 * n if gated else n
    x = torch.randn(m, k, generator=gen).to(dtype)
    r = torch.randn(m, k, generator=gen).to(dtype) if spec.get("residual") else None
    g = (torch.rand(k, generator=gen) + 0.5).to(dtype) if spec.get("norm") else None
    w = (torch.randn(rows, k, generator=gen) / k ** 0.5).to(dtype)
    b = torch.randn(rows, generator=gen).to(dtype) if spec.get("bias") else None

    def on(t):
        return None if t is None else t.to(device)

    y, s = decode_linear(on(x), on(w), on(b), residual=on(r), norm_weight=on(g), eps=EPS, gated=gated)

    def eager(t, cast):
        """The eager modules' composition, each op rounding to CAST's dtype."""
        t, args = cast(t), [cast(a) if a is not None else None for a in (r, g, w, b)]
        r_, g_, w_, b_ = args
        stream = residual_add(t, r_) if r_ is not None else t
        h = norm(stream, NormWeights(g_), NormSpec(eps=EPS)) if g_ is not None else stream
        out = F.linear(h, w_, b_)
        if gated:
            gate, up = out.chunk(2, dim=-1)
            out = F.silu(gate) * up
        return out, stream

    want, stream = eager(x, lambda t: t)  # the dtype's own ops, on the CPU
    want64, _ = eager(x, lambda t: t.double())

    def rel(got, ref):
        ref = ref.double()
        return float((got.double().cpu() - ref).norm() / ref.norm())

    return {
        "shape": list(y.shape), "stream_shape": list(s.shape) if s is not None else None,
        "stream_equal": bool(torch.equal(s.cpu(), stream)) if s is not None else None,
        "rel_eager": rel(y, want), "rel_64": rel(y, want64), "eager_rel_64": rel(want, want64),
    }


def child_main() -> None:
    from engine_builder.runner.torch_backend import decode_linear_triton as dl

    report_cases(dl._decode_linear_kernel, CASES, run_case)


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_interpreted(__file__)


def _check(got: dict, spec: dict) -> None:
    """The residual sum bit for bit; y as the eager ops give it up to their float32 sums' order: float32's sum
    error in a float32 model; in a 16-bit one the rare element whose sum falls on the other side of a rounding
    boundary (measured in the interpreter: none; skipping the norm's rounding to the dtype before its weight gives
    3e-3); and no further from float64 than the eager ops are, give or take that."""
    assert got["shape"] == [spec["m"], spec["n"]], got
    if spec.get("residual"):
        assert got["stream_equal"] and got["stream_shape"] == [spec["m"], spec["k"]], got
    else:
        assert got["stream_shape"] is None, got
    tolerance = {"bfloat16": 1e-3, "float16": 1e-3, "float32": 2e-6}[spec["dtype"]]
    assert got["rel_eager"] < tolerance, got
    assert got["rel_64"] < got["eager_rel_64"] + tolerance, got


@pytest.mark.parametrize("name", list(CASES))
def test_matches_the_eager_ops_in_interpreter(interpreted, name):
    _check(interpreted[name], CASES[name])


@pytest.mark.parametrize("name", list(CASES))
def test_matches_the_eager_ops_on_cuda(name):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (the interpreter cases above run the same checks on the CPU)")
    _check(run_case(CASES[name], list(CASES).index(name), "cuda"), CASES[name])


def test_refuses_more_rows_than_its_largest_tile():
    import torch

    from engine_builder.runner.torch_backend.decode_linear_triton import decode_linear

    with pytest.raises(ValueError, match="at most 64 rows, got 65"):
        decode_linear(torch.zeros(65, 8), torch.zeros(8, 8))


@pytest.mark.parametrize("const", [
    dict(dtype="bf16", NORM=True, RESIDUAL=True, GATED=True, HAS_BIAS=True, BLOCK_N=32, BLOCK_K=128, BLOCK_M=16),
    dict(dtype="bf16", NORM=False, RESIDUAL=False, GATED=False, HAS_BIAS=False, BLOCK_N=64, BLOCK_K=64, BLOCK_M=16),
    dict(dtype="fp16", NORM=True, RESIDUAL=True, GATED=False, HAS_BIAS=False, BLOCK_N=16, BLOCK_K=256, BLOCK_M=16),
    dict(dtype="bf16", NORM=True, RESIDUAL=True, GATED=True, HAS_BIAS=False, BLOCK_N=64, BLOCK_K=128, BLOCK_M=64),
], ids=["qkv_gated_bias_bf16", "plain_bf16", "norm_f16", "gated_64_rows_bf16"])
def test_builds_for_hopper(const):
    """The interpreter takes what the GPU compiler may refuse (types, shapes, a dot's operands): each fused variant
    must build for sm_90 with a tensor-core dot, and with W's loads pipelined (cp.async into num_stages buffers:
    a decode step's linear is W's bytes streaming) given the 16-byte alignment the JIT sees in torch's tensors
    (without it Triton leaves the loads unpipelined)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from engine_builder.runner.torch_backend import decode_linear_triton as dl

    fn = dl._decode_linear_kernel
    dtype = const.pop("dtype")
    const.update(PRECISION="tf32")
    sig = {n: "constexpr" if n in const else "*" + dtype if n.endswith("_ptr") else "fp32" if n == "eps" else "i32"
           for n in fn.arg_names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
               if n.endswith("_ptr") or n in ("N", "K") or n.startswith("stride")}
    kernel = triton.compile(ASTSource(fn, sig, constexprs=const, attrs=aligned), target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": 4, "num_stages": 3})
    assert kernel.asm["cubin"], "no cubin"
    # Hopper's tensor cores: mma for a 16-row tile, the warpgroup's wgmma for 64
    assert ("wgmma.mma_async" if const["BLOCK_M"] == 64 else "mma.sync") in kernel.asm["ptx"], "no tensor-core dot"
    assert "cp.async" in kernel.asm["ptx"], "W's loads are not pipelined"


if __name__ == "__main__":
    child_main()

"""rotary_kv_write_triton against float64 arithmetic and rotary_write_ref, on the CPU (Triton's interpreter), and its
sm_90 build.

The interpreter cases run in a child process with TRITON_INTERPRET=1, this file being the child's script
(tests/triton_interpreter.py says why); where a CUDA device is, the same cases run compiled on it
(benchmarks/gpu_run.sh's `tests` part). Runtime on 2 shared cores: about 8 s.
"""

from __future__ import annotations

import pytest
from triton_interpreter import report_cases, run_interpreted

triton = pytest.importorskip("triton", reason="triton is not installed (the `test` extra brings it)")

# name -> heads, kv_heads, head_dim, rotary channels (0: none), interleaved, dtype, tokens; fused: q, k, v views of
# one [tokens, (heads + 2 kv_heads) * head_dim] projection (the model's case) rather than contiguous tensors (a
# q/k-normed model's); flat: cos/sin as [tokens, rot] rather than cos_sin's [tokens, 1, rot]
CASES: dict[str, dict] = {
    "halves_9:3_d64_bf16_fused": dict(h=9, kv=3, d=64, rot=64, interleaved=False, dtype="bfloat16", t=5, fused=True),
    "halves_32:8_d128_bf16": dict(h=32, kv=8, d=128, rot=128, interleaved=False, dtype="bfloat16", t=3),
    "partial_4:2_d80_f32_rot32": dict(h=4, kv=2, d=80, rot=32, interleaved=False, dtype="float32", t=4, fused=True),
    "pairs_4:1_d64_bf16": dict(h=4, kv=1, d=64, rot=64, interleaved=True, dtype="bfloat16", t=6, fused=True),
    "pairs_partial_2:2_d96_f32_rot48": dict(h=2, kv=2, d=96, rot=48, interleaved=True, dtype="float32", t=2),
    "none_4:4_d64_f32": dict(h=4, kv=4, d=64, rot=0, interleaved=False, dtype="float32", t=3, fused=True),
    "partial_6:2_d80_bf16_rot32_flat_cos": dict(h=6, kv=2, d=80, rot=32, interleaved=False, dtype="bfloat16", t=7,
                                                fused=True, flat=True),
    "halves_8:2_d128_f16": dict(h=8, kv=2, d=128, rot=128, interleaved=False, dtype="float16", t=4, fused=True),
    # qwen3's q/k norms before the rotation
    "normed_halves_16:8_d128_bf16": dict(h=16, kv=8, d=128, rot=128, interleaved=False, dtype="bfloat16", t=3,
                                         fused=True, norm=True),
    "normed_partial_4:2_d80_f32_rot32": dict(h=4, kv=2, d=80, rot=32, interleaved=False, dtype="float32", t=4,
                                             norm=True),
}
EPS = 1e-6
BLOCK_SIZE = 16


def _rotate64(x, cos, sin, interleaved: bool):
    """transformers' rotary in float64 (exact for these inputs up to the last rounding): the oracle."""
    from engine_builder.runner.torch_backend.rope_tables import apply_rotary

    if cos is None:
        return x.double()
    return apply_rotary(x.double(), cos.double(), sin.double(), interleaved)


def run_case(spec: dict, seed: int, device: str = "cpu") -> dict:
    """Random q/k/v and cos/sin rows, NaN-poisoned pools, shuffled slots; made on the CPU, run on DEVICE. Returns
    the largest error in units of the dtype's last place, and what was written where."""
    import torch

    from engine_builder.runner.torch_backend.device_kv_attention import rotary_write_ref
    from engine_builder.runner.torch_backend.rotary_kv_write_triton import rotary_write_triton

    gen = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, spec["dtype"])
    heads, kv_heads, head_dim, rot, tokens = spec["h"], spec["kv"], spec["d"], spec["rot"], spec["t"]
    fused = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen).to(dtype)
    q, k, v = fused.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k, v = q.unflatten(-1, (heads, head_dim)), k.unflatten(-1, (kv_heads, head_dim)), \
        v.unflatten(-1, (kv_heads, head_dim))
    # qwen3: per-head weights around 1 (its checkpoints' q/k norm weights are O(1))
    norms = [(torch.rand(head_dim, generator=gen) + 0.5).to(dtype) for _ in range(2)] if spec.get("norm") else \
        [None, None]
    angles = torch.rand(tokens, 1, rot, generator=gen) * 6.3
    cos, sin = (angles.cos().to(dtype), angles.sin().to(dtype)) if rot else (None, None)
    num_blocks = -(-tokens // BLOCK_SIZE) + 3
    pools = [torch.full((num_blocks, BLOCK_SIZE, kv_heads, head_dim), float("nan"), dtype=dtype) for _ in range(4)]
    slots = torch.randperm(num_blocks * BLOCK_SIZE, generator=gen)[:tokens]

    def on(t):
        return None if t is None else t.to(device)

    args = [on(fused), on(cos), on(sin), [on(p) for p in pools], on(slots)]
    fused_d, cos_d, sin_d, (k_pool, v_pool, k_ref, v_ref), slots_d = args
    views = [t.to(device) for t in (q, k, v)] if not spec.get("fused") else [
        t.unflatten(-1, (-1, head_dim)) for t in fused_d.split([heads * head_dim, kv_heads * head_dim,
                                                                kv_heads * head_dim], dim=-1)]
    # the model's cos/sin are cos_sin's [tokens, 1, rot]; the kernel also takes them flat
    flat = (cos_d[:, 0], sin_d[:, 0]) if rot and spec.get("flat") else (cos_d, sin_d)
    normed = dict(q_norm=on(norms[0]), k_norm=on(norms[1]), norm_eps=EPS)
    got_q = rotary_write_triton(*views, *flat, k_pool, v_pool, slots_d, interleaved=spec["interleaved"], **normed)
    ref_q = rotary_write_ref(*views, cos_d, sin_d, k_ref, v_ref, slots_d, interleaved=spec["interleaved"], **normed)

    def ulps(got, want64):
        """|got - want| over the spacing of the dtype at want: a correctly rounded result is within 0.5."""
        spacing = torch.finfo(dtype).eps * torch.exp2(torch.floor(torch.log2(want64.abs().clamp_min(1e-30))))
        return float(((got.double().cpu() - want64) / spacing).abs().max())

    def rel(got, want):
        want = want.double().cpu()
        return float((got.double().cpu() - want).norm() / want.norm())

    k_slots, v_slots = (p.view(-1, kv_heads, head_dim).cpu() for p in (k_pool, v_pool))
    untouched = torch.ones(num_blocks * BLOCK_SIZE, dtype=torch.bool)
    untouched[slots] = False
    if spec.get("norm"):  # the oracle rotates the heads as llama's RMSNorm rounds them to the dtype
        from engine_builder.formats.model_config import NormSpec
        from engine_builder.runner.torch_backend.layers import NormWeights, norm

        q, k = (norm(x, NormWeights(w), NormSpec(eps=EPS)) for x, w in ((q, norms[0]), (k, norms[1])))
    q64, k64 = _rotate64(q, cos, sin, spec["interleaved"]), _rotate64(k, cos, sin, spec["interleaved"])
    return {
        "q_ulps": ulps(got_q, q64), "k_ulps": ulps(k_slots[slots], k64),
        "q_rel": rel(got_q, q64), "k_rel": rel(k_slots[slots], k64),
        "v_equal": bool(torch.equal(v_slots[slots], v)),
        "rest_untouched": bool(k_slots[untouched].isnan().all() and v_slots[untouched].isnan().all()),
        # against the reference, which rounds as transformers does (each product, then the sum)
        "q_vs_ref_rel": rel(got_q, ref_q),
        "k_vs_ref_rel": rel(k_slots[slots], k_ref.view(-1, kv_heads, head_dim)[slots]),
    }


def child_main() -> None:
    from engine_builder.runner.torch_backend import rotary_kv_write_triton as rkw

    report_cases(rkw._rotary_write_kernel, CASES, run_case)


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_interpreted(__file__)


def _check(got: dict, spec: dict) -> None:
    """16-bit: every channel within one unit in the last place of the exact rotation (float32 arithmetic rounded
    once is within 0.5 and a hair); float32: the error of float32 arithmetic, whose products and sum each round
    (a cancelling sum has no bound in units of its own last place, so the norm); either within the reference's
    own rounding of transformers' order; values copied bit for bit; no slot but the step's written."""
    assert got["v_equal"] and got["rest_untouched"], got
    if not spec["rot"]:
        assert got["q_ulps"] == got["k_ulps"] == 0.0, "no rotary: q and k must be copied exactly"
    elif spec["dtype"] != "float32":
        assert got["q_ulps"] <= 1.0 and got["k_ulps"] <= 1.0, got
    else:
        assert got["q_rel"] < 1e-6 and got["k_rel"] < 1e-6, got
    # two roundings of the same products (one rounding, against transformers' three), ~2^-8 and ~2^-11 of the norm
    tolerance = {"bfloat16": 6e-3, "float16": 8e-4, "float32": 1e-6}[spec["dtype"]]
    assert got["q_vs_ref_rel"] < tolerance and got["k_vs_ref_rel"] < tolerance, got


@pytest.mark.parametrize("name", list(CASES))
def test_matches_exact_rotary_in_interpreter(interpreted, name):
    _check(interpreted[name], CASES[name])


@pytest.mark.parametrize("name", list(CASES))
def test_matches_exact_rotary_on_cuda(name):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (the interpreter cases above run the same checks on the CPU)")
    _check(run_case(CASES[name], list(CASES).index(name), "cuda"), CASES[name])


@pytest.mark.parametrize("const", [
    dict(dtype="bf16", HEADS=9, HEAD_DIM=64, ROT_DIM=64, INTERLEAVED=False, NORM=False),
    dict(dtype="bf16", HEADS=32, HEAD_DIM=128, ROT_DIM=64, INTERLEAVED=True, NORM=False),
    dict(dtype="fp32", HEADS=4, HEAD_DIM=80, ROT_DIM=0, INTERLEAVED=False, NORM=False),
    dict(dtype="bf16", HEADS=16, HEAD_DIM=128, ROT_DIM=128, INTERLEAVED=False, NORM=True),
], ids=["halves_d64", "pairs_partial_d128", "none_d80_f32", "normed_halves_d128"])
def test_builds_for_hopper(const):
    """The interpreter takes what the GPU compiler may refuse (types, shapes): the kernel must build for sm_90."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from engine_builder.runner.torch_backend import rotary_kv_write_triton as rkw

    fn = rkw._rotary_write_kernel
    dtype = const.pop("dtype")
    const["HEAD_DIM_PAD"] = triton.next_power_of_2(const["HEAD_DIM"])
    sig = {n: "constexpr" if n in const else "*i64" if n == "slots_ptr" else "*" + dtype if n.endswith("_ptr")
           else "fp32" if n == "eps" else "i32" for n in fn.arg_names}
    kernel = triton.compile(ASTSource(fn, sig, constexprs=const), target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": 1})
    assert kernel.asm["cubin"], "no cubin"


if __name__ == "__main__":
    child_main()

"""paged_attention_triton against paged_attention_ref on the CPU (Triton's interpreter), and its sm_90 build.

The interpreter cases run in a child process with TRITON_INTERPRET=1, this file being the child's script
(tests/triton_interpreter.py says why); each parametrized test reads its case from the child's JSON line. The
host-synchronization and sm_90 build tests run in pytest's own process, on the compiled (not interpreted)
kernels, with no GPU; where a CUDA device is, the same cases run compiled on it too (benchmarks/gpu_run.sh's
`tests` part).

Runtime on 2 shared cores: about 15 s (10 s the child, 4 s the four sm_90 builds).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from triton_interpreter import report_cases, run_interpreted

triton = pytest.importorskip("triton", reason="triton is not installed (the `test` extra brings it)")

# name -> heads, kv_heads, head_dim, dtype, context_lens, query_lens, and options: window, softcap; splits (forced
# num_splits; absent, choose_splits decides, and expect_split says what it decides with the CPU's stand-in of 132
# multiprocessors: under 2 x 132 programs, one split per 2 key tiles of the table's width); tail (trailing q rows
# no sequence owns); fused_q (q a strided view of a fused projection); int64 (64-bit metadata, as ModelInput
# holds it); q_gain (sharper scores, so soft-capping bites)
CASES: dict[str, dict] = {
    # a table 8 blocks wide: 4 float32 key tiles of 32, 2 splits
    "decode_9:3_d64_f32": dict(h=9, kv=3, d=64, dtype="float32", ctx=[1, 17, 100, 33, 64], q=[1, 1, 1, 1, 1],
                               expect_split=True),
    # 17 blocks wide: 5 bf16 key tiles of 64 at head_dim 128, 2 splits
    "decode_4:1_d128_bf16": dict(h=4, kv=1, d=128, dtype="bfloat16", ctx=[1, 17, 100, 33, 250], q=[1, 1, 1, 1, 1],
                                 expect_split=True),
    # 8 blocks wide: one key tile of 128 at head_dim 64, nothing to split
    "decode_1:1_d64_bf16_padding_row": dict(h=4, kv=4, d=64, dtype="bfloat16", ctx=[17, 0, 100, 1], q=[1, 0, 1, 1],
                                            tail=2, int64=True, expect_split=False),
    "decode_8:1_d64_bf16_split5": dict(h=8, kv=1, d=64, dtype="bfloat16", ctx=[200, 5, 64], q=[1, 1, 1], splits=5),
    "mixed_9:3_d128_bf16": dict(h=9, kv=3, d=128, dtype="bfloat16", ctx=[40, 7, 0, 60, 1], q=[1, 7, 0, 20, 1],
                                tail=3, fused_q=True, expect_split=False),
    "mixed_4:1_d64_f32_window": dict(h=4, kv=1, d=64, dtype="float32", ctx=[100, 50, 17], q=[1, 12, 5], window=16,
                                     expect_split=True),
    "prefill_1:1_d128_f32": dict(h=2, kv=2, d=128, dtype="float32", ctx=[37, 90], q=[37, 1], expect_split=True),
    "softcap_9:3_d64_bf16": dict(h=9, kv=3, d=64, dtype="bfloat16", ctx=[33, 80, 3], q=[1, 9, 3], softcap=5.0,
                                 q_gain=4.0, expect_split=False),
    "split3_9:3_d64_bf16_window_softcap": dict(h=9, kv=3, d=64, dtype="bfloat16", ctx=[260, 90, 1], q=[1, 4, 1],
                                               window=40, softcap=10.0, q_gain=3.0, splits=3),
    "split4_4:1_d128_f32_prefill": dict(h=4, kv=1, d=128, dtype="float32", ctx=[300, 17, 129, 0], q=[1, 1, 6, 0],
                                        splits=4, tail=1),
}
TOLERANCE = {"float32": 1e-4, "bfloat16": 1e-2}
BLOCK_SIZE = 16


def run_case(spec: dict, seed: int, device: str = "cpu") -> dict:
    """Random pools (NaN wherever no sequence holds a position), shuffled block tables, NaN-poisoned out; made on
    the CPU (the same numbers on any device), run on device."""
    import torch

    from engine_builder.runner.torch_backend import paged_attention_triton as pat
    from engine_builder.runner.torch_backend.device_kv_attention import paged_attention_ref

    gen = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, spec["dtype"])
    heads, kv_heads, head_dim = spec["h"], spec["kv"], spec["d"]
    ctx, q_lens = spec["ctx"], spec["q"]
    need = [-(-c // BLOCK_SIZE) for c in ctx]
    width = max(need) + 1
    num_blocks = sum(need) + 4
    k_pool = torch.full((num_blocks, BLOCK_SIZE, kv_heads, head_dim), float("nan"), dtype=dtype)
    v_pool = torch.full_like(k_pool, float("nan"))
    # block 0 is never handed out: table entries past a sequence's blocks point at it, all NaN
    order = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    tables = torch.zeros(len(ctx), width, dtype=torch.int64 if spec.get("int64") else torch.int32)
    for s, n in enumerate(need):
        tables[s, :n] = torch.tensor(order[:n])
        order = order[n:]
        blocks = tables[s, :n].long()
        keys = torch.randn(n * BLOCK_SIZE, kv_heads, head_dim, generator=gen)[: ctx[s]]
        values = torch.randn(n * BLOCK_SIZE, kv_heads, head_dim, generator=gen)[: ctx[s]]
        slots = blocks.repeat_interleave(BLOCK_SIZE)[: ctx[s]] * BLOCK_SIZE + torch.arange(ctx[s]) % BLOCK_SIZE
        k_pool.view(-1, kv_heads, head_dim)[slots] = keys.to(dtype)
        v_pool.view(-1, kv_heads, head_dim)[slots] = values.to(dtype)
    meta = torch.int64 if spec.get("int64") else torch.int32
    query_start = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=meta)
    context_lens = torch.tensor(ctx, dtype=meta)
    owned = int(query_start[-1])
    tokens = owned + spec.get("tail", 0)
    q = torch.randn(tokens, heads, head_dim, generator=gen) * spec.get("q_gain", 1.0)
    # fused_q: q as the first part of a [tokens, (heads + 2 kv_heads) * head_dim] projection (moved whole: a
    # strided view would arrive contiguous)
    fused = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen)
    fused[:, : heads * head_dim] = q.reshape(tokens, -1)
    fused, k_pool, v_pool, tables, context_lens, query_start = (
        t.to(device) for t in (fused.to(dtype), k_pool, v_pool, tables, context_lens, query_start))
    q = fused[:, : heads * head_dim].view(tokens, heads, head_dim)
    if not spec.get("fused_q"):
        q = q.contiguous()
    out = torch.full_like(q, float("nan"), memory_format=torch.contiguous_format)
    kwargs = dict(scale=head_dim**-0.5, softcap=spec.get("softcap"), sliding_window=spec.get("window"))

    plans = []
    original = pat.launch_plan

    def recording(*args, **kwargs):  # the launch's plan: more than one split is the split-K path
        plans.append(original(*args, **kwargs))
        return plans[-1]

    pat.launch_plan = recording
    try:
        pat.paged_attention_triton(q, k_pool, v_pool, tables, context_lens, query_start, max_query_len=max(q_lens),
                                   out=out, num_splits=spec.get("splits"), **kwargs)
    finally:
        pat.launch_plan = original
    counters = pat._COUNTERS.get(q.device)
    ref = paged_attention_ref(q, k_pool, v_pool, tables, context_lens, query_start, **kwargs)
    got, want = out[:owned].double().cpu(), ref[:owned].double().cpu()
    return {"rel_err": float((got - want).norm() / want.norm()), "unwritten": int(got.isnan().sum()),
            "tail_untouched": bool(out[owned:].isnan().all().cpu()), "split": plans[0].num_splits > 1,
            # the last split of each tile resets its counter: the next launch (a graph's replay) starts from zero
            "counters_zero": counters is None or not bool(counters.any().cpu())}


def child_main() -> None:
    from engine_builder.runner.torch_backend import paged_attention_triton as pat

    report_cases(pat._paged_attention_kernel, CASES, run_case)


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_interpreted(__file__)


def _check(got: dict, spec: dict) -> None:
    assert got["unwritten"] == 0, f"{got['unwritten']} owned output elements left NaN (or NaN read from the pool)"
    assert got["tail_untouched"], "rows of q that no sequence owns were written"
    assert got["rel_err"] < TOLERANCE[spec["dtype"]], got
    assert got["counters_zero"], "a split launch left its counters non-zero: the next one would miscount"
    if (spec.get("splits") or 1) > 1:
        assert got["split"], "the forced split-K path did not run"
    elif "expect_split" in spec:
        assert got["split"] == spec["expect_split"], "choose_splits changed its mind on this batch"


@pytest.mark.parametrize("name", list(CASES))
def test_matches_reference_in_interpreter(interpreted, name):
    _check(interpreted[name], CASES[name])


@pytest.mark.parametrize("name", list(CASES))
def test_matches_reference_on_cuda(name):
    """The compiled kernel (tensor cores, cp.async, the real tl.dot shapes) on the same cases, where a GPU is."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (the interpreter cases above run the same checks on the CPU)")
    spec = CASES[name]
    if spec.get("expect_split") is not None:  # the heuristic reads this GPU's multiprocessors, not the H200's 132
        from engine_builder.runner.torch_backend import paged_attention_triton as pat

        if pat._sm_count(torch.device("cuda")) != pat.KERNEL_DEFAULT_SMS:
            spec = {k: v for k, v in spec.items() if k != "expect_split"}
    _check(run_case(spec, list(CASES).index(name), "cuda"), spec)


@pytest.mark.parametrize("group, head_dim, element_size", [(3, 64, 2), (4, 128, 2), (1, 64, 2), (7, 64, 2), (3, 64, 4)])
def test_the_warm_ups_query_lengths_take_every_tile(group, head_dim, element_size):
    from engine_builder.runner.torch_backend.paged_attention_triton import choose_tile, tile_queries

    every = {choose_tile(group, head_dim, q, element_size) for q in range(1, 1025)}
    chosen = tile_queries(group, head_dim, 1024, element_size)
    assert {choose_tile(group, head_dim, q, element_size) for q in chosen} == every and len(chosen) == len(every)
    assert chosen[0] == 1 and (len(every) > 1) == (element_size == 2)  # 16-bit pools: decode, verify, prefill tiles


def test_the_step_varying_ints_are_named_as_the_kernels_name_them():
    """Triton ignores a do_not_specialize name that is no argument: a typo would specialize again, silently."""
    from engine_builder.runner.torch_backend import paged_attention_triton as pat

    kernel = pat._paged_attention_kernel
    assert {p.name for p in kernel.params if p.do_not_specialize} == {"num_splits", "num_tokens", "stride_bt"}


# name -> sequences, kv heads, heads, head_dim, table width in blocks, query lengths, splits, replays, options
RACES = {
    "decode_64x8_split8": (64, 8, 32, 128, 40, [1] * 64, 8, 50, {}),
    "decode_4x8_split32": (4, 8, 32, 128, 200, [1] * 4, 32, 100, {}),
    "padding_rows_split16": (8, 2, 8, 64, 64, [1, 0, 1, 0, 1, 1, 0, 1], 16, 50, {}),
    "prefill_tiles_split4_window_softcap": (3, 2, 6, 64, 30, [70, 0, 33], 4, 30,
                                            dict(sliding_window=100, softcap=30.0)),
}


@pytest.mark.parametrize("name", list(RACES))
def test_split_launches_replayed_from_a_cuda_graph_combine_every_tile_each_time(name):
    """The split path's combine is the last split of a tile to finish, found by a counter it resets: racy if the
    partials' stores were not visible to it, or if a counter were left non-zero for the next launch. A captured
    launch replays over a NaN-filled output, each replay equal bit for bit to the eager launch (the combine adds the
    splits in a fixed order) and every row within the reference's tolerance; the counters zero after."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the race needs programs that run at once (the interpreter runs them in turn)")
    from engine_builder.runner.torch_backend import paged_attention_triton as pat
    from engine_builder.runner.torch_backend.device_kv_attention import paged_attention_ref

    seqs, kv_heads, heads, head_dim, blocks, q_lens, splits, replays, options = RACES[name]
    gen = torch.Generator(device="cuda").manual_seed(list(RACES).index(name))
    k_pool = torch.randn(seqs * blocks + 1, BLOCK_SIZE, kv_heads, head_dim, device="cuda", dtype=torch.bfloat16,
                         generator=gen)
    v_pool = torch.randn(k_pool.shape, device="cuda", dtype=torch.bfloat16, generator=gen)
    tables = (torch.randperm(seqs * blocks, device="cuda", generator=gen) + 1).view(seqs, blocks).int()
    queries = torch.tensor(q_lens, device="cuda")
    lens = torch.maximum(torch.randint(1, blocks * BLOCK_SIZE + 1, (seqs,), device="cuda", generator=gen), queries)
    starts = torch.zeros(seqs + 1, dtype=torch.int64, device="cuda")
    starts[1:] = queries.cumsum(0)
    q = torch.randn(int(starts[-1]), heads, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    out = torch.empty_like(q)
    kwargs = dict(scale=head_dim**-0.5, max_query_len=max(q_lens), out=out, num_splits=splits, **options)
    pat.paged_attention_triton(q, k_pool, v_pool, tables, lens, starts, **kwargs)  # compiles outside the capture
    eager = out.clone()
    want = paged_attention_ref(q, k_pool, v_pool, tables, lens, starts, scale=head_dim**-0.5, **options).float()
    row_err = (eager.float() - want).abs().amax(-1) / want.abs().amax(-1).clamp_min(1e-3)
    assert float(row_err.max()) < TOLERANCE["bfloat16"]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        pat.paged_attention_triton(q, k_pool, v_pool, tables, lens, starts, **kwargs)
    differing = 0
    for _ in range(replays):
        out.fill_(float("nan"))
        graph.replay()
        differing += not torch.equal(out, eager)
    assert differing == 0, f"{differing} of {replays} replays differ from the eager launch"
    assert not bool(pat._COUNTERS[q.device].any()), "a counter was left non-zero"


def test_steps_of_any_token_count_or_table_width_share_one_compiled_variant():
    """The ints that change from step to step are not specialized on: decode batches of 1, 5 and 16 tokens over
    tables 3, 16 and 17 blocks wide compile the kernel once (each of them a compile of ~1 s mid-serving else)."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: Triton's JIT compiles on one (the interpreter specializes nothing)")
    from engine_builder.runner.torch_backend import paged_attention_triton as pat

    def variants() -> int:
        return sum(len(cache[0]) for cache in pat._paged_attention_kernel.device_caches.values())

    pool = torch.randn(64, 16, 3, 64, dtype=torch.bfloat16, device="cuda")
    before = None
    for seqs, width in ((1, 3), (5, 16), (16, 17), (5, 3)):
        q = torch.randn(seqs, 9, 64, dtype=torch.bfloat16, device="cuda")
        tables = torch.randint(1, 64, (seqs, width), dtype=torch.int32, device="cuda")
        lens = torch.full((seqs,), 16 * width - 5, dtype=torch.int32, device="cuda")
        starts = torch.arange(seqs + 1, dtype=torch.int32, device="cuda")
        pat.paged_attention_triton(q, pool, pool, tables, lens, starts, scale=0.125, max_query_len=1, num_splits=1)
        before = variants() if before is None else before
    torch.cuda.synchronize()
    assert variants() == before


def test_host_side_never_synchronizes(monkeypatch):
    """What CUDA-graph capture needs: the wrapper reads no device value (no .item(), .tolist(), bool(tensor)...)
    and sizes its grid from host ints only; the split's counters come from a buffer kept across calls (no memset
    kernel a step). The kernel is stubbed; every tensor -> host conversion raises."""
    import torch

    from engine_builder.runner.torch_backend import paged_attention_triton as pat

    launches = []

    class Stub:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append((self.name, grid, kwargs))

    monkeypatch.setattr(pat, "_paged_attention_kernel", Stub("attention"))
    monkeypatch.setattr(pat, "_sm_count", lambda device: 132)
    monkeypatch.setattr(pat, "_interpreted", lambda: True)  # CPU tensors stand in for CUDA ones
    q = torch.randn(5, 9, 64, dtype=torch.bfloat16)
    pool = torch.randn(40, 16, 3, 64, dtype=torch.bfloat16)
    tables = torch.zeros(4, 256, dtype=torch.int32)
    lens, starts = torch.tensor([5, 0, 3, 9]), torch.tensor([0, 1, 1, 2, 5])

    def refuse(*args, **kwargs):
        raise AssertionError("host synchronization")

    for method in ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, method, refuse)
    pat.paged_attention_triton(q, pool, pool, tables, lens, starts, scale=0.125, max_query_len=3)
    monkeypatch.undo()

    (name, grid, kw), = launches  # one launch: the last split of each tile combines (no second kernel)
    assert name == "attention"
    tile = pat.choose_tile(3, 64, 3)
    # 4 x 3 programs x 1 query tile is far under 2 x 132: the table's 256 blocks (32 key tiles of 128) allow 16 splits
    assert grid == (4 * 3, 1, 16) and (kw["BLOCK_M"], kw["BLOCK_Q"]) == (tile.block_m, tile.block_q) == (16, 5)
    assert kw["SPLIT"]


def _compile_sm90(**const):
    """The attention kernel built for sm_90 (H100/H200) by Triton's own ptxas, no GPU needed; its SASS."""
    import subprocess as sp
    import tempfile

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from engine_builder.runner.torch_backend import paged_attention_triton as pat

    fn = pat._paged_attention_kernel
    dtype = const.pop("dtype")
    tile = pat.choose_tile(const["GROUP"], const["HEAD_DIM"], const.pop("max_query_len"), 4 if dtype == "fp32" else 2)
    const.update(HEAD_DIM_PAD=tile.head_dim_pad, BLOCK_SIZE=16, BLOCK_M=tile.block_m, BLOCK_Q=tile.block_q,
                 BLOCK_N=tile.block_n, DOT_PRECISION="ieee" if dtype == "fp32" else "tf32")
    pointers = {"q_ptr": dtype, "k_ptr": dtype, "v_ptr": dtype, "out_ptr": dtype, "part_out_ptr": "fp32",
                "part_lse_ptr": "fp32", "counters_ptr": "i32", "block_tables_ptr": "i32", "context_lens_ptr": "i32",
                "query_start_ptr": "i32"}
    sig = {n: "constexpr" if n in const else "*" + pointers[n] if n in pointers else "fp32"
           if n in ("scale", "softcap") else "i32" for n in fn.arg_names}
    # what the JIT marks on a real launch: 16-byte aligned pointers, strides that are multiples of 16 (not the block
    # table's row stride: a step-varying int, never specialized on)
    step_ints = {p.name for p in fn.params if p.do_not_specialize}
    aligned = [n for n in fn.arg_names if n in pointers or n.startswith("stride_") and n not in step_ints]
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    kernel = triton.compile(ASTSource(fn, sig, constexprs=const, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": tile.num_warps, "num_stages": tile.num_stages})
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not cuobjdump.exists():
        pytest.skip(f"{cuobjdump} is missing (Triton's wheel ships it beside ptxas)")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        usage = sp.run([cuobjdump, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
        sass = sp.run([cuobjdump, "--dump-sass", f.name], capture_output=True, text=True).stdout
    return usage, sass


@pytest.mark.parametrize("variant", [
    dict(dtype="bf16", KV_HEADS=8, GROUP=4, HEAD_DIM=128, max_query_len=1, SPLIT=True, SOFTCAP=False, WINDOW=False),
    dict(dtype="bf16", KV_HEADS=3, GROUP=3, HEAD_DIM=64, max_query_len=1, SPLIT=False, SOFTCAP=False, WINDOW=False),
    dict(dtype="bf16", KV_HEADS=3, GROUP=3, HEAD_DIM=64, max_query_len=128, SPLIT=False, SOFTCAP=True, WINDOW=True),
    dict(dtype="fp32", KV_HEADS=2, GROUP=1, HEAD_DIM=128, max_query_len=64, SPLIT=False, SOFTCAP=False, WINDOW=False),
], ids=["decode_32:8_d128_split", "decode_9:3_d64", "prefill_9:3_d64_softcap_window", "prefill_f32_d128"])
def test_builds_for_hopper_without_spills(variant):
    """tl.dot's shape rules and register pressure are the GPU's, not the interpreter's (which takes any shape):
    the kernel must compile for sm_90, keep its tiles in registers (no local-memory stack) and, in bf16, use
    the tensor cores (HMMA, or wgmma's HGMMA for 64-row tiles), fed by cp.async (LDGSTS) pipelining."""
    bf16 = variant["dtype"] == "bf16"
    usage, sass = _compile_sm90(**variant)
    assert "STACK:0 " in usage and "LDL" not in sass, usage
    if bf16:
        assert "HMMA" in sass or "HGMMA" in sass, "no tensor-core instruction"
        assert "LDGSTS" in sass, "the key/value loads are not pipelined (no cp.async)"


if __name__ == "__main__":
    child_main()

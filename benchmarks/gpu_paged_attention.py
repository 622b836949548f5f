"""paged_attention_triton on CUDA: checked against gather + SDPA, and its bandwidth on the KV bytes it must read.

    python benchmarks/gpu_paged_attention.py [--json PATH] [--shapes smollm2 llama3-8b] [--batch 1 16 64]
                                             [--context 128 1024 4096] [--no-sweep] [--smoke]

bf16 decode (one query per sequence, every sequence at the same context) for SmolLM2 (9 heads / 3 kv heads,
head_dim 64) and Llama-3-8B (32 / 8, head_dim 128). Per row: the relative error against paged_attention_ref on
NaN-poisoned output; the kernel's time as a CUDA graph of R calls replayed (the way a decode step runs it, and the
proof it captures: the replay's output must equal the eager call's), each call on its own block table over its own
blocks of one pool, R chosen so the R calls read 4x the L2 (the median replay / R); GB/s on the KV bytes
(2 x context x kv_heads x head_dim x 2 bytes per sequence) and that over the device-to-device copy bandwidth
measured first (bytes read + written); the eager call (triton.testing.do_bench median, launch overhead included)
and the reference's time. With the sweep (default), every row is also timed at the other split counts its context
allows ("best" is the fastest and its fraction of copy), so one run says whether choose_splits picked well. Then
a correctness suite off the decode path: ragged contexts, chunked-prefill and verify queries mixed with decode, a
zero-query padding row, sliding window, soft-cap, forced split-K, float32 pools (bounds: bf16 1e-2, float32
1e-4). A compact table comes last; --json writes everything. Exit code 1 if any check failed.

--smoke runs on the CPU through Triton's interpreter (TRITON_INTERPRET=1, set before the kernel module is
imported): tiny sizes, correctness only, so the script can be checked before GPU time is spent on it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = {"smollm2": (9, 3, 64), "llama3-8b": (32, 8, 128)}  # heads, kv_heads, head_dim
BLOCK_SIZE = 16
TOLERANCE = {"bfloat16": 1e-2, "float32": 1e-4}
TARGET = 0.70  # of the copy bandwidth, at batch >= 16 and context >= 1000
DEVICE = "cuda"
# off the decode path: context_lens, query_lens, options (None: the heuristic's split count)
SUITE = [
    dict(name="mixed", ctx=[1000, 7, 500, 0, 300, 1], q=[1, 7, 33, 0, 200, 1]),
    dict(name="mixed_window_softcap", ctx=[1000, 7, 500, 0, 300, 1], q=[1, 7, 33, 0, 200, 1], window=256,
         softcap=2.0),  # a cap near the scores' own spread (random q, k: about 1), so tanh bends them
    dict(name="decode_split4_ragged", ctx=[4000, 17, 1, 129], q=[1, 1, 1, 1], splits=4),
    dict(name="verify_split3_window", ctx=[3000, 600, 64], q=[5, 5, 5], window=512, splits=3),
    dict(name="float32_mixed", ctx=[700, 33, 0, 90], q=[1, 33, 0, 17], dtype="float32"),
]
SMOKE_SUITE = [
    dict(name="mixed", ctx=[40, 7, 0, 30, 1], q=[1, 7, 0, 20, 1]),
    dict(name="mixed_window_softcap", ctx=[40, 7, 0, 30, 1], q=[1, 7, 0, 20, 1], window=16, softcap=5.0),
    dict(name="decode_split4_ragged", ctx=[200, 17, 1, 129], q=[1, 1, 1, 1], splits=4),
    dict(name="float32_mixed", ctx=[70, 33, 0, 9], q=[1, 33, 0, 5], dtype="float32"),
]


@dataclass
class Batch:
    q: object  # [tokens, heads, head_dim]
    k_pool: object  # [num_blocks, BLOCK_SIZE, kv_heads, head_dim]
    v_pool: object
    tables: list  # R x [seqs, width] int32, each over its own blocks of the pool
    context_lens: object  # [seqs] int32
    query_start: object  # [seqs + 1] int32
    ctx: list[int]
    q_lens: list[int]


def make_batch(torch, shape, dtype, ctx, q_lens, rotations, device, seed, poison=False) -> Batch:
    """Random pools; R block tables drawing disjoint shuffled blocks; with poison, NaN wherever no sequence holds
    a position (past its context in its last block, and block 0, where table entries past its blocks point)."""
    heads, kv_heads, head_dim = shape
    gen = torch.Generator(device=device).manual_seed(seed)
    need = [-(-c // BLOCK_SIZE) for c in ctx]
    width = max(1, max(need))
    per_rotation = sum(need)
    num_blocks = rotations * per_rotation + 1
    k_pool = torch.randn(num_blocks, BLOCK_SIZE, kv_heads, head_dim, device=device, dtype=dtype, generator=gen)
    v_pool = torch.randn(num_blocks, BLOCK_SIZE, kv_heads, head_dim, device=device, dtype=dtype, generator=gen)
    order = torch.randperm(num_blocks - 1, device=device, generator=gen) + 1
    tables = []
    for r in range(rotations):
        table = torch.zeros(len(ctx), width, dtype=torch.int32, device=device)
        mine = order[r * per_rotation:(r + 1) * per_rotation]
        at = 0
        for s, n in enumerate(need):
            table[s, :n] = mine[at:at + n].to(torch.int32)
            at += n
            if poison and n:
                tail = table[s, n - 1].long() * BLOCK_SIZE + torch.arange(ctx[s] - (n - 1) * BLOCK_SIZE, BLOCK_SIZE,
                                                                          device=device)
                k_pool.view(-1, kv_heads, head_dim)[tail] = float("nan")
                v_pool.view(-1, kv_heads, head_dim)[tail] = float("nan")
        tables.append(table)
    if poison:
        k_pool[0] = float("nan")
        v_pool[0] = float("nan")
    starts = [0]
    for n in q_lens:
        starts.append(starts[-1] + n)
    q = torch.randn(starts[-1], heads, head_dim, device=device, dtype=dtype, generator=gen)
    return Batch(q=q, k_pool=k_pool, v_pool=v_pool, tables=tables,
                 context_lens=torch.tensor(ctx, dtype=torch.int32, device=device),
                 query_start=torch.tensor(starts, dtype=torch.int32, device=device), ctx=list(ctx), q_lens=list(q_lens))


def check(torch, pat, ref_fn, batch: Batch, r=0, **opts) -> dict:
    """The kernel on rotation r into a NaN-poisoned out, against the reference: relative error, unwritten count."""
    head_dim = batch.q.shape[-1]
    kwargs = dict(scale=head_dim**-0.5, softcap=opts.get("softcap"), sliding_window=opts.get("window"))
    out = torch.full_like(batch.q, float("nan"))
    pat.paged_attention_triton(batch.q, batch.k_pool, batch.v_pool, batch.tables[r], batch.context_lens,
                               batch.query_start, max_query_len=max(batch.q_lens), out=out,
                               num_splits=opts.get("splits"), **kwargs)
    ref = ref_fn(batch.q, batch.k_pool, batch.v_pool, batch.tables[r], batch.context_lens, batch.query_start, **kwargs)
    if batch.q.is_cuda:
        torch.cuda.synchronize()  # a launch error surfaces here, not three rows later
    got, want = out.double(), ref.double()
    return {"rel_err": float((got - want).norm() / want.norm()), "unwritten": int(got.isnan().sum()), "out": out}


def copy_bandwidth(torch) -> float:
    """Device-to-device copy of 2 GiB, bytes read + written over the median of 10 timed copies (GB/s)."""
    src = torch.randint(0, 1 << 15, (1 << 30,), dtype=torch.int16, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    gbps = 2 * src.numel() * src.element_size() / statistics.median(times) / 1e9
    del src, dst
    torch.cuda.empty_cache()
    return gbps


def graph_time(torch, pat, batch: Batch, outs: list, splits, reps=30) -> tuple[float, bool]:
    """Seconds per call as a captured graph of one call per rotation (median over replays), and whether the
    replay wrote what an eager call writes (bitwise: same kernels, same inputs)."""
    head_dim = batch.q.shape[-1]

    def call(r):
        pat.paged_attention_triton(batch.q, batch.k_pool, batch.v_pool, batch.tables[r], batch.context_lens,
                                   batch.query_start, scale=head_dim**-0.5, max_query_len=1, out=outs[r],
                                   num_splits=splits)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (compiles) off the capture stream, as torch's graph docs ask
        for r in range(len(outs)):
            call(r)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    eager = outs[0].clone()
    outs[0].fill_(float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for r in range(len(outs)):
            call(r)
    graph.replay()
    torch.cuda.synchronize()
    same = bool(torch.equal(outs[0], eager))
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / len(outs))
    del graph
    return statistics.median(times), same


def decode_row(torch, triton, pat, ref_fn, name, shape, batch_size, context, copy_gbps, l2_bytes, sweep, seed):
    heads, kv_heads, head_dim = shape
    kv_bytes = pat.kv_bytes_read([context] * batch_size, kv_heads, head_dim, 2)
    rotations = max(2, min(64, -(-4 * l2_bytes // kv_bytes)))
    batch = make_batch(torch, shape, torch.bfloat16, [context] * batch_size, [1] * batch_size, rotations, DEVICE, seed)
    checked = check(torch, pat, ref_fn, batch)
    plan = pat.launch_plan(batch_size, kv_heads, heads // kv_heads, head_dim, 2, BLOCK_SIZE, batch.tables[0].shape[1],
                           1, sms=pat._sm_count(batch.q.device))
    auto = plan.num_splits
    outs = [torch.empty_like(batch.q) for _ in range(rotations)]
    seconds, same = graph_time(torch, pat, batch, outs, None)
    timed = {auto: seconds}
    if sweep:  # every split count the context allows (2 key tiles a split at least): data to tune choose_splits
        most = max(1, -(-context // plan.tile.block_n) // pat.KERNEL_MIN_TILES_PER_SPLIT)
        for splits in [n for n in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32) if n <= most and n != auto]:
            timed[splits] = graph_time(torch, pat, batch, outs, splits)[0]

    counter = iter(range(1 << 30))

    def eager():
        r = next(counter) % rotations
        pat.paged_attention_triton(batch.q, batch.k_pool, batch.v_pool, batch.tables[r], batch.context_lens,
                                   batch.query_start, scale=head_dim**-0.5, max_query_len=1, out=outs[r])

    eager_s = triton.testing.do_bench(eager, warmup=25, rep=100, return_mode="median") / 1e3

    def reference():
        ref_fn(batch.q, batch.k_pool, batch.v_pool, batch.tables[0], batch.context_lens, batch.query_start,
               scale=head_dim**-0.5)

    ref_s = triton.testing.do_bench(reference, warmup=25, rep=200, return_mode="median") / 1e3
    best = min(timed, key=timed.get)
    row = {"shape": name, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "batch": batch_size,
           "context": context, "kv_bytes": kv_bytes, "rotations": rotations, "splits": auto,
           "rel_err": checked["rel_err"], "unwritten": checked["unwritten"], "graph_replay_matches": same,
           "us": seconds * 1e6, "gbps": kv_bytes / seconds / 1e9, "frac_copy": kv_bytes / seconds / 1e9 / copy_gbps,
           "sweep_us": {str(k): v * 1e6 for k, v in sorted(timed.items())}, "best_splits": best,
           "best_frac_copy": kv_bytes / timed[best] / 1e9 / copy_gbps, "eager_us": eager_s * 1e6,
           "ref_us": ref_s * 1e6, "speedup_vs_ref": ref_s / seconds,
           "ok": checked["rel_err"] < TOLERANCE["bfloat16"] and checked["unwritten"] == 0 and same}
    del batch, outs
    torch.cuda.empty_cache()
    return row


def suite_rows(torch, pat, ref_fn, shapes, device, cases) -> list[dict]:
    rows = []
    for seed, (name, shape) in enumerate(shapes.items()):
        for case in cases:
            dtype = case.get("dtype", "bfloat16")
            batch = make_batch(torch, shape, getattr(torch, dtype), case["ctx"], case["q"], 1, device, 100 + seed,
                               poison=True)
            got = check(torch, pat, ref_fn, batch, **case)
            rows.append({"shape": name, "case": case["name"], "dtype": dtype, "rel_err": got["rel_err"],
                         "unwritten": got["unwritten"],
                         "ok": got["rel_err"] < TOLERANCE[dtype] and got["unwritten"] == 0})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--batch", nargs="+", type=int, default=[1, 16, 64])
    ap.add_argument("--context", nargs="+", type=int, default=[128, 1024, 4096])
    ap.add_argument("--no-sweep", action="store_true", help="time only the heuristic's split count")
    ap.add_argument("--smoke", action="store_true", help="CPU, Triton's interpreter, tiny sizes, correctness only")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # triton.jit reads it when the kernel module is imported, below

    import torch
    import triton
    import triton.testing

    from engine_builder.runner.torch_backend import paged_attention_triton as pat
    from engine_builder.runner.torch_backend.device_kv_attention import paged_attention_ref

    shapes = {name: SHAPES[name] for name in args.shapes}
    result = {"torch": torch.__version__, "triton": triton.__version__, "smoke": args.smoke}
    decode = []
    if args.smoke:
        pat.patch_triton_interpreter()
        device = "cpu"
        result["device"] = "cpu (Triton interpreter)"
        for seed, (name, shape) in enumerate(shapes.items()):
            for batch_size, context in ((1, 17), (2, 40), (3, 100)):
                batch = make_batch(torch, shape, torch.bfloat16, [context] * batch_size, [1] * batch_size, 1,
                                   device, seed, poison=True)
                got = check(torch, pat, paged_attention_ref, batch)
                decode.append({"shape": name, "batch": batch_size, "context": context, "rel_err": got["rel_err"],
                               "unwritten": got["unwritten"],
                               "ok": got["rel_err"] < TOLERANCE["bfloat16"] and got["unwritten"] == 0})
        suite = suite_rows(torch, pat, paged_attention_ref, shapes, device, SMOKE_SUITE)
    else:
        if not torch.cuda.is_available():
            print("no CUDA device: run with --smoke for the CPU check", file=sys.stderr)
            return 2
        props = torch.cuda.get_device_properties(0)
        l2_bytes = getattr(props, "L2_cache_size", 60 << 20)
        result.update(device=props.name, sms=props.multi_processor_count, l2_mb=l2_bytes / 2**20)
        print(f"{props.name}: {props.multi_processor_count} SMs, L2 {l2_bytes / 2**20:.0f} MiB, torch "
              f"{torch.__version__}, triton {triton.__version__}", flush=True)
        copy_gbps = copy_bandwidth(torch)
        result["copy_gbps"] = copy_gbps
        print(f"device-to-device copy: {copy_gbps:.0f} GB/s (read + written)", flush=True)
        for seed, (name, shape) in enumerate(shapes.items()):
            for batch_size in args.batch:
                for context in args.context:
                    row = decode_row(torch, triton, pat, paged_attention_ref, name, shape, batch_size, context,
                                     copy_gbps, l2_bytes, not args.no_sweep, seed)
                    decode.append(row)
                    print(f"  {name} B={batch_size} ctx={context}: {row['us']:.1f} us, {row['frac_copy']:.0%} of "
                          f"copy, err {row['rel_err']:.1e}, sweep {row['sweep_us']}", flush=True)
        suite = suite_rows(torch, pat, paged_attention_ref, shapes, DEVICE, SUITE)
    result["decode"] = decode
    result["suite"] = suite

    print()
    if args.smoke:
        print(f"{'shape':10} {'B':>3} {'ctx':>5} {'rel_err':>8} ok")
        for r in decode:
            print(f"{r['shape']:10} {r['batch']:3d} {r['context']:5d} {r['rel_err']:8.1e} {r['ok']}")
    else:
        print(f"{'shape':10} {'B':>3} {'ctx':>5} {'split':>5} {'rel_err':>8} {'us':>8} {'GB/s':>6} {'copy':>5} "
              f"{'best':>9} {'eager_us':>8} {'ref_us':>8} {'x_ref':>6} ok")
        for r in decode:
            best = f"{r['best_splits']}:{r['best_frac_copy']:.0%}"
            print(f"{r['shape']:10} {r['batch']:3d} {r['context']:5d} {r['splits']:5d} {r['rel_err']:8.1e} "
                  f"{r['us']:8.1f} {r['gbps']:6.0f} {r['frac_copy']:5.0%} {best:>9} {r['eager_us']:8.1f} "
                  f"{r['ref_us']:8.0f} {r['speedup_vs_ref']:6.1f} {r['ok']}")
        target = [r for r in decode if r["batch"] >= 16 and r["context"] >= 1000]
        met = [r for r in target if r["frac_copy"] >= TARGET]
        result["target"] = {"rows": len(target), "met": len(met), "fraction": TARGET}
        print(f"target >= {TARGET:.0%} of copy at B >= 16, ctx >= 1000: {len(met)}/{len(target)} rows "
              f"(copy {copy_gbps:.0f} GB/s)")
    print(f"{'suite case':32} {'shape':10} {'dtype':9} {'rel_err':>8} ok")
    for r in suite:
        print(f"{r['case']:32} {r['shape']:10} {r['dtype']:9} {r['rel_err']:8.1e} {r['ok']}")
    failed = [r for r in decode + suite if not r["ok"]]
    print(f"{len(decode) + len(suite) - len(failed)} passed, {len(failed)} failed")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

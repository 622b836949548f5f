"""All-reduce bandwidth at a decode step's message sizes, and the per-token collective cost of tp=2 (and tp=4).

    .venv/bin/python benchmarks/collectives.py [--backend gloo|nccl] [--world-size 2] [--no-decode] [--json]
        [--model smollm2|tiny] [--engines DIR [--save-engines]]
    torchrun --nproc-per-node 2 benchmarks/collectives.py --backend nccl --no-decode   (ranks from torchrun)

1. all-reduce (torch.distributed, sum) of the messages a tp decode step sends: hidden x batch activations
   (hidden 64 = the tests' tiny llama, 576 = SmolLM2-135M, 4096 = Llama-3-8B; batch 1, 8, 64) in fp32, fp16
   and bf16, plus 1 MiB. Per size: mean latency over --iters back-to-back calls (median of 5 repeats),
   algorithm bandwidth = bytes / time and bus bandwidth = algbw x 2(n-1)/n (nccl-tests' convention: what
   each link carries in a ring all-reduce). With nccl the tensors live on cuda:LOCAL_RANK. Beside each
   figure, `runtime_us`: the same sum through the runtime's own path (runner/parallel/collectives.py: a host
   numpy array in, copied to the rank's device, all-reduced, copied back), what a tp step pays per call; and
   a 64 MiB message, for the bandwidth the link reaches once latency stops mattering (the device's NVLink
   peak, as nvidia-smi reports its links, is in the results file). This part needs torch and numpy only
   (no onnxruntime), so it runs as is on a GPU machine that has nothing else.
2. (unless --no-decode; needs onnxruntime) decode-step time of a SmolLM2-shaped random llama (hidden 576,
   intermediate 1536, 30 layers, vocab 49152; 8 heads / 2 KV heads of 72, because SmolLM2's 9 heads do not
   split in 2) as a trtbuild tp engine: tp=2 ranks (and tp=4 with --world-size 4; its 2 KV heads are then
   replicated) vs the same segmented graphs at tp=1 (one process, no collective) vs the single-graph
   onnxruntime engine, and rank 0's time inside collectives per step
   (2 all-reduces per layer + the embedding's + the logits' all-gather). Segments run on onnxruntime CPU;
   with nccl the collectives go through the GPUs.

--engines DIR --save-engines keeps the decode part's engine dirs (single/, tp1/, tp2/[, tp4/]) in DIR;
--engines DIR alone reuses them, e.g. tiny ones (--model tiny, ~1 MB) built here and carried to a GPU machine.

Writes benchmarks/results/collectives-<backend>-<device>.json (device name, driver and NCCL versions on CUDA).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
HIDDEN = {"tiny": 64, "smollm2": 576, "llama3-8b": 4096}
BATCHES = (1, 8, 64)
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
SMOL_SHAPED = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                   num_attention_heads=8, num_key_value_heads=2, head_dim=72, max_position_embeddings=2048,
                   rope_theta=100000.0, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
# the tests' tiny llama (tests/tiny_models.py): engines of ~0.5 MB, small enough to carry to another machine
TINY = dict(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2)
MODELS = {"smollm2": SMOL_SHAPED, "tiny": TINY}


# ---- part 1: all-reduce sweep (torch only) ------------------------------------------------------------------
def messages() -> list[tuple[str, int, str]]:
    out = [(f"{model} hidden {h} x batch {b}", h * b, dtype) for model, h in HIDDEN.items() for b in BATCHES
           for dtype in DTYPES]
    out += [(label, size // torch.tensor([], dtype=DTYPES[d]).element_size(), d)
            for label, size in (("1 MiB", 1 << 20), ("64 MiB", 64 << 20)) for d in DTYPES]
    return out


def _timed(call: Any, device: torch.device, iters: int) -> float:
    """Median over 5 repeats of the mean seconds of ITERS back-to-back calls, ranks started together."""
    means = []
    for _ in range(5):
        dist.barrier()
        started = time.perf_counter()
        for _ in range(iters):
            call()
        _sync(device)
        means.append((time.perf_counter() - started) / iters)
    return statistics.median(means)


def allreduce_sweep(device: torch.device, iters: int, backend: str) -> list[dict[str, Any]]:
    import ml_dtypes
    import numpy as np

    from engine_builder.formats.parallel_mapping import ParallelMapping
    from engine_builder.runner.parallel.collectives import Collectives

    world = dist.get_world_size()
    runtime = Collectives(ParallelMapping(tp=world), backend=backend)  # the path a tp step's segments take
    host_dtypes = {"fp32": np.float32, "fp16": np.float16, "bf16": ml_dtypes.bfloat16}
    rows = []
    for label, count, dtype in messages():
        tensor = torch.ones(count, dtype=DTYPES[dtype], device=device)
        host = np.ones(count, host_dtypes[dtype])
        n = iters if count * tensor.element_size() < (16 << 20) else max(1, iters // 10)
        for _ in range(10):  # warm up (NCCL builds its communicator on the first call)
            dist.all_reduce(tensor)
            runtime.all_reduce(host)
        _sync(device)
        seconds = _timed(functools.partial(dist.all_reduce, tensor), device, n)
        runtime_seconds = _timed(functools.partial(runtime.all_reduce, host), device, n)
        size = count * tensor.element_size()
        algbw = size / seconds / 1e9
        rows.append({"message": label, "dtype": dtype, "elements": count, "bytes": size,
                     "latency_us": round(seconds * 1e6, 2), "algbw_GBps": round(algbw, 4),
                     "busbw_GBps": round(algbw * 2 * (world - 1) / world, 4),
                     "runtime_us": round(runtime_seconds * 1e6, 2)})
    return rows


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_info(backend: str) -> dict[str, Any]:
    info: dict[str, Any] = {"torch": torch.__version__, "backend": backend, "host_cpu": _cpu_name(),
                            "cpu_count": os.cpu_count(),
                            # other jobs on a shared host skew every figure: the 1-minute load average, as run
                            "load_average_1min": round(os.getloadavg()[0], 2)}
    if backend == "nccl" and torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name(0)
        info["gpus"] = torch.cuda.device_count()
        info["cuda"] = torch.version.cuda
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        info["driver"] = _nvidia_smi(["--query-gpu=driver_version", "--format=csv,noheader"]).split("\n")[0]
        info["nvlink"] = _nvidia_smi(["nvlink", "-s", "-i", "0"])  # per-link speed as the driver reports it
        links = [float(v) for v in re.findall(r"Link \d+: ([\d.]+) GB/s", info["nvlink"])]
        info["nvlink_peak_GBps_per_direction"] = round(sum(links), 1) if links else None
        info["topology"] = _nvidia_smi(["topo", "-m"])
    else:
        info["device"] = "cpu"
    return info


def _cpu_name() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
        found = re.search(r"model name\s*:\s*(.+)", text)
        return found.group(1).strip() if found else platform.processor()
    except OSError:
        return platform.processor()


def _nvidia_smi(args: list[str]) -> str:
    try:
        return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


# ---- part 2: decode step tp=2 vs tp=1 (onnxruntime + trtbuild) ------------------------------------------------
def make_engines(work: Path, shape: dict[str, Any], tps: tuple[int, ...]) -> dict[str, Path]:
    """A random llama of SHAPE as a tp=N engine per N in TPS, a tp=1 segmented engine and a single-graph one."""
    import dataclasses

    import transformers

    sys.path.insert(0, str(ROOT))
    from converters.convert import convert
    from converters.parallel_shard import shard_checkpoint
    from engine_builder.build.parallel_build import build_parallel
    from engine_builder.build.pipeline import build
    from engine_builder.formats.build_config import BuildConfig, Limits
    from engine_builder.formats.parallel_mapping import ParallelMapping

    hf = work / "hf"
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape)).save_pretrained(hf)
    config = BuildConfig(targets=("onnxruntime",), dtype="float32",
                         limits=Limits(max_batch=8, max_input_len=64, max_seq_len=256))
    convert(hf, work / "ckpt1", dtype="float32")
    build(work / "ckpt1", work / "single", config)
    shard_checkpoint(work / "ckpt1", ParallelMapping(1, 1))  # the same weights as a 1-rank segmented checkpoint
    build_parallel(work / "ckpt1", work / "tp1", dataclasses.replace(config))
    for tp in tps:
        convert(hf, work / f"ckpt{tp}", dtype="float32", tp=tp)
        build_parallel(work / f"ckpt{tp}", work / f"tp{tp}", config)
    return {name: work / name for name in engine_names(tps)}


def engine_names(tps: tuple[int, ...]) -> tuple[str, ...]:
    return ("single", "tp1", *(f"tp{tp}" for tp in tps))


def decode_steps(backend_obj: Any, batch: int, steps: int, prompt_len: int = 16) -> tuple[list[float], float]:
    """Prefill BATCH rows, then time STEPS decode steps; returns per-step seconds and collective seconds."""
    import numpy as np

    kv = backend_obj.kv
    slots = [kv.allocate(f"r{i}", prompt_len, steps + 1) for i in range(batch)]
    for slot in slots:
        backend_obj.bind(slot, (np.arange(prompt_len, dtype=np.int64) + 3)[None])
        backend_obj.execute()
        kv.advance(slot, prompt_len)
    ids = np.full((batch, 1), 7, np.int64)
    before = getattr(backend_obj, "collective_seconds", 0.0)
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        backend_obj.bind(slots[0], ids)
        backend_obj.execute()
        backend_obj.read_logits()
        times.append(time.perf_counter() - started)
        for slot in slots:
            kv.advance(slot, 1)
    for slot in slots:
        backend_obj.release(slot)
    return times, getattr(backend_obj, "collective_seconds", 0.0) - before


def decode_rank(rank: int, world: int, backend: str, engine: str, batches: tuple[int, ...], steps: int,
                threads: int, out: dict | None) -> dict[str, Any] | None:
    sys.path.insert(0, str(ROOT))
    from engine_builder.formats.manifest import EngineManifest
    from engine_builder.runner.engine import EngineDir
    from engine_builder.runner.parallel.collectives import Collectives, RankEnv
    from engine_builder.runner.parallel.parallel_backend import ParallelBackend
    from engine_builder.runner.parallel.worker import follow

    mapping = EngineManifest.load(Path(engine)).mapping
    comm = Collectives(mapping, RankEnv(rank, world, rank, world), backend)
    if rank != 0:
        follow(Path(engine), verify=False, threads=threads, comm=comm)
        return None
    be = ParallelBackend(EngineDir.load(engine, verify=False), threads=threads, comm=comm)
    result = {}
    for batch in batches:
        decode_steps(be, batch, 4)  # warm up
        times, collective = decode_steps(be, batch, steps)
        result[f"batch {batch}"] = {"step_ms": round(statistics.median(times) * 1e3, 3),
                                    "collective_ms_per_step": round(collective / steps * 1e3, 3)}
    be.close()
    if out is not None:
        out.update(result)
    return result


def _decode_worker(rank: int, world: int, port: int, backend: str, engine: str, batches: tuple[int, ...],
                   steps: int, threads: int, queue: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    result = decode_rank(rank, world, backend, engine, batches, steps, threads, None)
    if rank == 0:
        queue.put(result)


def single_graph_decode(engine: Path, batches: tuple[int, ...], steps: int, threads: int) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from engine_builder.runner.engine import EngineDir
    from engine_builder.runner.ort_backend import OrtBackend

    be = OrtBackend(EngineDir.load(engine, verify=False), threads=threads)
    result = {}
    for batch in batches:
        decode_steps(be, batch, 4)
        times, _ = decode_steps(be, batch, steps)
        result[f"batch {batch}"] = {"step_ms": round(statistics.median(times) * 1e3, 3)}
    be.close()
    return result


def run_decode(backend: str, batches: tuple[int, ...], steps: int, model: str, engines_dir: Path | None,
               save_engines: bool, tps: tuple[int, ...]) -> dict[str, Any]:
    """ENGINES_DIR: reuse (or with SAVE_ENGINES, write) its single/, tp1/, tp<N>/ engine dirs instead of a temp
    dir."""
    cores = len(os.sched_getaffinity(0))
    shape = MODELS[model]
    with tempfile.TemporaryDirectory(prefix="collectives-") as tmp:
        work = engines_dir if engines_dir is not None else Path(tmp)
        if engines_dir is None or save_engines:
            engines = make_engines(work, shape, tps)
        else:
            engines = {name: work / name for name in engine_names(tps)}
        single = single_graph_decode(engines["single"], batches, steps, cores)
        ctx = mp.get_context("spawn")
        results = {}
        for world in (1, *tps):
            name = f"tp{world}"
            queue = ctx.Queue()
            mp.start_processes(_decode_worker, args=(world, _free_port(), backend, str(engines[name]), batches,
                                                     steps, max(1, cores // world), queue),
                               nprocs=world, start_method="spawn", join=True)
            results[name] = queue.get()
    table = {}
    for batch in batches:
        key = f"batch {batch}"
        tp1 = results["tp1"][key]
        table[key] = {"single_graph_step_ms": single[key]["step_ms"], "tp1_segmented_step_ms": tp1["step_ms"]}
        for tp in tps:
            row = results[f"tp{tp}"][key]
            table[key] |= {f"tp{tp}_step_ms": row["step_ms"],
                           f"tp{tp}_collective_ms_per_step": row["collective_ms_per_step"],
                           f"tp{tp}_over_tp1": round(row["step_ms"] / tp1["step_ms"], 3),
                           f"collective_share_of_tp{tp}_step": round(row["collective_ms_per_step"] / row["step_ms"],
                                                                     3)}
    return {"model": model, "shape": {k: v for k, v in shape.items() if k not in ("bos_token_id", "eos_token_id")},
            "collectives_per_step": f"{2 * shape['num_hidden_layers'] + 1} all-reduces + 1 all-gather",
            "cores": cores, "threads_per_rank": {f"tp{n}": max(1, cores // n) for n in (1, *tps)}, "steps": steps,
            "by_batch": table}


# ---- launching ------------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sweep_rank(rank: int, world: int, backend: str, iters: int, port: int | None, queue: Any) -> None:
    if port is not None:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                          LOCAL_RANK=str(rank))
    local = int(os.environ.get("LOCAL_RANK", rank))
    device = torch.device("cuda", local) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world,
                            **({"device_id": device} if device.type == "cuda" else {}))
    rows = allreduce_sweep(device, iters, backend)
    dist.destroy_process_group()
    if rank == 0 and queue is not None:
        queue.put(rows)
    elif rank == 0:
        return rows  # type: ignore[return-value]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--decode-steps", type=int, default=32)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--no-decode", action="store_true", help="all-reduce sweep only (torch only)")
    parser.add_argument("--model", choices=sorted(MODELS), default="smollm2",
                        help="decode part: the SmolLM2-shaped llama, or the tests' tiny one")
    parser.add_argument("--engines", type=Path, help="decode part: reuse the single/ tp1/ tp<N>/ engine dirs here "
                                                     "(built elsewhere, e.g. carried to a GPU machine)")
    parser.add_argument("--save-engines", action="store_true", help="build the engines into --engines (kept)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    under_torchrun = "RANK" in os.environ
    if under_torchrun:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        rows = sweep_rank(rank, world, args.backend, args.iters, None, None)
        if rank != 0:
            return
    else:
        world = args.world_size
        queue = mp.get_context("spawn").Queue()
        mp.start_processes(sweep_rank, args=(world, args.backend, args.iters, _free_port(), queue), nprocs=world,
                           start_method="spawn", join=True)
        rows = queue.get()
    result: dict[str, Any] = {"benchmark": "collectives", "world_size": world, "date": time.strftime("%Y-%m-%d"),
                              "device": device_info(args.backend), "allreduce": rows}
    if not args.no_decode and not under_torchrun:
        # tp=2 always; tp=4 too where 4 ranks fit (--world-size 4: one GPU each with nccl)
        tps = tuple(tp for tp in (2, 4) if tp <= max(2, world))
        result["decode_tp_vs_tp1"] = run_decode(args.backend, tuple(args.batch), args.decode_steps, args.model,
                                                args.engines, args.save_engines, tps)
    RESULTS.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", str(result["device"]["device"]).lower()).strip("-")
    # the sweep alone (--no-decode, or under torchrun) never overwrites a file with the decode figures
    suffix = "-allreduce" if "decode_tp_vs_tp1" not in result else "" if args.model == "smollm2" else f"-{args.model}"
    suffix += f"-x{world}" if world > 2 else ""
    path = RESULTS / f"collectives-{args.backend}-{slug}{suffix}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result))
        return
    print(f"all-reduce, {world} ranks, {args.backend} on {result['device']['device']}:")
    for r in rows:
        print(f"  {r['message']:<30} {r['dtype']:<5} {r['bytes']:>9} B  {r['latency_us']:>9.1f} us  "
              f"busbw {r['busbw_GBps']:.3f} GB/s  runtime path {r['runtime_us']:>9.1f} us")
    decode = result.get("decode_tp_vs_tp1")
    if decode:
        print(f"decode step, {decode['model']} llama, {decode['collectives_per_step']} per step:")
        for key, row in decode["by_batch"].items():
            tps = "; ".join(f"tp={n} {row[f'tp{n}_step_ms']} ms (x{row[f'tp{n}_over_tp1']}), collectives "
                            f"{row[f'tp{n}_collective_ms_per_step']} ms/step"
                            for n in (2, 4) if f"tp{n}_step_ms" in row)
            print(f"  {key}: single graph {row['single_graph_step_ms']} ms, tp=1 segmented "
                  f"{row['tp1_segmented_step_ms']} ms; {tps}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

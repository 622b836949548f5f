"""Where a decode step's time goes on the GPU: the kernels of one step and the host's time around them.

    python3 benchmarks/gpu_step_profile.py [--shape smollm2] [--batch 1 64] [--steps 32] [--top 15]
                                           [--async-scheduling] [--inductor KEY=VALUE ...] [--work /tmp/gpu-bench]
                                           [--json PATH]

gpu_decode.py measured the torch backend at 326 tok/s on the SmolLM2 shape at batch 1 on the H200 (2026-12-02),
3 ms a token where the weights' bytes take 0.06 ms, while our loop's own Python is ~0.1 ms a token (a tiny model on
the CPU: 0.08 of a decode step outside Backend.forward). This says what the rest is. Over gpu_decode.py's seeded
random engine of --shape, with LLM(engine, backend="torch"), per --batch:

    kernels   a decode of --steps tokens under torch.profiler (CPU and CUDA activities): kernels per decode step
              (a CUDA-graph replay's launches included), GPU time per step (the kernels' sum) beside the host's
              wall per step, and the --top kernels by total time with their launches per step: what fusing
              (norm + residual, rope + KV write, the MLP's activation) would take away
    loop      LLM.last_timings of an unprofiled run: decode ms per token and the share outside Backend.forward

On a machine without a GPU (a smoke run: --shape tiny) the CPU ops stand where the kernels would.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_decode import (  # noqa: E402
    DEVICE,
    SHAPES,
    engine_dir,
    environment,
    inductor_options,
    log,
    prompts,
    sync,
    write_hf_dir,
)


def _device_us(event) -> float:
    """An averaged event's own device time in µs (the field's name changed across torch versions)."""
    for name in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(event, name, None)
        if value is not None:
            return float(value)
    return 0.0


def profile_steps(llm, ids: list[list[int]], steps: int, top: int, warm: list[list[int]] | None = None) -> dict:
    """Kernels of a generate of STEPS + 1 tokens over IDS (WARM: the prompts of the warm-up run, default IDS)."""
    from torch.profiler import ProfilerActivity, profile

    from engine_builder.runner.sampling_params import SamplingParams

    params = SamplingParams(max_new_tokens=steps + 1, ignore_eos=True, temperature=0.0)
    llm.generate(prompt_token_ids=warm or ids, params=params)  # warm: graphs captured, kernels compiled
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else [])
    sync()
    started = time.perf_counter()
    with profile(activities=activities) as prof:
        llm.generate(prompt_token_ids=ids, params=params)
        sync()
    wall = time.perf_counter() - started
    events = prof.key_averages()
    if DEVICE == "cuda":
        kernels = [e for e in events if _device_us(e) > 0 and not e.key.startswith("cuda")]
        timed = [(e.key, _device_us(e), e.count) for e in kernels]
    else:  # the CPU's own ops (leaf aten ops) stand for kernels
        timed = [(e.key, float(e.self_cpu_time_total), e.count) for e in events
                 if e.key.startswith("aten::") and e.self_cpu_time_total > 0]
    timed.sort(key=lambda t: -t[1])
    total_us = sum(t[1] for t in timed)
    # the prefill is one step of the steps + 1 the run made: every figure is per step of the whole run
    per = steps + 1
    return {
        "steps": per, "kernels_per_step": round(sum(t[2] for t in timed) / per, 1),
        "device_ms_per_step": round(total_us / 1e3 / per, 4), "host_wall_ms_per_step": round(1e3 * wall / per, 4),
        "top": [{"kernel": k[:120], "ms_per_step": round(us / 1e3 / per, 4), "launches_per_step": round(n / per, 2),
                 "share": round(us / total_us, 4) if total_us else 0.0} for k, us, n in timed[:top]],
    }


def loop_split(llm, ids: list[list[int]], steps: int) -> dict:
    from engine_builder.runner.sampling_params import SamplingParams

    params = SamplingParams(max_new_tokens=steps + 1, ignore_eos=True, temperature=0.0)
    walls = []
    for _ in range(3):
        sync()
        started = time.perf_counter()
        llm.generate(prompt_token_ids=ids, params=params)
        walls.append(time.perf_counter() - started)
    t = llm.last_timings
    return {"wall_ms_per_token": round(1e3 * statistics.median(walls) / (steps + 1), 4),
            "decode_ms_per_step": round(1e3 * t.decode_seconds / max(1, t.decode_steps), 4),
            "outside_forward_share": round(t.overhead_share, 4)}


def profile_prefill(llm, vocab: int, top: int) -> dict:
    """A prompt's first token: 1,024 tokens cold, and 24 new tokens after a 1,000-token prefix the radix tree
    holds (gpu_decode.py's prefix-hit figure), each one step (max_new_tokens=1) after a warm-up of its own kind (a
    new kernel variant compiles on its first call); kernels, then the host's own time (cProfile)."""
    from engine_builder.runner.sampling_params import SamplingParams

    system, tails = prompts(vocab, 1, 1000, seed=21)[0], prompts(vocab, 5, 24, seed=22)
    cold = prompts(vocab, 4, 1024, seed=23)

    def hit(i: int) -> list[list[int]]:
        return [system + tails[i]]

    llm.generate(prompt_token_ids=hit(0), params=SamplingParams(max_new_tokens=1))  # the system prompt cached
    out = {"cold_1024": profile_steps(llm, cold[1:2], 0, top, warm=cold[:1]),
           "hit_1000_plus_24": profile_steps(llm, hit(2), 0, top, warm=hit(1))}
    out["cold_1024"]["host"] = host_profile(llm, cold[3:4], 0, top, warm=cold[2:3])
    out["hit_1000_plus_24"]["host"] = host_profile(llm, hit(4), 0, top, warm=hit(3))
    return out


def host_profile(llm, ids: list[list[int]], steps: int, top: int, warm: list[list[int]] | None = None) -> list[dict]:
    """The host's own time in a decode of STEPS + 1 tokens under cProfile: the --top functions by their own time
    per step (a wait for the GPU shows as the time of the call that synchronizes, e.g. Tensor.cpu)."""
    import cProfile
    import pstats

    from engine_builder.runner.sampling_params import SamplingParams

    params = SamplingParams(max_new_tokens=steps + 1, ignore_eos=True, temperature=0.0)
    llm.generate(prompt_token_ids=warm or ids, params=params)
    profiler = cProfile.Profile()
    profiler.enable()
    llm.generate(prompt_token_ids=ids, params=params)
    profiler.disable()
    rows = pstats.Stats(profiler).stats  # (file, line, name) -> (calls, primitive calls, own s, cumulative s, ..)
    ranked = sorted(rows.items(), key=lambda kv: -kv[1][2])[:top]
    per = steps + 1
    return [{"function": f"{Path(f).name}:{line}({name})", "own_ms_per_step": round(1e3 * own / per, 4),
             "calls_per_step": round(calls / per, 2)} for (f, line, name), (_, calls, own, _, _) in ranked]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="smollm2", choices=sorted(SHAPES))
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--work", type=Path, default=Path("/tmp/gpu-bench"))
    parser.add_argument("--async-scheduling", action="store_true", help="LLM(async_scheduling=True)'s decode steps")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--inductor", nargs="*", default=[], metavar="KEY=VALUE", help="torch._inductor.config values")
    args = parser.parse_args()
    inductor = inductor_options(args.inductor)
    from engine_builder import LLM

    args.work.mkdir(parents=True, exist_ok=True)
    out: dict = {"environment": environment(), "shape": args.shape, "inductor": inductor, "runs": {}}
    log(out["environment"])
    hf = write_hf_dir(args.shape, args.work / f"{args.shape}-hf")
    engine = engine_dir(hf, args.work, args.shape, max(64, max(args.batch)), drop_ckpt=False)
    llm = LLM(engine, backend="torch", verify=False, async_scheduling=args.async_scheduling)
    out["async_scheduling"] = args.async_scheduling
    vocab = SHAPES[args.shape]["vocab_size"]
    for batch in args.batch:
        ids = prompts(vocab, batch, 16, seed=batch)
        run = {"kernels": profile_steps(llm, ids, args.steps, args.top), "loop": loop_split(llm, ids, args.steps),
               "host": host_profile(llm, ids, args.steps, args.top)}
        out["runs"][f"b{batch}"] = run
        k = run["kernels"]
        log(f"b{batch}: {k['kernels_per_step']} kernels/step, device {k['device_ms_per_step']} ms/step, host wall "
            f"{k['host_wall_ms_per_step']} ms/step (profiled); unprofiled {run['loop']['wall_ms_per_token']} ms/token, "
            f"outside forward {run['loop']['outside_forward_share']}")
        for row in k["top"]:
            log(f"   {row['ms_per_step']:9.4f} ms/step  {row['launches_per_step']:7.2f}x  {row['share']:6.1%}  "
                f"{row['kernel']}")
        log(f"b{batch} host, own time per step (cProfile):")
        for row in run["host"]:
            log(f"   {row['own_ms_per_step']:9.4f} ms/step  {row['calls_per_step']:7.2f}x  {row['function']}")
    out["prefill"] = profile_prefill(llm, vocab, args.top)
    if llm.backend.compiled is not None:  # TRTBUILD_TORCH_COMPILE=on: compiled in the first runs' warm-up
        out["torch_compile_s"] = round(llm.backend.compiled.seconds, 2)
        log(f"torch.compile: {out['torch_compile_s']} s")
    for name, k in out["prefill"].items():
        log(f"prefill {name}: {k['kernels_per_step']} kernels, device {k['device_ms_per_step']} ms, host wall "
            f"{k['host_wall_ms_per_step']} ms (profiled)")
        for row in k["top"][:8]:
            log(f"   {row['ms_per_step']:9.4f} ms  {row['launches_per_step']:7.2f}x  {row['share']:6.1%}  "
                f"{row['kernel']}")
        for row in k["host"][:12]:
            log(f"   host {row['own_ms_per_step']:9.4f} ms  {row['calls_per_step']:7.2f}x  {row['function']}")
    llm.close()
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

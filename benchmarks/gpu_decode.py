"""The torch backend on a CUDA GPU against HF transformers (eager and static cache) and the GPU's own limits.

    python3 benchmarks/gpu_decode.py [--shapes smollm2 llama3-8b] [--runs 3] [--new-tokens 128]
                                     [--batch 1 64] [--serve 256] [--serve-len 128 ...] [--skip hf ...]
                                     [--inductor KEY=VALUE ...] [--unfused] [--work /tmp/gpu-bench] [--json PATH]

Per shape, with seeded random bf16 weights (no real 8B weights reach the GPU machine): a Hugging Face dir of
that shape is written, taken through our own `convert` and `build` (onnxruntime target: every engine dir
carries the checkpoint's tensors the torch backend runs), then, side by side in one process, medians of --runs:

    ours      LLM(engine, backend="torch"): decode tok/s at each --batch (prompt 16 tokens, --new-tokens, EOS
              ignored; tok/s = generated tokens / wall time of the generate call), time to first token of a
              1,024-token prompt, a prefix-cache hit on a 1,000-token system prompt vs cold, --serve requests
              of --serve-len in / out (128; also 1000) through LLM.generate's in-flight batching (output tok/s,
              and the weights' TB/s over its decode steps and the TFLOP/s over its wall); CUDA graph capture
              seconds. Decode and serve also with async scheduling (keys async_*: the same LLM with
              runner/async_decode.py's policy, what LLM(..., async_scheduling=True) runs), alternating runs
    hf        transformers' generate on the same weights and prompts: eager (dynamic cache) and
              cache_implementation="static" (its automatic torch.compile; warm-up excluded), min_new_tokens so
              both do the same steps; its 1,024-token prefill
    limits    device-to-device copy bandwidth and a bf16 matmul's TFLOP/s, measured here; the batch-1 ceiling
              = weight bytes / copy bandwidth, and achieved GB/s (weights + KV read per step) and TFLOP/s

The 8B shape needs ~48 GB of disk at the peak (HF dir, checkpoint, engine dir): the HF dir goes once HF has
run and the checkpoint once the engine dir is built.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

SHAPES = {
    # a smoke run of this script on a CPU (no GPU): `--shapes tiny --skip hf --batch 1 4 --serve 8`
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, rope_theta=10000.0, rms_norm_eps=1e-5,
                 max_position_embeddings=4096),
    "smollm2": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, head_dim=64, tie_word_embeddings=True,
                    rope_theta=100000.0, rms_norm_eps=1e-5, max_position_embeddings=8192),
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False,
                      rope_theta=500000.0, rms_norm_eps=1e-5, max_position_embeddings=8192),
}


def log(*args) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *args, flush=True)


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def release_memory() -> None:
    """Give back what a dropped model held: host objects now, the CUDA caching allocator's blocks to the device."""
    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def environment() -> dict:
    switches = {k: v for k, v in os.environ.items() if k.startswith("TRTBUILD_")}  # e.g. TRTBUILD_FUSED_DECODE
    if DEVICE != "cuda":
        return {"gpu": None, "torch": torch.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "trtbuild_env": switches}
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    import transformers
    import triton

    return {"gpu": torch.cuda.get_device_name(), "nvidia_smi": smi, "torch": torch.__version__,
            "cuda": torch.version.cuda, "triton": triton.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "trtbuild_env": switches}


def inductor_options(pairs: list[str]) -> dict:
    """--inductor KEY=VALUE ...: torch._inductor.config values set before anything compiles (an A/B of a fusion
    choice, e.g. keep_addmm_fused_for_half_dtypes=False); an unknown key is an error, not a silent no-op."""
    import ast

    import torch._inductor.config as inductor

    chosen = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        if not hasattr(inductor, key):
            sys.exit(f"--inductor {pair}: torch {torch.__version__}'s inductor has no option {key!r}")
        chosen[key] = ast.literal_eval(value)
        setattr(inductor, key, chosen[key])
    return chosen


def cuda_ms(fn, runs: int = 20, warmup: int = 3) -> float:
    """Median milliseconds of fn() between CUDA events (host clock on a CPU)."""
    for _ in range(warmup):
        fn()
    times = []
    if DEVICE != "cuda":
        for _ in range(runs):
            t = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t))
        return statistics.median(times)
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def limits() -> dict:
    if DEVICE != "cuda":
        return {"copy_tb_s": float("nan"), "bf16_matmul_tflops": float("nan")}
    src = torch.randn(1 << 30, dtype=torch.bfloat16, device="cuda")  # 2 GiB, far past the 60 MB L2
    dst = torch.empty_like(src)
    ms = cuda_ms(lambda: dst.copy_(src))
    copy_tb_s = 2 * src.numel() * 2 / (ms / 1e3) / 1e12  # bytes read + written
    del src, dst
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    ms = cuda_ms(lambda: a @ b, runs=10)
    tflops = 2 * 8192 ** 3 / (ms / 1e3) / 1e12
    del a, b
    torch.cuda.empty_cache()
    return {"copy_tb_s": round(copy_tb_s, 3), "bf16_matmul_tflops": round(tflops, 1)}


# --- the model dirs -------------------------------------------------------------------------------------

def write_hf_dir(shape: str, out: Path, seed: int = 0) -> Path:
    """A seeded random bf16 HF Llama dir of SHAPE with a word-level tokenizer over its vocab."""
    import transformers
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    if (out / "config.json").exists():
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cfg = transformers.LlamaConfig(**SHAPES[shape], bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16")
    with torch.device("meta"):
        names = {k: v.shape for k, v in transformers.LlamaForCausalLM(cfg).state_dict().items()}
    if cfg.tie_word_embeddings:
        names.pop("lm_head.weight", None)
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    shard, shard_bytes, index, n = {}, 0, {}, 0

    def flush() -> None:
        nonlocal shard, shard_bytes, n
        if shard:
            name = f"model-{n:05d}.safetensors"
            save_file(shard, tmp / name, metadata={"format": "pt"})
            index.update({k: name for k in shard})
            shard, shard_bytes, n = {}, 0, n + 1

    for name, dims in names.items():
        if name.endswith("norm.weight"):  # around 1, as trained norms are
            t = 1 + 0.1 * torch.randn(dims, generator=gen, device=DEVICE)
        else:
            t = 0.02 * torch.randn(dims, generator=gen, device=DEVICE)
        shard[name] = t.to(torch.bfloat16).cpu()
        shard_bytes += shard[name].numel() * 2
        if shard_bytes > 4 << 30:
            flush()
    flush()
    (tmp / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
    cfg.save_pretrained(tmp)
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(cfg.vocab_size)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="w1", eos_token="w2", pad_token="w0",
                                         unk_token="w0").save_pretrained(tmp)
    tmp.rename(out)
    return out


def engine_dir(hf: Path, work: Path, shape: str, max_batch: int, drop_ckpt: bool) -> Path:
    from converters.convert import convert
    from engine_builder.build.pipeline import build
    from engine_builder.formats.build_config import BuildConfig, Limits

    engine = work / f"{shape}-engine-b{max_batch}"
    if engine.exists():
        return engine
    ckpt = work / f"{shape}-ckpt"
    if not ckpt.exists():
        started = time.perf_counter()
        convert(hf, ckpt)
        log(f"convert {shape}: {time.perf_counter() - started:.1f} s")
    started = time.perf_counter()
    # bfloat16 for both: the twin's graph is written (every engine dir has one) but never packed or run here
    limits = Limits(max_batch=max_batch, max_input_len=1024, max_seq_len=2048)
    build(ckpt, engine, BuildConfig(targets=("onnxruntime",), dtype="bfloat16", limits=limits))
    log(f"build {shape}: {time.perf_counter() - started:.1f} s")
    if drop_ckpt:
        shutil.rmtree(ckpt)
    return engine


# --- the contenders -------------------------------------------------------------------------------------

def prompts(vocab: int, batch: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (batch, length), generator=g).tolist()


def ours(engine: Path, args, vocab: int, out: dict, save) -> dict:
    from engine_builder import LLM
    from engine_builder.runner.sampling_params import SamplingParams

    started = time.perf_counter()
    llm = LLM(engine, backend="torch", verify=False)
    out.update(load_s=round(time.perf_counter() - started, 2), backend=llm.backend_name)
    warm = llm.warm_up(log)  # what serve does before it listens
    fused = getattr(llm.backend, "fused", None)
    out["fused_trial"] = fused.trial if fused is not None else None  # the fused decode layer's timing at warm-up
    if warm is not None:
        out.update(warm_up_s=round(warm.seconds, 2), torch_compile_s=round(warm.compile_seconds, 2),
                   cuda_graph_capture_s=round(warm.capture_seconds, 2), cuda_graphs=warm.graphs)

    from engine_builder.runner.async_decode import AsyncDecode
    from engine_builder.runner.generate import PlainDecode

    policies = {"": PlainDecode(), "async_": AsyncDecode()}  # the key prefix of each one's figures

    def timed(ids, new_tokens, policy: str = "") -> tuple[float, list]:
        llm.generator.decoding = policies[policy]
        params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True, temperature=0.0)
        sync()
        t = time.perf_counter()
        res = llm.generate(prompt_token_ids=ids, params=params)
        return time.perf_counter() - t, res

    out["greedy_32"] = list(timed(prompts(vocab, 1, 16, seed=1), 32)[1][0].token_ids)
    out["async_greedy_32_equal"] = list(timed(prompts(vocab, 1, 16, seed=1), 32, "async_")[1][0].token_ids) == \
        out["greedy_32"]
    save()
    for batch in args.batch:
        ids = prompts(vocab, batch, 16, seed=batch)
        for policy in policies:
            timed(ids, 8, policy)  # warm-up (the eager prefill's kernels)
        walls: dict[str, list[float]] = {policy: [] for policy in policies}
        for _ in range(args.runs):  # alternating: a drift of the machine hits both alike
            for policy in policies:
                walls[policy].append(timed(ids, args.new_tokens, policy)[0])
                out[f"{policy}decode_b{batch}_runner_decode_tok_s"] = round(llm.last_timings.decode_tok_s, 1)
        for policy, w in walls.items():
            out[f"{policy}decode_b{batch}_tok_s"] = round(batch * args.new_tokens / statistics.median(w), 1)
            log(f"ours {policy or 'plain_'}b{batch}: {out[f'{policy}decode_b{batch}_tok_s']} tok/s "
                f"(walls {[round(x, 3) for x in w]})")
        save()
    long = prompts(vocab, 6, 1024, seed=7)
    timed(long[:1], 1)
    out["ttft_1024_ms"] = round(1e3 * statistics.median(timed([p], 1)[0] for p in long[1:]), 2)
    system = prompts(vocab, 4, 1000, seed=11)
    suffix = prompts(vocab, 4, 24, seed=12)
    cold = [timed([system[i] + suffix[i]], 1)[0] for i in range(1, 4)]
    hit = [timed([system[i] + suffix[(i + 1) % 4]], 1)[0] for i in range(1, 4)]
    out["prefix_cold_ms"] = round(1e3 * statistics.median(cold), 2)
    out["prefix_hit_ms"] = round(1e3 * statistics.median(hit), 2)
    out["prefix_hit_over_cold"] = round(statistics.median(hit) / statistics.median(cold), 3)
    log(f"ours ttft 1024: {out['ttft_1024_ms']} ms; prefix hit/cold {out['prefix_hit_over_cold']}")
    save()
    for length in args.serve_len if args.serve else []:
        ids = prompts(vocab, args.serve, length, seed=13)
        for policy in policies:
            timed(ids[:8], 4, policy)
            wall, res = timed(ids, length, policy)
            key = f"{policy}serve_{args.serve}x{length}"
            out[f"{key}_out_tok_s"] = round(args.serve * length / wall, 1)
            t = llm.last_timings  # where the wall went: prefill steps, decode steps (their tok/s and count)
            out[f"{key}_timings"] = t.to_json() | {"wall_s": round(wall, 3), "decode_s": round(t.decode_seconds, 3),
                                                   "tokens": 2 * args.serve * length}
            log(f"ours {policy}serve {args.serve}x{length}/{length}: {out[f'{key}_out_tok_s']} tok/s "
                f"({out[f'{key}_timings']})")
            save()
    llm.close()
    del llm
    release_memory()
    return out


def hf(hf_dir: Path, args, vocab: int) -> dict:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.bfloat16).to(DEVICE).eval()
    out: dict = {}

    def run(ids, static: bool) -> float:
        x = torch.tensor(ids, device=DEVICE)
        kw = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
                  attention_mask=torch.ones_like(x))
        if static:
            kw["cache_implementation"] = "static"
        sync()
        t = time.perf_counter()
        with torch.inference_mode():
            model.generate(x, **kw)
        sync()
        return time.perf_counter() - t

    for mode in ("eager", "static") if "hf-static" not in args.skip else ("eager",):
        for batch in args.batch:
            if mode == "eager" and batch > 1 and "hf-eager-batch" in args.skip:
                continue
            ids = prompts(vocab, batch, 16, seed=batch)
            started = time.perf_counter()
            run(ids, mode == "static")  # warm-up: the static cache's compile happens here
            warm = time.perf_counter() - started
            wall = statistics.median(run(ids, mode == "static") for _ in range(args.runs))
            out[f"{mode}_b{batch}_tok_s"] = round(batch * args.new_tokens / wall, 1)
            log(f"hf {mode} b{batch}: {out[f'{mode}_b{batch}_tok_s']} tok/s (warm-up {warm:.1f} s)")
    ref = torch.tensor(prompts(vocab, 1, 16, seed=1), device=DEVICE)
    with torch.inference_mode():  # the tokens ours are checked against (same weights, bf16 both)
        out["greedy_32"] = model.generate(ref, max_new_tokens=32, min_new_tokens=32, do_sample=False,
                                          attention_mask=torch.ones_like(ref))[0, 16:].tolist()
    x = torch.tensor(prompts(vocab, 1, 1024, seed=7), device=DEVICE)
    with torch.inference_mode():
        out["prefill_1024_ms"] = round(cuda_ms(lambda: model(x), runs=5), 2)
    del model
    release_memory()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["smollm2", "llama3-8b"], choices=sorted(SHAPES))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--serve", type=int, default=256, help="concurrent requests of --serve-len in / out (0: skip)")
    ap.add_argument("--serve-len", type=int, nargs="+", default=[128], help="prompt = answer tokens (e.g. 128 1000)")
    ap.add_argument("--skip", nargs="*", default=[], help="hf, ours, hf-eager-batch, hf-static")
    ap.add_argument("--work", type=Path, default=Path("/tmp/gpu-bench"))
    ap.add_argument("--inductor", nargs="*", default=[], metavar="KEY=VALUE", help="torch._inductor.config values")
    ap.add_argument("--unfused", action="store_true",
                    help="ours again with TRTBUILD_FUSED_DECODE=off (no serving): the fused decode layer's A/B")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    inductor_options(args.inductor)
    result: dict = {"environment": environment(), "limits": limits(), "args": vars(args) | {"work": str(args.work)}}
    log(result["environment"], result["limits"])

    def save() -> None:
        if args.json:
            args.json.write_text(json.dumps(result, indent=1, default=str))

    for shape in args.shapes:
        dims = SHAPES[shape]
        row: dict = result.setdefault(shape, {})
        hf_dir = write_hf_dir(shape, args.work / f"{shape}-hf")
        weights = sum(p.stat().st_size for p in hf_dir.glob("*.safetensors"))
        row["weight_bytes"] = weights
        row["ceiling_b1_tok_s"] = round(result["limits"]["copy_tb_s"] * 1e12 / weights, 1)
        if "hf" not in args.skip:
            row["hf"] = hf(hf_dir, args, dims["vocab_size"])
            save()
        if "ours" not in args.skip:
            max_batch = max([*args.batch, args.serve])
            engine = engine_dir(hf_dir, args.work, shape, max_batch, drop_ckpt=shape != "smollm2")
            if shape != "smollm2":
                shutil.rmtree(hf_dir)
            row["ours"] = {}
            ours(engine, args, dims["vocab_size"], row["ours"], save)
            if args.unfused:  # the same engine, steps of few tokens through the compiled layer (fused_decode.py)
                os.environ["TRTBUILD_FUSED_DECODE"] = "off"
                row["ours_unfused"] = {}
                ours(engine, argparse.Namespace(**{**vars(args), "serve": 0}), dims["vocab_size"],
                     row["ours_unfused"], save)
                del os.environ["TRTBUILD_FUSED_DECODE"]
            if "hf" in row:  # bf16 both: the same tokens until a near tie of the random model rounds apart
                a, b = row["ours"]["greedy_32"], row["hf"]["greedy_32"]
                row["greedy_tokens_equal_hf"] = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
                log(f"{shape}: the first {row['greedy_tokens_equal_hf']} of 32 greedy tokens equal HF's")
            for key, t in list(row["ours"].items()):  # serving: the weights' bytes a decode step reads, the FLOPs
                if key.endswith("_timings") and t.get("decode_steps"):
                    stem, ours_row = key.removesuffix("_timings"), row["ours"]
                    read = weights * t["decode_steps"] / t["decode_s"]
                    ours_row[f"{stem}_decode_weights_tb_s"] = round(read / 1e12, 3)
                    ours_row[f"{stem}_tflops"] = round(weights * t["tokens"] / t["wall_s"] / 1e12, 1)  # 2 x bf16 params
            b1 = row["ours"].get("decode_b1_tok_s")
            if b1:
                row["ours"]["b1_of_ceiling"] = round(b1 / row["ceiling_b1_tok_s"], 3)
                row["ours"]["b1_achieved_tb_s"] = round(b1 * weights / 1e12, 3)
            save()
    save()
    print("\nshape      | ours b1 (async) | HF eager b1 | HF static b1 | ours b64 (async) | HF static b64 | ceiling b1 "
          "| ttft 1024 ms")
    for shape in args.shapes:
        r, h = result[shape], result[shape].get("hf", {})
        for name, o in (("", r.get("ours", {})), (" unfused", r.get("ours_unfused"))):
            if o is None:
                continue
            print(f"{shape + name:10} | {o.get('decode_b1_tok_s')} ({o.get('async_decode_b1_tok_s')}) | "
                  f"{h.get('eager_b1_tok_s')} | {h.get('static_b1_tok_s')} | {o.get('decode_b64_tok_s')} "
                  f"({o.get('async_decode_b64_tok_s')}) | {h.get('static_b64_tok_s')} | {r['ceiling_b1_tok_s']} | "
                  f"{o.get('ttft_1024_ms')} (HF prefill {h.get('prefill_1024_ms')})")


if __name__ == "__main__":
    main()

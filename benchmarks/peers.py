"""Our CPU twin against its best peers on SmolLM2-135M: decode, prefill, batch-8 decode, peak RSS, fidelity.

    python benchmarks/peers.py [--systems ours-fp32 genai-int4 ...] [--runs 5] [--new-tokens 128]
                               [--threads N] [--gap 1.0] [--work build/bench-peers] [--json]

Every system starts from the bundled Q4_1 GGUF and is made here if missing (benchmarks/peers_build.py:
ours via convert + build, onnxruntime-genai via its own model builder, llama.cpp on the file itself).
Rules (issue 22):
  - the same prompt token ids for every system (the shipped eval text's first --prompt-tokens ids),
    exactly --new-tokens new tokens with EOS ignored, greedy, the same --threads everywhere;
  - each system is loaded and warmed up in its own process (benchmarks/peers_worker.py) before any timing;
  - runs go round-robin over the systems with --gap seconds idle before each, and every figure is the
    median over --runs;
  - decode tok/s = (N - 1) / (t_N - t_1), t_k the time the k-th new token was in hand (prefill excluded);
    batch 8: 8 copies of the prompt at once, aggregate = 8 (N - 1) / (t_N - t_1);
    prefill tok/s = --prefill-tokens / (time from the ids to the first token's logits);
  - "others" is the CPU the rest of the machine used during each timed run, in cores: /proc/stat's busy
    time minus the worker's own (/proc/PID/stat), over the run's wall time (median of the runs); with
    others near 0 the figures are a quiet machine's, above ~0.2 of a core they are noisy;
  - peak RSS: the worker's VmHWM after load, warm-up and every timed run;
  - fidelity of every quantized system against our fp32 twin (the GGUF dequantized, so for `--quant gguf`
    it is its exactness) on the same --fidelity-tokens ids of the shipped eval text in windows of
    --context: mean KL(fp32 || system), top-1 agreement and perplexity ratio, from each system's own
    per-position logits (onnxruntime-genai: its ONNX model in onnxruntime; llama.cpp: logits_all).
Also printed: the machine's streaming-read bandwidth (benchmarks/stream_read.py) with --threads, each
system's weight bytes read per token, and the fp32 twin's share of the bandwidth ceiling.
Results also go to benchmarks/results/peers-<date>.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.append(str(HERE))  # after the repo root: benchmarks/passes.py would shadow passes/

from peers_build import DEFAULT_SYSTEMS, SYSTEMS, artifact, weight_bytes  # noqa: E402

from engine_builder.cli.huge_pages import decoding_environment  # noqa: E402

HZ = os.sysconf("SC_CLK_TCK")


def busy_jiffies() -> int:
    """All CPUs' non-idle time so far (user nice system irq softirq steal), from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields[:3]) + sum(fields[5:8])


def own_jiffies(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime


class Worker:
    def __init__(self, name: str, path: Path, threads: int, context: int, warmup: dict, logits_all: bool = False):
        s = SYSTEMS[name]
        argv = [sys.executable, str(HERE / "peers_worker.py"), s.kind, str(path), "--threads", str(threads),
                "--context", str(context), "--warmup", json.dumps(warmup)] + (["--logits-all"] if logits_all else [])
        self.name = name
        env = {**os.environ,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))}
        if s.kind == "ours":  # as `trtbuild run` starts: onnxruntime's weights in huge pages (cli/huge_pages.py)
            env = decoding_environment(env)
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1, env=env)
        ready = self.proc.stdout.readline()
        if not ready:
            raise SystemExit(f"{name}: its worker exited while loading (its stderr is above)")
        ready = json.loads(ready)
        self.pid = ready["pid"]
        # onnxruntime's spin-waiting, as the worker opened (ours: the auto rule read the load average then)
        self.spinning, self.load_average = ready.get("spinning", "-"), ready.get("load_average")

    def ask(self, **cmd) -> tuple[dict, float]:
        """Send a command; (its answer, the other processes' CPU during it, in cores)."""
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        busy, own, started = busy_jiffies(), own_jiffies(self.pid), time.perf_counter()
        line = self.proc.stdout.readline()
        wall = time.perf_counter() - started
        others = (busy_jiffies() - busy - (own_jiffies(self.pid) - own)) / HZ / wall
        if not line:
            raise SystemExit(f"{self.name}: its worker died on {cmd['op']}")
        return json.loads(line), max(others, 0.0)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def eval_ids(work: Path, fp32_engine: Path, count: int) -> list[int]:
    from engine_builder.eval.text import load_text
    from engine_builder.runner.engine import EngineDir

    tokenizer = EngineDir.load(fp32_engine).load_tokenizer()
    ids = tokenizer(load_text(None).text, add_special_tokens=False, verbose=False)["input_ids"]
    if len(ids) < count:
        raise SystemExit(f"the shipped eval text has {len(ids)} tokens; --prefill-tokens {count} needs more")
    return ids[:count]


def windows_of(fp32_engine: Path, max_tokens: int, context: int) -> list[list[int]]:
    from engine_builder.eval.text import load_text, token_windows
    from engine_builder.runner.engine import EngineDir

    tokenizer = EngineDir.load(fp32_engine).load_tokenizer()
    return [w.tolist() for w in token_windows(tokenizer, load_text(None), max_tokens, context)]


def fidelity(reference: np.ndarray, model: np.ndarray, targets: np.ndarray) -> dict:
    rows = np.arange(len(targets))
    kl = (np.exp(reference) * (reference - model)).sum(-1)
    ppl = float(np.exp(-model[rows, targets].mean()))
    return {"kl": float(kl.mean()), "top1": float((reference.argmax(-1) == model.argmax(-1)).mean()),
            "ppl": ppl, "ppl_ratio": ppl / float(np.exp(-reference[rows, targets].mean()))}


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return f"{cpu}, {os.cpu_count()} CPUs visible, {platform.system()} {platform.release()}"


def versions() -> dict:
    import importlib.metadata as md

    out = {}
    for pkg in ("onnxruntime", "onnxruntime-genai", "llama-cpp-python", "transformers", "torch"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def main() -> None:
    from engine_builder.util.cpu_cores import physical_cores

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--systems", nargs="+", default=DEFAULT_SYSTEMS, choices=sorted(SYSTEMS))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--prefill-tokens", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None, help="for every system (default: physical cores)")
    parser.add_argument("--gap", type=float, default=1.0, help="idle seconds before each timed run")
    parser.add_argument("--fidelity-tokens", type=int, default=512)
    parser.add_argument("--context", type=int, default=128, help="fidelity window length")
    parser.add_argument("--skip", nargs="*", default=[], choices=["prefill", "batch", "fidelity"])
    parser.add_argument("--work", type=Path, default=Path("build/bench-peers"))
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    threads = args.threads or physical_cores()
    n, batch = args.new_tokens, args.batch
    # KV room for the longest prompt and at least 128 new tokens: shorter --new-tokens reuse the same engines
    max_seq = max(args.prefill_tokens, args.prompt_tokens) + max(n, 128)
    args.work.mkdir(parents=True, exist_ok=True)

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    names = list(dict.fromkeys(args.systems))
    say(f"making what is missing under {args.work} ...")
    paths = {s: artifact(args.work, s, max_seq, args.prefill_tokens, batch) for s in names}
    fp32 = artifact(args.work, "ours-fp32", max_seq, args.prefill_tokens, batch)
    long_ids = eval_ids(args.work, fp32, args.prefill_tokens)
    prompt = long_ids[:args.prompt_tokens]

    def stream_read() -> float:
        say(f"streaming-read bandwidth, {threads} threads ...")
        return json.loads(subprocess.run([sys.executable, str(HERE / "stream_read.py"), "--threads", str(threads)],
                                         capture_output=True, text=True, check=True,
                                         env={**os.environ, "OPENBLAS_NUM_THREADS": "1"}).stdout)["gb_s"]

    bandwidths = [stream_read()]  # again after the timed runs: the better of the two (load only lowers it)

    workers = {}
    for s in names:  # one at a time: loading one system does not slow another's warm-up
        say(f"loading and warming up {s} ...")
        workers[s] = Worker(s, paths[s], threads, max_seq, {"prompt": prompt, "n": 8})
    spinning = {s: {"spinning": w.spinning, "load_average_at_open": w.load_average} for s, w in workers.items()}
    timed: dict[str, dict[str, list[float]]] = {s: {} for s in names}

    def record(s: str, key: str, value: float, others: float) -> None:
        timed[s].setdefault(key, []).append(value)
        timed[s].setdefault(f"{key}_others", []).append(others)

    try:
        for run in range(args.runs):
            say(f"run {run + 1}/{args.runs}")
            for s in names:
                w = workers[s]
                time.sleep(args.gap)
                a, others = w.ask(op="generate", prompts=[prompt], n=n)
                record(s, "decode", (n - 1) / (a["times"][-1] - a["times"][0]), others)
                if "prefill" not in args.skip:
                    time.sleep(args.gap)
                    a, others = w.ask(op="prefill", prompt=long_ids)
                    record(s, "prefill", len(long_ids) / a["seconds"], others)
                if "batch" not in args.skip and SYSTEMS[s].kind != "llama.cpp":
                    time.sleep(args.gap)
                    a, others = w.ask(op="generate", prompts=[prompt] * batch, n=n)
                    record(s, "batch", batch * (n - 1) / (a["times"][-1] - a["times"][0]), others)
        rss = {s: workers[s].ask(op="rss")[0]["peak_rss_bytes"] for s in names}
        bandwidths.append(stream_read())
        scores = {}
        if "fidelity" not in args.skip:
            windows = windows_of(fp32, args.fidelity_tokens, args.context)
            targets = np.concatenate([np.asarray(w[1:]) for w in windows])
            lp_dir = args.work / "log-probs"
            lp_dir.mkdir(exist_ok=True)

            def log_probs(s: str) -> np.ndarray:
                say(f"fidelity: {s} ...")
                if SYSTEMS[s].kind == "llama.cpp":  # its every-position logits need a model opened with logits_all
                    w = Worker(s, paths[s], threads, max(len(x) for x in windows), {"prompt": prompt, "n": 1}, True)
                else:
                    w = workers.get(s) or Worker(s, artifact(args.work, s, max_seq, args.prefill_tokens, batch),
                                                 threads, max_seq, {"prompt": prompt, "n": 1})
                w.ask(op="log_probs", windows=windows, out=str(lp_dir / f"{s}.npy"))
                if w is not workers.get(s):
                    w.close()
                return np.load(lp_dir / f"{s}.npy")

            reference = log_probs("ours-fp32")
            for s in names:
                if s != "ours-fp32":  # the float peers too: their KL is the check that the windows line up
                    scores[s] = fidelity(reference, log_probs(s), targets)
    finally:
        for w in workers.values():
            w.close()

    bw = max(bandwidths)

    def median(s: str, key: str) -> float | None:
        values = timed[s].get(key)
        return statistics.median(values) if values else None

    rows = {}
    for s in names:
        decode = median(s, "decode")
        rows[s] = {"label": SYSTEMS[s].label, "decode_tok_s": decode, "decode_runs": timed[s]["decode"],
                   "decode_others_cores": median(s, "decode_others"),
                   "prefill_tok_s": median(s, "prefill"), "prefill_others_cores": median(s, "prefill_others"),
                   "batch_tok_s": median(s, "batch"), "batch_others_cores": median(s, "batch_others"),
                   "peak_rss_mb": rss[s] / 1e6, "weight_mb": weight_bytes(paths[s]) / 1e6,
                   "ceiling_share": decode * weight_bytes(paths[s]) / (bw * 1e9), **spinning[s],
                   **({"fidelity": scores[s]} if s in scores else {})}
    report = {"machine": machine(), "versions": versions(), "threads": threads, "new_tokens": n,
              "prompt_tokens": len(prompt), "prefill_tokens": len(long_ids), "batch": batch, "runs": args.runs,
              "gap_s": args.gap, "stream_read_gb_s": bw, "stream_read_runs_gb_s": bandwidths,
              "fidelity_tokens": args.fidelity_tokens,
              "context": args.context, "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "systems": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"peers-{report['date'][:16].replace(':', '')}.json"
    out.write_text(json.dumps(report, indent=1))
    if args.json:
        print(json.dumps(report))
        return
    print(table(report))
    print(f"(written to {out})")


def table(r: dict) -> str:
    def f(v, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    lines = [f"SmolLM2-135M-Instruct from the bundled Q4_1 GGUF; {r['machine']}",
             f"{r['threads']} threads, batch 1 decode of {r['new_tokens']} tokens after a {r['prompt_tokens']}-token "
             f"prompt, prefill of {r['prefill_tokens']}, batch {r['batch']}; medians of {r['runs']} round-robin runs; "
             f"streaming read {r['stream_read_gb_s']:.1f} GB/s",
             f"{'system':<48} {'decode':>7} {'others':>6} {'prefill':>8} {'batch':>7} {'RSS MB':>7} {'W MB':>6} "
             f"{'ceil':>5} {'KL':>8} {'top-1':>6} {'ppl x':>6}"]
    for row in r["systems"].values():
        fid = row.get("fidelity", {})
        lines.append(f"{row['label']:<48} {f(row['decode_tok_s'], '7.1f')} {f(row['decode_others_cores'], '6.2f')} "
                     f"{f(row['prefill_tok_s'], '8.0f')} {f(row['batch_tok_s'], '7.1f')} {row['peak_rss_mb']:>7.0f} "
                     f"{row['weight_mb']:>6.0f} {row['ceiling_share']:>5.2f} {f(fid.get('kl'), '8.5f')} "
                     f"{f(fid.get('top1'), '6.3f')} {f(fid.get('ppl_ratio'), '6.3f')}")
    lines.append("decode, prefill, batch: tok/s (batch: aggregate); others: cores used by other processes during the "
                 "decode runs; W MB: weight bytes read per token; ceil: decode x W / streaming read (1.0 = the "
                 "bandwidth ceiling); KL, top-1, ppl x: against our fp32 twin on the shipped eval text")
    spins = [f"{s} {row['spinning']} (load {row['load_average_at_open']:.1f})" for s, row in r["systems"].items()
             if row.get("spinning", "-") != "-"]
    if spins:  # a 5 ms int4 step is ~300 kernels: spinning or not moves it by 10-30 %, so say which each had
        lines.append("onnxruntime threads spin-waiting, as each worker opened (1-minute load average then): "
                     + ", ".join(spins))
    return "\n".join(lines)


if __name__ == "__main__":
    main()

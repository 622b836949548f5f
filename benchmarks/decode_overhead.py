"""Where our decode step's time goes against onnxruntime-genai's model, in one process (float32 or int4).

    python benchmarks/decode_overhead.py [--threads 1 2] [--tokens 128] [--rounds 5] [--prompt-tokens 32]
                                         [--ours ENGINE_DIR ...] [--genai MODEL_DIR] [--work build/bench-peers]
                                         [--int4 ours-int4-same] [--unpacked] [--profile] [--json]

By default both models are benchmarks/peers.py's, made if missing from the bundled SmolLM2 Q4_1 GGUF
(benchmarks/peers_build.py: our fp32 twin via convert + build, onnxruntime-genai's via its own model
builder on the dequantized GGUF); --ours takes several engine dirs (an A/B of two builds). --int4 SYSTEM
compares peers.py's int4 SYSTEM (ours-int4-same: int4_awq g32 with an int4 lm_head, genai's bytes) with
onnxruntime-genai's int4 model (block 32, accuracy level 4) instead. All run on the same onnxruntime.
Per decoded token, at each --threads:
  (i)   ours bare: session.run_with_iobinding on our step graph, the LLM's own session and decode binding;
        per step only the position and the cache length are written (the cache bound in place)
  (i')  with --unpacked: the same on model.onnx packed at load instead of the prepacked twin
  (ii)  ours backend.step: bind + execute + read_logits + argmax + kv.advance (runner/ort_backend.py)
  (iii) ours LLM: the generator loop as benchmarks/peers.py times it (sampler, stop checks, detokenizer)
  (v)   genai's graph in loop (i), with our session options (its cache bound in place too, as its
        past_present_share_buffer does; its attention_mask rebound per step, as genai does)
  (v')  the same with onnxruntime's default session options (genai's)
  (iv)  genai's own loop: og.Generator.generate_next_token, as benchmarks/peers.py times it
(i) - (v) is the graph alone; (ii) - (i) and (iii) - (ii) are our Python per token; (iv) - (v') is
genai's loop. Each figure is the median over --rounds; every loop runs once per round, in one order
then the reverse. Wall and process CPU time (time.process_time: every thread of this process,
spinning included). The bare loops start at --prompt-tokens cached positions (zeros: attention's cost
depends on the lengths, not the values) and decode --tokens steps; the generate loops prefill the
eval text's first --prompt-tokens ids. --profile adds onnxruntime's profiler over each bare loop: ms
per step and node count per op type (If's own time, without the branch it ran) and the run's time
outside kernels, and MatMulNBits' median kernel time per shape (K x N): the same shape on both sides is the
same MLAS kernel, so a difference there is the weights' layout or memory, not the graph. The profiler adds
a fixed cost per node, so it magnifies what node counts cost.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.append(str(HERE))  # after the repo root: benchmarks/passes.py would shadow passes/

from peers_build import SYSTEMS, artifact  # noqa: E402

TITLES = {"bare": "(i) bare run_with_iobinding", "unpacked": "(i') bare, model.onnx packed at load",
          "step": "(ii) backend.step", "llm": "(iii) LLM generator loop",
          "genai_bare": "(v) genai graph, our loop and options", "genai_defaults": "(v') same, onnxruntime defaults",
          "genai_loop": "(iv) genai generate_next_token"}


class Clock:
    """Wall and CPU seconds since creation."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def lap(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall, time.process_time() - self.cpu


class OursBare:
    """Our step graph in a bare loop: the LLM's own session and decode binding (slot 0, one row)."""

    def __init__(self, backend, prompt_tokens: int) -> None:
        self.backend, self.start = backend, prompt_tokens
        self.kv_slot = None

    def run(self, n: int) -> tuple[float, float]:
        b = self.backend
        b.kv.lengths[0] = self.start
        b.bind(0, np.zeros((1, 1), np.int64))  # the cached decode binding
        binding = b._bound[0]
        session, pos, lengths = b.session, b._pos, b.kv.lengths
        clock = Clock()
        for t in range(n):
            pos[0] = lengths[0] = self.start + t
            session.run_with_iobinding(binding)
        lap = clock.lap()
        b.kv.lengths[0] = 0
        return lap


class GenaiBare:
    """genai's graph in the same bare loop, its cache shared in place ([1, kv_heads, max_seq, head_dim])."""

    def __init__(self, model_dir: Path, options, max_seq: int, prompt_tokens: int) -> None:
        import onnxruntime as ort

        self.session = ort.InferenceSession(str(model_dir / "model.onnx"), options,
                                            providers=["CPUExecutionProvider"])
        decoder = json.loads((model_dir / "genai_config.json").read_text())["model"]["decoder"]
        shape = (1, decoder["num_key_value_heads"], max_seq, decoder["head_size"])
        self.cache = [np.zeros(shape, np.float32) for _ in range(2 * decoder["num_hidden_layers"])]
        self.ids = np.zeros((1, 1), np.int64)
        self.mask = np.ones((1, max_seq), np.int64)
        self.logits = np.zeros((1, 1, decoder.get("vocab_size", 49152)), np.float32)
        vocab = self.session.get_outputs()[0].shape[-1]
        if isinstance(vocab, int):
            self.logits = np.zeros((1, 1, vocab), np.float32)
        self.start = prompt_tokens
        b = self.binding = self.session.io_binding()
        b.bind_input("input_ids", "cpu", 0, np.int64, self.ids.shape, self.ids.ctypes.data)
        for i in range(decoder["num_hidden_layers"]):
            for j, kind in enumerate(("key", "value")):
                buf = self.cache[2 * i + j]
                b.bind_input(f"past_key_values.{i}.{kind}", "cpu", 0, np.float32, shape, buf.ctypes.data)
                b.bind_output(f"present.{i}.{kind}", "cpu", 0, np.float32, shape, buf.ctypes.data)
        b.bind_output("logits", "cpu", 0, np.float32, self.logits.shape, self.logits.ctypes.data)

    def run(self, n: int) -> tuple[float, float]:
        b, mask = self.binding, self.mask
        clock = Clock()
        for t in range(n):
            b.bind_input("attention_mask", "cpu", 0, np.int64, (1, self.start + t + 1), mask.ctypes.data)
            self.session.run_with_iobinding(b)
        return clock.lap()


class OursStep:
    def __init__(self, backend, prompt_tokens: int) -> None:
        self.backend, self.start = backend, prompt_tokens

    def run(self, n: int) -> tuple[float, float]:
        b = self.backend
        slot = b.kv.allocate("decode_overhead", self.start, n)
        b.kv.lengths[slot] = self.start
        ids = np.zeros((1, 1), np.int64)
        clock = Clock()
        for _ in range(n):
            ids[0, 0] = int(b.step(slot, ids)[0].argmax())
            b.kv.advance(slot, 1)
        lap = clock.lap()
        b.release(slot)
        return lap


class OursLLM:
    """benchmarks/peers_systems.Ours's loop: per-token from the first token's time to the last's."""

    def __init__(self, llm, prompt: list[int]) -> None:
        self.llm, self.prompt = llm, prompt

    def run(self, n: int) -> tuple[float, float]:
        from engine_builder import SamplingParams

        params = [SamplingParams(max_new_tokens=n + 1, temperature=0.0, ignore_eos=True)]
        _, events = self.llm.generator.start([self.prompt], params)
        clock = None
        for _ in events:
            if clock is None:  # the first token: prefill done
                clock = Clock()
        return clock.lap()


class GenaiLoop:
    def __init__(self, model, og, prompt: list[int]) -> None:
        self.model, self.og, self.prompt = model, og, prompt

    def run(self, n: int) -> tuple[float, float]:
        og = self.og
        params = og.GeneratorParams(self.model)
        length = len(self.prompt) + n + 1
        params.set_search_options(do_sample=False, max_length=length, min_length=length, batch_size=1)
        generator = og.Generator(self.model, params)
        generator.append_tokens(np.asarray([self.prompt], np.int32))
        generator.generate_next_token()  # the first token: prefill done
        clock = Clock()
        for _ in range(n):
            generator.generate_next_token()
        lap = clock.lap()
        del generator
        return lap


def genai_model(model_dir: Path, threads: int):
    """genai's model with THREADS intra-op threads (its genai_config.json, as peers_systems.OrtGenAI sets it)."""
    import onnxruntime_genai as og

    config_path = model_dir / "genai_config.json"
    config = json.loads(config_path.read_text())
    options = config["model"]["decoder"].setdefault("session_options", {})
    if options.get("intra_op_num_threads") != threads or options.get("inter_op_num_threads") != 1:
        options.update(intra_op_num_threads=threads, inter_op_num_threads=1)
        config_path.write_text(json.dumps(config, indent=4))
    return og, og.Model(str(model_dir))


def default_options(threads: int, profile: bool = False):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads, options.log_severity_level = threads, 1, 3
    return _profiled(options) if profile else options


def _profiled(options):
    options.enable_profiling = True
    options.profile_file_prefix = str(Path(tempfile.gettempdir()) / f"decode-overhead-{os.getpid()}")
    return options


def open_backend(engine: Path, threads: int, profile: bool = False, unpacked: bool = False):
    """The twin's OrtBackend as LLM opens it (the prepacked graph), or from model.onnx packed at load."""
    import onnxruntime as ort

    import engine_builder.runner.ort_backend as ort_backend
    from engine_builder.runner.engine import EngineDir

    plain = ort_backend.session_options
    if profile:
        ort_backend.session_options = lambda *a, **k: _profiled(plain(*a, **k))
    try:
        level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL if unpacked else None
        return ort_backend.OrtBackend(EngineDir.load(engine), threads=threads, optimization_level=level)
    finally:
        ort_backend.session_options = plain


def measure(threads: int, args, prompt: list[int]) -> dict:
    from spin_policy import same_spinning

    # one auto decision for every session of this measurement: "our options" are then the same for (i) and (v)
    with same_spinning(threads, take_turns=False):
        return _measure(threads, args, prompt)


def _measure(threads: int, args, prompt: list[int]) -> dict:
    import engine_builder.runner.ort_backend as ort_backend
    from engine_builder import LLM

    loops: dict[str, object] = {}
    max_seq = 0
    for engine in args.ours:
        llm = LLM(engine, backend="onnxruntime", threads=threads, prefix_cache=False)
        max_seq = max(max_seq, llm.backend.kv.max_seq)
        loops[f"{engine.name}:bare"] = OursBare(llm.backend, len(prompt))
        if args.unpacked:
            loops[f"{engine.name}:unpacked"] = OursBare(open_backend(engine, threads, unpacked=True), len(prompt))
        loops[f"{engine.name}:step"] = OursStep(llm.backend, len(prompt))
        loops[f"{engine.name}:llm"] = OursLLM(llm, prompt)
    options = ort_backend.session_options("float32", threads)
    loops["genai:genai_bare"] = GenaiBare(args.genai, options, max_seq, len(prompt))
    loops["genai:genai_defaults"] = GenaiBare(args.genai, default_options(threads), max_seq, len(prompt))
    og, model = genai_model(args.genai, threads)
    loops["genai:genai_loop"] = GenaiLoop(model, og, prompt)
    for loop in loops.values():  # warm-up: first runs allocate and page in
        loop.run(8)
    names = list(loops)
    samples: dict[str, list[tuple[float, float]]] = {k: [] for k in names}
    for r in range(args.rounds):
        for k in names if r % 2 == 0 else reversed(names):
            samples[k].append(loops[k].run(args.tokens))
    n = args.tokens
    result = {"threads": threads, "spinning": options.get_session_config_entry("session.intra_op.allow_spinning"),
              "loops": {k: {"wall_ms": statistics.median(w for w, _ in v) * 1000 / n,
                            "cpu_ms": statistics.median(c for _, c in v) * 1000 / n,
                            "wall_runs_ms": [w * 1000 / n for w, _ in v]} for k, v in samples.items()}}
    if args.profile:
        profiles = {}
        for engine in args.ours:
            backend = open_backend(engine, threads, profile=True)
            profiles[engine.name] = op_profile(backend.session, OursBare(backend, len(prompt)), n)
        genai = GenaiBare(args.genai, _profiled(ort_backend.session_options("float32", threads)), max_seq, len(prompt))
        profiles["genai"] = op_profile(genai.session, genai, n)
        result["profile"] = profiles
    return result


def op_profile(session, loop, n: int) -> dict:
    """onnxruntime's profiler over N steps of a bare loop: ms per step per op type, nodes per step."""
    loop.run(4)  # warm
    loop.run(n)
    path = session.end_profiling()
    events = json.loads(Path(path).read_text())
    Path(path).unlink()
    runs = [e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"][-n:]
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
             and e["ts"] >= runs[0]["ts"]]
    per_op: dict[str, float] = collections.defaultdict(float)
    count: dict[str, int] = collections.defaultdict(int)
    shapes: dict[str, list[float]] = collections.defaultdict(list)  # MatMulNBits "K x N" -> kernel us per call
    for e in nodes:
        op = e["args"].get("op_name", "?")
        per_op[op] += e["dur"]
        count[op] += 1
        if op == "MatMulNBits":
            shapes[_nbits_shape(e["args"])].append(e["dur"])
    if "If" in per_op:  # an If's time includes the branch it ran, whose nodes are profiled too: keep its own
        per_op["If"] -= sum(e["dur"] for e in nodes if "/gqa/" in e["name"] or "/fallback/" in e["name"])
    kernels, run_us = sum(per_op.values()), sum(r["dur"] for r in runs)
    ops = {op: {"ms": us / 1000 / n, "nodes": count[op] // n}
           for op, us in sorted(per_op.items(), key=lambda kv: -kv[1])}
    return {"run_ms": run_us / 1000 / n, "kernel_ms": kernels / 1000 / n,
            "outside_kernels_ms": (run_us - kernels) / 1000 / n, "ops": ops,
            "matmulnbits_us": {k: {"median_us": statistics.median(v), "per_step": len(v) // n}
                               for k, v in sorted(shapes.items())}}


def _nbits_shape(args: dict) -> str:
    """"K x N" of a profiled MatMulNBits (its activation's last dim, its output's)."""
    def last(shapes: list) -> int:
        return next(iter(shapes[0].values()))[-1] if shapes else 0

    return f"{last(args.get('input_type_shape', []))} x {last(args.get('output_type_shape', []))}"


def table(results: list[dict]) -> str:
    lines = []
    for r in results:
        loops = r["loops"]
        lines.append(f"{r['threads']} thread(s), spinning {'on' if r['spinning'] == '1' else 'off'}: ms per token "
                     "(median of rounds), wall / process CPU")
        for key, v in loops.items():
            system, kind = key.split(":")
            lines.append(f"  {system:<28} {TITLES[kind]:<40} {v['wall_ms']:7.2f} {v['cpu_ms']:7.2f}")
        genai = {k.split(":")[1]: v["wall_ms"] for k, v in loops.items() if k.startswith("genai:")}
        for system in dict.fromkeys(k.split(":")[0] for k in loops if not k.startswith("genai:")):
            w = {k.split(":")[1]: v["wall_ms"] for k, v in loops.items() if k.startswith(system + ":")}
            lines.append(f"  {system}: graph (i)-(v) {w['bare'] - genai['genai_bare']:+.2f} ms; our Python (ii)-(i) "
                         f"{w['step'] - w['bare']:+.2f}, (iii)-(ii) {w['llm'] - w['step']:+.2f}; genai's loop "
                         f"(iv)-(v') {genai['genai_loop'] - genai['genai_defaults']:+.2f}; tok/s ours / genai "
                         f"(iv)/(iii) {genai['genai_loop'] / w['llm']:.3f}x")
        for name, p in r.get("profile", {}).items():
            lines.append(f"  profile {name}: {p['run_ms']:.2f} ms/step in the run, {p['kernel_ms']:.2f} in kernels, "
                         f"{p['outside_kernels_ms']:.2f} outside")
            for op, o in p["ops"].items():
                lines.append(f"    {op:<34} {o['ms']:7.3f} ms {o['nodes']:5d} nodes")
            for shape, o in p.get("matmulnbits_us", {}).items():
                lines.append(f"    MatMulNBits K x N = {shape:<14} {o['median_us']:8.1f} us median, "
                             f"{o['per_step']:3d} per step")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--work", type=Path, default=Path("build/bench-peers"))
    parser.add_argument("--ours", type=Path, nargs="+", help="engine dirs (default: peers.py's fp32 twin)")
    parser.add_argument("--genai", type=Path, help="onnxruntime-genai model dir (default: peers.py's fp32 one)")
    parser.add_argument("--int4", choices=sorted(s for s in SYSTEMS if s.startswith("ours-int4")),
                        help="compare this int4 system of peers.py with onnxruntime-genai int4 (default: float32)")
    parser.add_argument("--unpacked", action="store_true", help="also time each engine's model.onnx packed at load")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    # peers.py's artifacts (KV room for a 512-token prefill and 128 new tokens, batch 8), made if missing
    args.ours = args.ours or [artifact(args.work, args.int4 or "ours-fp32", 640, 512, 8)]
    args.genai = args.genai or artifact(args.work, "genai-int4" if args.int4 else "genai-fp32", 640, 512, 8)
    from peers import eval_ids

    prompt = eval_ids(args.work, args.ours[0], args.prompt_tokens)
    results = [measure(t, args, prompt) for t in args.threads]
    report = {"load_average": os.getloadavg(), "tokens": args.tokens, "rounds": args.rounds, "results": results}
    print(json.dumps(report) if args.json else table(results))


if __name__ == "__main__":
    main()

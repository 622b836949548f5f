"""Decode-step latency of the SmolLM2-shaped decoder in onnxruntime: unfused vs fused vs ORT-lowered.

    .venv/bin/python benchmarks/ort_lowering.py [--steps 40] [--past 64] [--batch 1 8]
                                                [--levels basic all] [--json]

A random-weight LlamaConfig of SmolLM2-135M's shape (30 layers, hidden 576, 9/3 heads, tied
49152-token embedding) is saved with save_pretrained, converted with `converters.convert`, and
emitted with max_seq_len 512. Three graphs are timed, each at graph optimization level BASIC and
ALL (--levels), intra_op_num_threads=2, one new token per sequence over a cache of `past` tokens
(lengths stay put, so every timed step does the same work):
  unfused  the emitter's portable graph
  fused    + the fusion passes (RMSNormalization, RotaryEmbedding, TensorScatter, Attention-24)
  lowered  + lower_ort_norms + lower_ort_attention (GroupQueryAttention)
Inputs and caches are bound once (IO binding) so the figure is onnxruntime's own work: "copy"
binds present_* to a second buffer (the graph copies the whole cache each step), "shared" binds
past_* and present_* to the same OrtValue (in place). The first step of every configuration is
checked against the unfused graph at ORT_DISABLE_ALL (max |logits diff|, max |cache diff|).
Configurations run round-robin, one step at a time, so load from elsewhere hits all alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import passes  # noqa: E402,F401  (registers every pass)
from converters.convert import convert  # noqa: E402
from engine_builder.network import NetworkOptions, write_onnx  # noqa: E402
from passes.base import PassManager  # noqa: E402

FUSIONS = ["fold_constants", "remove_redundant_ops", "fuse_rms_norm", "fuse_rotary", "fuse_kv_cache_update",
           "fuse_attention", "fuse_attention_softcap", "eliminate_dead_code"]
ORT_LOWERING = ["lower_ort_norms", "lower_ort_attention"]
LEVELS = {"disable_all": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
          "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
          "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
MAX_SEQ = 512


def build_graphs(work: Path) -> dict[str, Path]:
    import torch
    import transformers

    cfg = transformers.LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                                   tie_word_embeddings=True)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).eval().save_pretrained(work / "hf")
    convert(work / "hf", work / "ckpt")
    unfused = write_onnx(work / "ckpt", work / "engine", NetworkOptions(max_seq_len=MAX_SEQ))
    paths = {"unfused": unfused}
    model = ir.load(unfused)
    for name, names in (("fused", FUSIONS), ("lowered", ORT_LOWERING)):
        PassManager(names).run(model)
        paths[name] = unfused.with_name(f"{name}.onnx")  # beside rank0.safetensors
        ir.save(model, paths[name])
    return paths


def session(path: Path, level: str) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = LEVELS[level]
    opts.intra_op_num_threads = 2
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def first_feeds(sess: ort.InferenceSession, batch: int, past: int) -> dict[str, np.ndarray]:
    """A cache of `past` random tokens per sequence (zeros above, as graph_io asks) and one new token."""
    rng = np.random.default_rng(batch)
    feeds: dict[str, np.ndarray] = {}
    for inp in sess.get_inputs():
        if inp.name.startswith(("past_key.", "past_value.")):
            cache = np.zeros([batch, *inp.shape[1:]], np.float32)
            cache[:, :, :past] = rng.standard_normal(cache[:, :, :past].shape) * 0.5
            feeds[inp.name] = cache
    lengths = np.full(batch, past, np.int64)
    feeds.update(input_ids=rng.integers(0, 49152, (batch, 1)), position_ids=lengths[:, None].copy(),
                 past_lengths=lengths)
    return feeds


class Stepper:
    """One configuration's decode loop over IO-bound buffers."""

    def __init__(self, sess: ort.InferenceSession, feeds: dict[str, np.ndarray], shared: bool):
        self.sess, self.shared, self.io = sess, shared, sess.io_binding()
        self.names = [k for k in feeds if k.startswith(("past_key.", "past_value."))]
        self.bufs = {k: ort.OrtValue.ortvalue_from_numpy(feeds[k].copy()) for k in self.names}
        self.spare = {k: ort.OrtValue.ortvalue_from_numpy(np.zeros_like(feeds[k])) for k in self.names}
        self.ids, self.lengths = feeds["input_ids"], feeds["past_lengths"].copy()
        self.rng = np.random.default_rng(0)

    def step(self) -> tuple[float, np.ndarray, dict[str, ort.OrtValue]]:
        io = self.io
        io.bind_cpu_input("input_ids", self.ids)
        io.bind_cpu_input("position_ids", self.lengths[:, None].copy())
        io.bind_cpu_input("past_lengths", self.lengths)
        io.bind_output("logits")
        for k in self.names:
            io.bind_ortvalue_input(k, self.bufs[k])
            io.bind_ortvalue_output(k.replace("past_", "present_"), self.bufs[k] if self.shared else self.spare[k])
        start = time.perf_counter()
        self.sess.run_with_iobinding(io)
        elapsed = time.perf_counter() - start
        if not self.shared:
            self.bufs, self.spare = self.spare, self.bufs
        logits = io.get_outputs()[0].numpy()
        # lengths stay put: every timed step attends over the same past tokens (and rewrites one slot)
        self.ids = self.rng.integers(0, 49152, self.ids.shape)
        return elapsed, logits, self.bufs


@dataclass
class Result:
    graph: str
    level: str
    binding: str
    batch: int
    median_ms: float
    p10_ms: float  # the low end: least disturbed by other load on the machine
    logits_diff: float
    cache_diff: float


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="timed decode steps per configuration (>= 20)")
    parser.add_argument("--past", type=int, default=64)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--levels", nargs="+", default=["basic", "all"], choices=sorted(LEVELS))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="ort_lowering.") as tmp:
        paths = build_graphs(Path(tmp))
        reference = session(paths["unfused"], "disable_all")
        sessions = {(graph, level): session(path, level) for graph, path in paths.items() for level in args.levels}
        for batch in args.batch:
            feeds = first_feeds(reference, batch, args.past)
            expected = dict(zip([o.name for o in reference.get_outputs()], reference.run(None, feeds)))
            steppers: dict[tuple[str, str, str], Stepper] = {}
            for (graph, level), sess in sessions.items():
                # TensorScatter (fused) and GQA (lowered) update a shared buffer in place; ScatterND is timed
                # the way the unfused graph is written, into a fresh present
                for binding in (("copy",) if graph == "unfused" else ("copy", "shared")):
                    steppers[graph, level, binding] = Stepper(sess, feeds, binding == "shared")
            times: dict[tuple[str, str, str], list[float]] = {k: [] for k in steppers}
            diffs = {}
            for key, stepper in steppers.items():  # first step: numerics, and warm-up
                _, logits, caches = stepper.step()
                cache_diff = max(float(np.abs(caches[k].numpy() - expected[k.replace("past_", "present_")]).max())
                                 for k in stepper.names)
                diffs[key] = (float(np.abs(logits - expected["logits"]).max()), cache_diff)
            for _ in range(args.steps):  # one step each in turn: bursts of outside load hit all alike
                for key, stepper in steppers.items():
                    times[key].append(stepper.step()[0])
            for (graph, level, binding), ts in times.items():
                p10 = float(np.percentile(ts, 10))
                results.append(Result(graph, level, binding, batch, 1e3 * statistics.median(ts), 1e3 * p10,
                                      *diffs[graph, level, binding]))
            del steppers
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
        return
    print(f"decode step, past {args.past}, max_seq {MAX_SEQ}, intra_op_num_threads=2, median of {args.steps} steps")
    print(f"{'graph':8} {'level':11} {'binding':7} {'batch':>5} {'median ms':>9} {'p10 ms':>7} {'|dlogits|':>10} "
          f"{'|dcache|':>9}")
    for r in results:
        print(f"{r.graph:8} {r.level:11} {r.binding:7} {r.batch:5d} {r.median_ms:9.2f} {r.p10_ms:7.2f} "
              f"{r.logits_diff:10.2e} {r.cache_diff:9.2e}")
    by_key = {(r.graph, r.level, r.binding, r.batch): r.median_ms for r in results}
    for batch in args.batch:
        for level in args.levels:
            lowered = by_key[("lowered", level, "shared", batch)]
            unfused, fused = by_key["unfused", level, "copy", batch], by_key["fused", level, "shared", batch]
            print(f"batch {batch}, {level}: lowered (in place) is {unfused / lowered:.2f}x faster than unfused, "
                  f"{fused / lowered:.2f}x faster than fused (in place)")


if __name__ == "__main__":
    main()

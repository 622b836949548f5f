"""Decode cost of a tiny MoE (8 experts, top-2) against the same model computing all 8 experts densely.

    .venv/bin/python benchmarks/moe_decode.py [--steps 40] [--past 64] [--batch 1 2 8] [--json]

A random-weight Mixtral (4 layers, hidden 512, 8 experts of width 1024, top-2, vocab 1024) is saved
with save_pretrained, converted and built for onnxruntime in float32 (`build`, the twin's passes), and
built a second time without the pass lower_ort_moe. Four graphs run:
  sparse    the twin as built: lower_ort_moe's per-expert form (NonZero-selected rows, one GEMM pair
            per expert on only its tokens; passes/lower_ort_moe.py)
  portable  the If the emitter writes (engine_builder/network/moe.py), the form TensorRT builds: the
            gathered routed experts while tokens * top_k < num_experts, else every expert densely
  dense     portable with every If's condition false: all 8 experts on every token, outputs weighted
            by the same routing (0 for experts not chosen) -- "the same model computing all 8 densely"
  gather    portable with every If's condition true: the gathered form at every batch size
One decode step per sequence over a cache of `past` tokens, caches bound once and updated in place
(IO binding), intra_op_num_threads=2, graphs round-robin one step at a time so outside load hits all
alike; the first step's logits are compared with dense. Prints sparse / dense and portable / dense per
batch (target <= 0.4 at batch 1), and a 64-token prefill of each.
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

from converters.convert import convert  # noqa: E402
from engine_builder.build.pipeline import build  # noqa: E402
from engine_builder.formats.build_config import DEFAULT_PASSES, BuildConfig, Limits, PassLists  # noqa: E402

VOCAB, MAX_SEQ = 1024, 256


def build_engine(work: Path) -> Path:
    import torch
    import transformers

    cfg = transformers.MixtralConfig(vocab_size=VOCAB, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                                     num_attention_heads=8, num_key_value_heads=4, num_local_experts=8,
                                     num_experts_per_tok=2, max_position_embeddings=MAX_SEQ)
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(cfg).eval()
    with torch.no_grad():  # spread the routing so tokens really pick different experts
        for name, p in model.named_parameters():
            if name.endswith("block_sparse_moe.gate.weight"):
                p.copy_(torch.randn_like(p))
    model.save_pretrained(work / "hf")
    convert(work / "hf", work / "ckpt", dtype="float32")
    limits = Limits(max_batch=8, max_input_len=64, max_seq_len=MAX_SEQ)
    build(work / "ckpt", work / "engine", BuildConfig(targets=("onnxruntime",), dtype="float32", limits=limits))
    # the same twin without lower_ort_moe: the portable If, as TensorRT gets it
    portable = PassLists(onnxruntime=tuple(p for p in DEFAULT_PASSES["onnxruntime"] if p != "lower_ort_moe"))
    build(work / "ckpt", work / "portable", BuildConfig(targets=("onnxruntime",), dtype="float32", limits=limits,
                                                        passes=portable))
    return work / "engine" / "model.onnx", work / "portable" / "model.onnx"


def forced(path: Path, use_gather: bool) -> Path:
    """A copy of PATH (beside it, so its external weights resolve) whose expert Ifs always take one branch."""
    model = ir.load(path)
    const = ir.Value(name=f"moe_force_{use_gather}", shape=ir.Shape([]), type=ir.TensorType(ir.DataType.BOOL),
                     const_value=ir.tensor(np.array(use_gather)))
    model.graph.register_initializer(const)
    ifs = [n for n in model.graph if n.op_type == "If" and n.name.endswith("/experts")]
    assert ifs, "no expert If in the graph"
    for node in ifs:
        node.replace_input_with(0, const)
    out = path.with_name(f"{'gather' if use_gather else 'dense'}.onnx")
    ir.save(model, out)
    return out


def session(path: Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


class Stepper:
    """One graph's decode loop: caches bound once, past and present the same buffer (GQA in place)."""

    def __init__(self, sess: ort.InferenceSession, batch: int, past: int):
        rng = np.random.default_rng(batch)
        self.sess, self.io = sess, sess.io_binding()
        self.caches = {}
        for inp in sess.get_inputs():
            if inp.name.startswith(("past_key.", "past_value.")):
                cache = np.zeros([batch, *inp.shape[1:]], np.float32)
                cache[:, :, :past] = rng.standard_normal(cache[:, :, :past].shape) * 0.5
                self.caches[inp.name] = ort.OrtValue.ortvalue_from_numpy(cache)
        self.lengths = np.full(batch, past, np.int64)
        self.ids = rng.integers(3, VOCAB, (batch, 1))
        self.rng = np.random.default_rng(0)

    def step(self) -> tuple[float, np.ndarray]:
        io = self.io
        io.bind_cpu_input("input_ids", self.ids)
        io.bind_cpu_input("position_ids", self.lengths[:, None].copy())
        io.bind_cpu_input("past_lengths", self.lengths)
        io.bind_output("logits")
        for name, buf in self.caches.items():
            io.bind_ortvalue_input(name, buf)
            io.bind_ortvalue_output(name.replace("past_", "present_"), buf)
        start = time.perf_counter()
        self.sess.run_with_iobinding(io)
        elapsed = time.perf_counter() - start
        logits = io.get_outputs()[0].numpy()
        # lengths stay put: every timed step attends over the same past and rewrites one slot
        self.ids = self.rng.integers(3, VOCAB, self.ids.shape)
        return elapsed, logits


def prefill_ms(sess: ort.InferenceSession, tokens: int, runs: int) -> float:
    feeds = {i.name: np.zeros([1, *i.shape[1:]], np.float32) for i in sess.get_inputs() if i.name.startswith("past_")}
    feeds |= dict(input_ids=np.random.default_rng(1).integers(3, VOCAB, (1, tokens)),
                  position_ids=np.arange(tokens)[None], past_lengths=np.zeros(1, np.int64))
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        sess.run(["logits"], feeds)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


@dataclass
class Result:
    batch: int
    sparse_ms: float  # the twin as built: lower_ort_moe's per-expert form
    portable_ms: float  # the If (gathered | dense) that TensorRT builds, run by onnxruntime
    dense_ms: float
    gather_ms: float
    sparse_over_dense: float
    portable_over_dense: float
    max_logits_diff: float  # every graph vs dense, first step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="timed decode steps per graph")
    parser.add_argument("--past", type=int, default=64)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 2, 8])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="moe_decode.") as tmp:
        sparse, portable = build_engine(Path(tmp))
        paths = {"sparse": sparse, "portable": portable, "dense": forced(portable, False),
                 "gather": forced(portable, True)}
        sessions = {name: session(path) for name, path in paths.items()}
        for batch in args.batch:
            steppers = {name: Stepper(sess, batch, args.past) for name, sess in sessions.items()}
            first = {name: s.step()[1] for name, s in steppers.items()}  # warm-up and numerics
            times: dict[str, list[float]] = {name: [] for name in steppers}
            for _ in range(args.steps):
                for name, stepper in steppers.items():
                    times[name].append(stepper.step()[0])
            ms = {name: 1e3 * statistics.median(ts) for name, ts in times.items()}
            results.append(Result(batch, ms["sparse"], ms["portable"], ms["dense"], ms["gather"],
                                  ms["sparse"] / ms["dense"], ms["portable"] / ms["dense"],
                                  max(float(np.abs(first[k] - first["dense"]).max()) for k in first)))
        prefill = {name: prefill_ms(sess, 64, 5) for name, sess in sessions.items()}
    if args.json:
        print(json.dumps({"decode": [asdict(r) for r in results], "prefill_64_ms": prefill}, indent=2))
        return
    print(f"tiny Mixtral, 8 experts top-2, float32 onnxruntime twin, past {args.past}, intra_op_num_threads=2, "
          f"median of {args.steps} decode steps")
    print(f"{'batch':>5} {'sparse ms':>9} {'portable ms':>11} {'dense ms':>9} {'gather ms':>9} {'sparse/dense':>12} "
          f"{'portable/dense':>14} {'|dlogits|':>10}")
    for r in results:
        print(f"{r.batch:5d} {r.sparse_ms:9.2f} {r.portable_ms:11.2f} {r.dense_ms:9.2f} {r.gather_ms:9.2f} "
              f"{r.sparse_over_dense:12.2f} {r.portable_over_dense:14.2f} {r.max_logits_diff:10.2e}")
    print("prefill of 64 tokens (ms): " + ", ".join(f"{k} {v:.1f}" for k, v in prefill.items()))
    one = next((r for r in results if r.batch == 1), None)
    if one:
        print(f"decode at batch 1 costs {one.sparse_over_dense:.2f}x the all-experts model (target <= 0.4)")


if __name__ == "__main__":
    main()

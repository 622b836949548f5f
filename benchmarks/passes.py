"""Pass pipeline time vs graph depth: seconds per layer at 4, 16, 32 and 64 layers.

The figure to watch is seconds per layer staying flat (linear growth). Side by side, on the
same unfused graph, it times onnxruntime's own graph optimizer (session creation at
ORT_ENABLE_ALL), the tool that otherwise fuses a graph on the fly.

    .venv/bin/python benchmarks/passes.py [--layers 4 16 32 64] [--runs 3] [--target onnxruntime] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

# this file is named like the `passes` package it times: keep its own dir off the import path
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]

import onnx_ir as ir  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

import passes  # noqa: E402, F401
from converters.convert import convert  # noqa: E402
from engine_builder.formats.build_config import DEFAULT_PASSES  # noqa: E402
from engine_builder.network import NetworkOptions, build_decoder  # noqa: E402
from engine_builder.network.weights import link_weights  # noqa: E402
from passes.base import PassManager  # noqa: E402


def make_checkpoint(root: Path, layers: int) -> Path:
    """A llama with SmolLM2's attention geometry and small MLP/vocab: the graph, not the weights, is timed."""
    config = transformers.LlamaConfig(hidden_size=576, intermediate_size=64, num_hidden_layers=layers,
                                      num_attention_heads=9, num_key_value_heads=3, vocab_size=256)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(root / "hf")
    convert(root / "hf", root / "ckpt")
    return root / "ckpt"


def time_passes(ckpt: Path, names: tuple[str, ...], runs: int) -> tuple[float, int]:
    times = []
    for _ in range(runs):
        model = build_decoder(ckpt, NetworkOptions(max_seq_len=256))
        start = time.perf_counter()
        PassManager(names).run(model)
        times.append(time.perf_counter() - start)
    return statistics.median(times), len(list(model.graph))


def time_ort_optimizer(ckpt: Path, out: Path, runs: int) -> float:
    link_weights(ckpt, out)
    ir.save(build_decoder(ckpt, NetworkOptions(max_seq_len=256)), out / "model.onnx")
    times = []
    for _ in range(runs):
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        start = time.perf_counter()
        ort.InferenceSession(str(out / "model.onnx"), opts, providers=["CPUExecutionProvider"])
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, nargs="+", default=[4, 16, 32, 64])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--target", default="onnxruntime", choices=sorted(DEFAULT_PASSES))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for layers in args.layers:
            root = Path(tmp) / f"l{layers}"
            ckpt = make_checkpoint(root, layers)
            seconds, nodes = time_passes(ckpt, DEFAULT_PASSES[args.target], args.runs)
            (root / "ort").mkdir()
            ort_seconds = time_ort_optimizer(ckpt, root / "ort", args.runs)
            rows.append({"layers": layers, "nodes_after": nodes, "passes_s": round(seconds, 3),
                         "passes_s_per_layer": round(seconds / layers, 4), "ort_optimizer_s": round(ort_seconds, 3),
                         "ratio_passes_vs_ort": round(seconds / ort_seconds, 2)})
    per_layer = [r["passes_s_per_layer"] for r in rows]
    growth = round(max(per_layer) / min(per_layer), 2)
    if args.json:
        print(json.dumps({"target": args.target, "runs": args.runs, "rows": rows,
                          "per_layer_max_over_min": growth}, indent=2))
        return
    print(f"pass pipeline for {args.target} ({len(DEFAULT_PASSES[args.target])} passes), median of {args.runs} runs")
    print(f"{'layers':>6} {'passes s':>9} {'s/layer':>8} {'ORT optimizer s':>16} {'ratio':>6}")
    for r in rows:
        print(f"{r['layers']:>6} {r['passes_s']:>9} {r['passes_s_per_layer']:>8} {r['ort_optimizer_s']:>16} "
              f"{r['ratio_passes_vs_ort']:>6}")
    print(f"seconds per layer, largest / smallest: {growth} (1.0 = perfectly linear growth)")


if __name__ == "__main__":
    main()

"""A CI engine-build job: convert (--quant) -> build --recipe -> verify -> eval gate, one JSON summary on stdout.

Each step is the `trtbuild` CLI with --json (its summary saved as WORKDIR/<step>.json, its progress lines
passed through on stderr for the job's log). The gate fails the job when the engine drifted from the
float32 checkpoint: the mean KL(checkpoint || engine) over `trtbuild eval`'s text above --max-kl, or top-1
agreement below --min-top1 (on a runner without a GPU, eval scores the engine dir's onnxruntime twin: with
dtype auto on such a CPU a float32 twin, so the gate bites on --quant or a float16 twin). A recipe's own
`fidelity:` block gates inside `build` the same way (docs/guide/ci-recipes.md). Exit 0 when every step passed
and the gate held; else the failing step's code (2: a refusal, with its one `error:` line), or 1: a missed gate.

    SRC="$(.venv/bin/python -m engine_builder.util.bundled)"          # or an HF dir / a GGUF file
    .venv/bin/python examples/ci_engine_build.py "$SRC" build/ci --recipe recipes/smollm2-135m-fp16.yaml
    .venv/bin/python examples/ci_engine_build.py "$SRC" build/ci-int8 --recipe recipes/smollm2-135m-fp16.yaml \
        --quant int8_wo --max-kl 0.02 --min-top1 0.9     # measured: KL 0.0099, top-1 0.945 (exit 1 at 0.95)
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("source", help="an HF checkpoint dir or a GGUF file")
parser.add_argument("workdir", type=Path, help="ckpt/, engine/ and the steps' JSON go here")
parser.add_argument("--recipe", type=Path, required=True, help="a build recipe, e.g. recipes/*.yaml")
parser.add_argument("--quant", help="convert --quant for the engine (int8_wo, int4_awq, gguf, ...); the gate's "
                    "reference stays the float32 checkpoint")
parser.add_argument("--max-kl", type=float, default=1e-3, help="gate: mean KL in nats per position")
parser.add_argument("--min-top1", type=float, default=0.98, help="gate: top-1 agreement")
parser.add_argument("--eval-tokens", type=int, default=512)
parser.add_argument("--eval-text", help="a .txt or .jsonl to score (default: trtbuild eval's shipped text)")
args = parser.parse_args()

ckpt, engine = args.workdir / "ckpt", args.workdir / "engine"
steps = [("convert", ["convert", args.source, ckpt, "--dtype", "float32"])]  # float32: the eval reference
built_from = ckpt
if args.quant:
    built_from = args.workdir / f"ckpt-{args.quant}"
    steps.append(("quantize", ["convert", args.source, built_from, "--quant", args.quant]))
steps += [("build", ["build", built_from, engine, "--recipe", args.recipe]),
          ("verify", ["verify", engine]),
          ("eval", ["eval", engine, "--reference", ckpt, "--max-tokens", args.eval_tokens,
                    *(["--text", args.eval_text] if args.eval_text else [])])]
summary = {"ok": False, "engine": str(engine), "steps": {}}
args.workdir.mkdir(parents=True, exist_ok=True)
for name, cmd in steps:
    start = time.monotonic()
    # the trtbuild of this Python; stderr (progress lines, an `error:` line) goes to the job's log
    proc = subprocess.run([sys.executable, "-m", "engine_builder.cli", *map(str, cmd), "--json"],
                          stdout=subprocess.PIPE, text=True)
    (args.workdir / f"{name}.json").write_text(proc.stdout)
    summary["steps"][name] = {"rc": proc.returncode, "seconds": round(time.monotonic() - start, 1),
                              "json": str(args.workdir / f"{name}.json")}
    if proc.returncode != 0:  # verify too: a file that differs from the manifest exits 2
        print(json.dumps(summary, indent=2))
        sys.exit(proc.returncode)

figures = json.loads((args.workdir / "eval.json").read_text())
summary["gate"] = {"kl": figures["kl"], "max_kl": args.max_kl, "top1_agreement": figures["top1_agreement"],
                   "min_top1": args.min_top1, "ppl": figures["ppl"], "reference_ppl": figures["reference"]["ppl"]}
summary["ok"] = figures["kl"] <= args.max_kl and figures["top1_agreement"] >= args.min_top1
print(json.dumps(summary, indent=2))
sys.exit(0 if summary["ok"] else 1)

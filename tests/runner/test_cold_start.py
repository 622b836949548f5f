"""`trtbuild run` on the CPU path loads no more than it needs: no torch, no TensorRT, no transformers (its
import alone was ~0.5-0.9 s of SmolLM2's cold start; runner/fast_tokenizer.py reads tokenizer.json and renders
the chat template itself), no onnx (~0.16 s: the KV-update mode is read from the graph's metadata, which the
build writes, through the onnxruntime session: formats/kv_update_graph.py), no build code (each seconds of
import before the first token; benchmarks/cold_start.py times the whole)."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys
from engine_builder.cli.commands import app
sys.argv = ["trtbuild", "run", *sys.argv[1:], "--max-new-tokens", "2"]
try:
    app()
except SystemExit as exc:
    code = exc.code
heavy = sorted(m for m in ("torch", "tensorrt", "tensorrt_rtx", "transformers", "onnx", "onnx_ir", "passes",
                           "converters")
               if m in sys.modules)
sys.stderr.write("\\n" + json.dumps({"code": code, "heavy": heavy}) + "\\n")
"""


def probe(*args) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-c", PROBE, *map(str, args)], capture_output=True, text=True, timeout=300)
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    assert report == {"code": 0, "heavy": []}, proc.stderr
    assert proc.stdout.strip()  # it generated
    return proc


def test_run_imports_no_torch_tensorrt_transformers_or_build_code(tiny_engine):
    engine, _ = tiny_engine("llama")
    probe(engine, "--prompt", "w1 w5 w9")


def test_run_chat_renders_the_template_without_transformers(tiny_serve_engine):
    probe(tiny_serve_engine, "--chat", "--prompt", "w1 w5 w9")

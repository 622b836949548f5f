"""`trtbuild run` on the CPU path loads no more than it needs: no torch, no TensorRT, no transformers model
registry (each seconds of import before the first token; benchmarks/cold_start.py times the whole)."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys
from engine_builder.cli.commands import app
sys.argv = ["trtbuild", "run", sys.argv[1], "--prompt", "w1 w5 w9", "--max-new-tokens", "2"]
try:
    app()
except SystemExit as exc:
    code = exc.code
heavy = sorted(m for m in ("torch", "tensorrt", "tensorrt_rtx", "transformers.models.auto", "onnx_ir", "passes")
               if m in sys.modules)
sys.stderr.write("\\n" + json.dumps({"code": code, "heavy": heavy}) + "\\n")
"""


def test_run_imports_no_torch_tensorrt_or_build_code(tiny_engine):
    engine, _ = tiny_engine("llama")
    proc = subprocess.run([sys.executable, "-c", PROBE, str(engine)], capture_output=True, text=True, timeout=300)
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    assert report == {"code": 0, "heavy": []}, proc.stderr
    assert proc.stdout.strip()  # it generated

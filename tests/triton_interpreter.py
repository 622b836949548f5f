"""Triton kernels checked on the CPU: a test file that is also a script, run as a child with TRITON_INTERPRET=1.

Why a child process: triton.jit picks interpreted or compiled when it decorates, i.e. when a kernel's module is first
imported, reading TRITON_INTERPRET at that moment (triton 3.6). In pytest's process another test may have imported
the module already, and setting the variable there would turn every other Triton kernel of the session into an
interpreted one. So the test file runs itself once as a child, which checks every case and prints one JSON line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_interpreted(script: str, *args: str) -> dict:
    """SCRIPT (a test file's __file__) run as a child under Triton's interpreter, ARGS its command line: the JSON line
    it printed last."""
    path = os.pathsep.join(p for p in (str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    done = subprocess.run([sys.executable, script, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def report_cases(kernel, cases: dict[str, dict], run_case: Callable[[dict, int], dict]) -> None:
    """The child's work: every case of CASES through RUN_CASE(spec, seed), printed as one JSON line."""
    from engine_builder.runner.torch_backend.paged_attention_triton import patch_triton_interpreter

    assert type(kernel).__name__ == "InterpretedFunction", "TRITON_INTERPRET=1 was not seen"
    patch_triton_interpreter()  # bf16 dots, float32 -> bfloat16 rounding to nearest even, as the GPU does
    print(json.dumps({name: run_case(spec, seed) for seed, (name, spec) in enumerate(cases.items())}))

"""The router only speaks HTTP: loading it loads nothing of the runtime or of the model stack (it runs where no
model does, and starts in a fraction of `serve`'s time). lint-imports checks the imports it names; this checks
what a real interpreter loads."""

from __future__ import annotations

import subprocess
import sys


def test_the_router_loads_no_runtime_and_no_model_stack():
    code = ("import sys; from engine_builder.router import route; import engine_builder.router.app; "
            "print('\\n'.join(sorted(sys.modules)))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            timeout=120).stdout.split()
    assert "engine_builder.router.proxy" in loaded and "httpx" in loaded
    runtime = [m for m in loaded if m.startswith(("engine_builder.runner", "engine_builder.executor",
                                                  "engine_builder.server", "converters", "passes"))]
    assert runtime == []
    assert not [m for m in loaded if m.split(".")[0] in ("onnxruntime", "torch", "transformers", "numpy", "onnx")]

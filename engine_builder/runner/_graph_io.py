"""engine_builder.network.graph_io (the graph's I/O names), loaded without running
engine_builder/network/__init__.py, which imports the whole graph builder (~2 s of onnx_ir and
onnxscript) that `trtbuild run` never uses. Same module object when something imported it already.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

_NAME = "engine_builder.network.graph_io"


def _load() -> ModuleType:
    if _NAME in sys.modules:
        return sys.modules[_NAME]
    spec = importlib.util.spec_from_file_location(_NAME, Path(__file__).parents[1] / "network" / "graph_io.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # not registered in sys.modules: the real package import stays untouched
    return module


io = _load()

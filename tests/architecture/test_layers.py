"""The structure docs/ARCHITECTURE.md promises, checked on the real import graph (grimp, as import-linter
reads it) and in a real interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).parents[2]
PACKAGES = ("engine_builder", "converters", "passes")
BUILD_SIDE = ("converters", "passes", "engine_builder.network", "engine_builder.build",
              "engine_builder.trt.engine_build", "engine_builder.trt.engine_layers")


def _graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan): each is an import cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in graph.find_modules_directly_imported_by(module):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_module_is_tied_to_itself_through_others():
    graph = _graph()
    assert len(graph.modules) > 100  # the graph is the real one, not an empty read
    assert _cycles(graph) == []


def test_the_cycle_check_finds_a_cycle():
    graph = _graph()
    graph.add_import(importer="engine_builder.formats.graph_io", imported="engine_builder.runner.llm")
    assert any("engine_builder.formats.graph_io" in c and "engine_builder.runner.llm" in c for c in _cycles(graph))


def test_import_linter_contracts_are_kept():
    proc = subprocess.run([str(Path(sys.executable).parent / "lint-imports"), "--no-cache"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "6 kept, 0 broken" in proc.stdout


def test_the_runtime_loads_nothing_of_the_build_side():
    code = ("import sys; from engine_builder import LLM; import engine_builder.server, engine_builder.executor; "
            "import json; print(json.dumps(sorted(sys.modules)))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                                       check=True, timeout=300).stdout)
    assert "engine_builder.runner.llm" in loaded and "engine_builder.server.http_server" in loaded
    build_side = [m for m in loaded if m.startswith(BUILD_SIDE)]
    assert build_side == []
    # nor the graph tooling or TensorRT itself
    assert not [m for m in loaded if m.split(".")[0] in ("onnx_ir", "onnxscript", "tensorrt", "tensorrt_rtx")]


def test_file_names_are_unique():
    names: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if path.name not in ("__init__.py", "__main__.py"):
                names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {n: p for n, p in names.items() if len(p) > 1} == {}


# a backend's own engine calls: its implementation modules make them, and runner/backend.py's forward
BACKEND_MODULES = ("engine_builder/runner/backend.py", "engine_builder/runner/ort_backend.py",
                   "engine_builder/runner/ort_paged.py", "engine_builder/runner/trt_backend.py",
                   "engine_builder/runner/trt_paged.py", "engine_builder/runner/parallel/parallel_backend.py",
                   "engine_builder/runner/torch_backend/runtime.py")


def test_one_place_runs_a_backend_step():
    """The loop reaches an engine through Backend.forward(ModelInput) only, and calls it in one place,
    Generator.execute (issue 32): nothing outside the backends calls execute() / read_logits() /
    read_tail_logits() of one, nor forward() but that method. (Backend.step, forward over a slot range, serves
    the callers outside the loop: a draft model's proposer and lm-eval's scoring.)"""
    import ast

    calls = []
    for package in ("engine_builder/runner", "engine_builder/executor", "engine_builder/server", "engine_builder/eval"):
        for path in (ROOT / package).rglob("*.py"):
            rel = str(path.relative_to(ROOT))
            if rel in BACKEND_MODULES:
                continue
            for function in ast.walk(ast.parse(path.read_text())):
                if not isinstance(function, ast.FunctionDef):
                    continue
                for node in ast.walk(function):
                    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                            and node.func.attr in ("execute", "read_logits", "read_tail_logits", "forward")):
                        calls.append(f"{rel} {function.name}: .{node.func.attr}()")
    assert calls == ["engine_builder/runner/generate.py run_step: .forward()"]


def test_no_kv_layout_branch_outside_the_kv_package():
    """The loop, the scheduler and the policies ask the KV interface (runner/kv/kv_interface.py), never which
    storage is behind it (issue 32): no `.paged` attribute, getattr(kv, "paged"), or isinstance against a storage
    class outside runner/kv/ and the backends that construct a storage."""
    import ast

    storages = {"KVCacheManager", "PagedKVCacheManager"}
    found = []
    for package in ("engine_builder/runner", "engine_builder/executor", "engine_builder/server", "engine_builder/eval"):
        for path in (ROOT / package).rglob("*.py"):
            rel = str(path.relative_to(ROOT))
            if rel.startswith("engine_builder/runner/kv/") or rel in BACKEND_MODULES:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Attribute) and node.attr == "paged":
                    found.append(f"{rel}:{node.lineno} .paged")
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                    args = [a for a in node.args[1:2] for a in (a.elts if isinstance(a, ast.Tuple) else [a])]
                    if node.func.id in ("getattr", "hasattr") and any(
                            isinstance(a, ast.Constant) and a.value == "paged" for a in args):
                        found.append(f"{rel}:{node.lineno} {node.func.id}(..., 'paged')")
                    if node.func.id == "isinstance" and any(isinstance(a, ast.Name) and a.id in storages for a in args):
                        found.append(f"{rel}:{node.lineno} isinstance(..., {storages & {a.id for a in args}})")
    assert found == []


def test_every_trtbuild_variable_is_read_through_the_one_table():
    """util/environment.py lists every TRTBUILD_* variable (values, default, what it does) and is the one reader:
    no other module hands such a name to os.environ / os.getenv, and every such name in the code is in the table."""
    import ast

    from engine_builder.util.environment import VARIABLES

    named, direct = set(), []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            rel = str(path.relative_to(ROOT))
            tree = ast.parse(path.read_text())
            consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                      and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                      for t in n.targets if isinstance(t, ast.Name)}
            for node in ast.walk(tree):
                value = node.value if isinstance(node, ast.Constant) else None
                if isinstance(value, str) and value.startswith("TRTBUILD_") and value.isupper() and " " not in value:
                    named.add(value)
                key = None
                call = ast.unparse(node.func) if isinstance(node, ast.Call) and node.args else None
                if call in ("os.environ.get", "os.getenv"):
                    key = node.args[0]
                elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
                    key = node.slice
                if key is not None and rel != "engine_builder/util/environment.py":
                    value = key.value if isinstance(key, ast.Constant) else consts.get(getattr(key, "id", None))
                    if isinstance(value, str) and value.startswith("TRTBUILD_"):
                        direct.append(f"{rel}:{node.lineno} {value}")
    assert direct == []
    assert named - set(VARIABLES) == set()

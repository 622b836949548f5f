"""The TensorRT backend up to where a GPU is needed, and backend="auto" selection.

A real TensorRT-RTX engine is built here (no GPU needed to build); running it is not possible on
this machine, so the test checks that the backend refuses with the verdict's reason before touching
CUDA, and drives the binding logic with plain objects in place of execution contexts.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine_builder.formats import graph_io as io
from engine_builder.formats.build_config import BuildConfig, Limits
from engine_builder.runner import backend_choice
from engine_builder.runner.backend_choice import choose_backend
from engine_builder.runner.engine import EngineDir
from engine_builder.runner.trt_backend import (
    Binding,
    TrtBackend,
    apply_plan,
    binding_plan,
    input_shapes,
    profiles_from_manifest,
    select_profile,
)
from engine_builder.util.errors import CapacityError, UnsupportedError

pytest.importorskip("tensorrt_rtx", reason="pip install tensorrt-rtx-cu13")

LIMITS = Limits(max_batch=4, max_input_len=32, max_seq_len=64)


@pytest.fixture(scope="module")
def trt_engine_dir(tiny_engine, module_tmp_factory):
    """A tiny llama engine dir with a real TensorRT-RTX engine (fp16, sm86) and its ONNX twin."""
    from engine_builder.build.pipeline import build

    _, hf = tiny_engine("llama")
    out = module_tmp_factory.mktemp("trt") / "engine"
    ckpt = hf.parent / "ckpt"
    build(ckpt, out, BuildConfig(targets=("tensorrt", "onnxruntime"), dtype="float16", limits=LIMITS,
                                 compute_capabilities=("sm86",)))
    return out


def test_refuses_without_gpu_before_touching_cuda(trt_engine_dir, monkeypatch):
    engine = EngineDir.load(trt_engine_dir)
    monkeypatch.setitem(sys.modules, "torch", None)  # any torch import would now fail loudly
    with pytest.raises(UnsupportedError, match=r"cannot run the TensorRT engine .*cannot run here: no NVIDIA GPU"
                                               r".*use --backend onnxruntime"):
        TrtBackend(engine)


def test_auto_picks_onnxruntime_here_and_says_why(trt_engine_dir, tiny_engine):
    engine = EngineDir.load(trt_engine_dir)
    choice = choose_backend(engine, "auto")
    assert choice.name == "onnxruntime" and "no NVIDIA GPU" in choice.reason
    with pytest.raises(UnsupportedError, match="no NVIDIA GPU.*--backend onnxruntime"):
        choose_backend(engine, "tensorrt")
    assert choose_backend(engine, "onnxruntime").reason == "requested"
    ort_only = EngineDir.load(tiny_engine("llama")[0])
    assert "built without the tensorrt target" in choose_backend(ort_only, "auto").reason


def test_auto_picks_tensorrt_when_the_verdict_allows(trt_engine_dir, monkeypatch):
    from engine_builder.trt import compatibility as trt_inspect

    engine = EngineDir.load(trt_engine_dir)
    real = trt_inspect.compatibility_verdict
    # a pretend sm86 GPU; engine_path dropped because TensorRT's own header check needs a real one
    monkeypatch.setattr(trt_inspect, "compatibility_verdict", lambda info, **kw: real(info, gpus=["sm86"]))
    choice = choose_backend(engine, "auto")
    assert choice.name == "tensorrt" and choice.reason.startswith("ok")
    monkeypatch.setattr(trt_inspect, "compatibility_verdict", lambda info, **kw: real(info, gpus=["sm90"]))
    choice = choose_backend(engine, "auto")
    assert choice.name == "onnxruntime" and "not among targets" in choice.reason


def test_profiles_decode_first_then_prefill(trt_engine_dir):
    profiles = profiles_from_manifest(EngineDir.load(trt_engine_dir).tensorrt)
    assert len(profiles) == 3
    assert select_profile(profiles, 1, 1) == 0 and select_profile(profiles, 4, 1) == 0  # decode
    assert select_profile(profiles, 1, 2) == 1 and select_profile(profiles, 1, 16) == 1  # verify (logits_tail 16)
    assert select_profile(profiles, 1, 17) == 2 and select_profile(profiles, 1, 32) == 2  # prefill
    assert select_profile(profiles, 3, 17) == 2
    with pytest.raises(CapacityError, match=r"33 tokens .*profile 2: rows 1..4, seq 2..32"):
        select_profile(profiles, 1, 33)
    with pytest.raises(CapacityError, match="5 rows"):
        select_profile(profiles, 5, 1)
    assert profiles[0][io.past_key(0)][2] == (4, 2, 64, 16)  # [max_batch, kv_heads, max_seq, head_dim]


def test_binding_plan_shapes_addresses_and_aliasing():
    kv_shape = (2, 64, 16)  # [kv_heads, max_seq, head_dim]
    assert input_shapes(3, 1, 1, kv_shape) == {
        io.INPUT_IDS: (3, 1), io.POSITION_IDS: (3, 1), io.PAST_LENGTHS: (3,),
        io.past_key(0): (3, *kv_shape), io.past_value(0): (3, *kv_shape)}
    row_bytes = 2 * 64 * 16 * 2
    bases = {io.past_key(0): 10_000, io.past_value(0): 20_000, io.present_key(0): 30_000,
             io.present_value(0): 40_000, io.INPUT_IDS: 1, io.POSITION_IDS: 2, io.PAST_LENGTHS: 3, io.LOGITS: 4}

    def address_of(name: str, first: int) -> int:
        per_row = name.startswith(("past_", "present_"))
        return bases[name] + (first * row_bytes if per_row else 0)

    aliased = {io.present_key(0): io.past_key(0), io.present_value(0): io.past_value(0)}
    plan = {b.name: b for b in binding_plan(2, 1, 7, 1, kv_shape, address_of, aliased)}
    assert plan[io.INPUT_IDS] == Binding(io.INPUT_IDS, (1, 7), 1)
    assert plan[io.past_key(0)] == Binding(io.past_key(0), (1, *kv_shape), 10_000 + 2 * row_bytes)
    assert plan[io.present_key(0)] == Binding(io.present_key(0), None, 10_000 + 2 * row_bytes)  # in place
    assert plan[io.LOGITS].shape is None and plan[io.LOGITS].address == 4
    unaliased = {b.name: b for b in binding_plan(2, 1, 7, 1, kv_shape, address_of, {})}
    assert unaliased[io.present_value(0)].address == 40_000 + 2 * row_bytes  # copy mode: its own buffer


class FakeContext:
    """Records what an IExecutionContext would be told; rejects shapes over a limit like TensorRT."""

    def __init__(self, max_rows: int = 4) -> None:
        self.max_rows, self.shapes, self.addresses = max_rows, {}, {}

    def set_input_shape(self, name: str, shape: tuple) -> bool:
        if shape[0] > self.max_rows:
            return False
        self.shapes[name] = shape
        return True

    def set_tensor_address(self, name: str, address: int) -> bool:
        self.addresses[name] = address
        return True


def test_apply_plan_sets_shapes_for_inputs_and_addresses_for_all():
    plan = binding_plan(0, 2, 1, 2, (2, 64, 16), lambda name, first: hash(name) & 0xFFFF, {})
    context = FakeContext()
    apply_plan(context, plan)
    assert set(context.addresses) == {b.name for b in plan} and len(plan) == 3 + 1 + 4 * 2
    assert set(context.shapes) == {io.INPUT_IDS, io.POSITION_IDS, io.PAST_LENGTHS,
                                   *(f"past_{k}.{i}" for k in ("key", "value") for i in range(2))}
    with pytest.raises(CapacityError, match="rejects shape"):
        apply_plan(FakeContext(max_rows=1), plan)


def test_backend_module_imports_without_torch_cuda():
    # selection needs no torch, no GPU: the torch backend registers by asking the CUDA driver (ctypes), and its
    # module loads torch only when it opens (tests/runner/test_cold_start.py checks `trtbuild run` imports none)
    assert backend_choice.BACKENDS == ("auto", "onnxruntime", "tensorrt", "torch")
    probe = "import sys; import engine_builder.runner.backend_choice; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip() == "False"

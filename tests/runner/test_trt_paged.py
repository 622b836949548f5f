"""The TensorRT backend for a paged engine (runner/trt_paged.py) up to where a GPU is needed.

A real TensorRT-RTX paged engine is built (fp16, sm86; no GPU needed to build). Running it is not possible
on this machine, so the tests check that the adapter takes paged engines (no refusal by layout: the
verdict decides, before CUDA is touched), that its pool typing matches the engine's own graph and the
manifest, and drive its binding plan (shapes, addresses, ping-pong or aliased pools) with a plain object
standing in for an execution context.
"""

from __future__ import annotations

import sys

import numpy as np
import onnx
import pytest

from engine_builder.build.pipeline import build
from engine_builder.formats import graph_io as io
from engine_builder.formats.build_config import BuildConfig, Limits
from engine_builder.runner.backend_choice import choose_backend
from engine_builder.runner.engine import EngineDir
from engine_builder.runner.trt_backend import Binding, TrtBackend, apply_plan, profiles_from_manifest, select_profile
from engine_builder.runner.trt_paged import (
    TrtPagedBackend,
    check_engine_pool,
    paged_binding_plan,
    paged_input_shapes,
    step_width,
    trt_paged_layout,
)
from engine_builder.util.errors import CapacityError, InputError, UnsupportedError

pytest.importorskip("tensorrt_rtx", reason="pip install tensorrt-rtx-cu13")

LIMITS = Limits(max_batch=2, max_input_len=32, max_seq_len=96)
BLOCK = 8


@pytest.fixture(scope="module")
def paged_trt_dir(tiny_serve_engine, module_tmp_factory):
    out = module_tmp_factory.mktemp("trt-paged") / "engine"
    build(tiny_serve_engine.parent / "ckpt", out, BuildConfig(
        dtype="float16", twin_dtype="float32", limits=LIMITS, kv_layout="paged", kv_block_size=BLOCK,
        compute_capabilities=("sm86",)))
    return out


def test_paged_engines_are_taken_and_refused_only_for_want_of_a_gpu(paged_trt_dir, monkeypatch):
    engine = EngineDir.load(paged_trt_dir)
    assert TrtBackend.layout_backends["paged"] is TrtPagedBackend
    ok, reason = TrtBackend.usable(engine)
    assert not ok and "no NVIDIA GPU" in reason and "paged" not in reason
    choice = choose_backend(engine, "auto")
    assert choice.name == "onnxruntime" and "no NVIDIA GPU" in choice.reason
    monkeypatch.setitem(sys.modules, "torch", None)  # any torch import would now fail loudly
    with pytest.raises(UnsupportedError, match=r"cannot run the TensorRT engine .*no NVIDIA GPU.*--backend onnx"):
        TrtBackend.open(engine)  # dispatched to TrtPagedBackend, which refuses before touching CUDA


def test_pool_typing_matches_the_engine_graph_and_profiles(paged_trt_dir):
    engine = EngineDir.load(paged_trt_dir)
    layout = trt_paged_layout(engine)
    assert (layout.dtype, layout.block_size) == ("float16", BLOCK)  # the engine's dtype, not the twin's float32
    assert engine.twin_paged_layout.dtype == "float32"
    graph = onnx.load(str(paged_trt_dir / "model.trt.onnx"), load_external_data=False).graph
    pool = next(i for i in graph.input if i.name == io.kv_pool_key(0))
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in pool.type.tensor_type.shape.dim]
    dtype = onnx.helper.tensor_dtype_to_np_dtype(pool.type.tensor_type.elem_type).name
    check_engine_pool(engine, dims, dtype, layout)  # what TrtPagedBackend checks against get_tensor_shape
    with pytest.raises(InputError, match="mixes two builds"):
        check_engine_pool(engine, dims, "float32", layout)
    with pytest.raises(InputError, match="mixes two builds"):
        check_engine_pool(engine, [dims[1], dims[0], *dims[2:]], dtype, layout)  # the old block-major pool
    profiles = profiles_from_manifest(engine.tensorrt)
    per_seq = LIMITS.max_seq_len // BLOCK
    for p in profiles:
        lo, _, hi = p[io.kv_pool_key(0)]
        assert lo == layout.pool_shape(1) and hi == layout.pool_shape(layout.max_pool_blocks(LIMITS.max_batch))
        assert p[io.BLOCK_TABLE][2] == (LIMITS.max_batch, per_seq)
    assert select_profile(profiles, 2, 1) == 0 and select_profile(profiles, 1, 32) == len(profiles) - 1


class FakeContext:
    """Records what an IExecutionContext would be told; rejects a block table wider than the profile."""

    def __init__(self, max_width: int) -> None:
        self.max_width, self.shapes, self.addresses = max_width, {}, {}

    def set_input_shape(self, name: str, shape: tuple) -> bool:
        if name == io.BLOCK_TABLE and shape[1] > self.max_width:
            return False
        self.shapes[name] = shape
        return True

    def set_tensor_address(self, name: str, address: int) -> bool:
        self.addresses[name] = address
        return True


def test_binding_plan_binds_whole_pools_ping_pong_or_in_place():
    pool_shape = (2, 40, BLOCK, 16)  # [kv_heads, num_blocks, B, head_dim]
    assert paged_input_shapes(2, 1, 5, 1, pool_shape) == {
        io.INPUT_IDS: (2, 1), io.POSITION_IDS: (2, 1), io.PAST_LENGTHS: (2,), io.BLOCK_TABLE: (2, 5),
        io.kv_pool_key(0): pool_shape, io.kv_pool_value(0): pool_shape}
    current, other = {io.kv_pool_key(0): 100, io.kv_pool_value(0): 200}, {io.kv_pool_key(0): 300,
                                                                            io.kv_pool_value(0): 400}

    def address_of(name: str) -> int:  # as TrtPagedBackend._address: present_* is the other set of the pair
        if name.startswith("present_pool_"):
            return other[name.replace("present_pool_", "kv_pool_")]
        return current.get(name, {io.INPUT_IDS: 1, io.POSITION_IDS: 2, io.PAST_LENGTHS: 3, io.BLOCK_TABLE: 4,
                                  io.LOGITS: 5}.get(name, 0))

    plan = {b.name: b for b in paged_binding_plan(2, 1, 5, 1, pool_shape, address_of, {})}
    assert plan[io.kv_pool_key(0)] == Binding(io.kv_pool_key(0), pool_shape, 100)
    assert plan[io.present_pool_key(0)] == Binding(io.present_pool_key(0), None, 300)  # ping-pong: the other set
    assert plan[io.BLOCK_TABLE] == Binding(io.BLOCK_TABLE, (2, 5), 4) and plan[io.LOGITS].address == 5
    aliased = {io.present_pool_key(0): io.kv_pool_key(0), io.present_pool_value(0): io.kv_pool_value(0)}
    in_place = {b.name: b for b in paged_binding_plan(2, 1, 5, 1, pool_shape, address_of, aliased)}
    assert in_place[io.present_pool_value(0)].address == 200  # aliased: written where it is read
    context = FakeContext(max_width=12)
    apply_plan(context, list(plan.values()))
    assert set(context.addresses) == set(plan) and len(plan) == 4 + 2 + 1 + 2
    assert set(context.shapes) == set(paged_input_shapes(2, 1, 5, 1, pool_shape))
    with pytest.raises(CapacityError, match="rejects shape"):
        apply_plan(FakeContext(max_width=12), paged_binding_plan(2, 1, 13, 1, pool_shape, address_of, {}))


def test_step_width_covers_the_longest_row_after_the_step():
    lengths = np.array([7, 16])
    assert step_width(lengths, 1, BLOCK, 12) == 3  # 17 positions of 8: 3 blocks
    assert step_width(lengths, 8, BLOCK, 12) == 3 and step_width(lengths, 9, BLOCK, 12) == 4
    assert step_width(np.array([95]), 1, BLOCK, 12) == 12  # never past the table's width

"""The torch backend's GPU memory plan (formats/device_plan.py) as `trtbuild inspect` and `plan` show it: the
weights are the engine dir's own tensors in the GPU dtype, the KV pool what utilization leaves after them and the
reserve, in whole blocks, and the tokens it holds follow from the engine's KV layout."""

from __future__ import annotations

import json
import math

import pytest
from cli_process import assert_user_error, trtbuild
from safetensors import safe_open

from engine_builder.formats.device_plan import plan_device
from engine_builder.formats.graph_io import PagedKVLayout
from engine_builder.runner.engine import EngineDir

GIB = 1 << 30


@pytest.fixture(scope="module")
def engine(tiny_engine):
    return tiny_engine("llama")[0]


def test_the_plan_counts_the_engine_dirs_tensors_and_leaves_the_rest_to_the_pool(engine):
    e = EngineDir.load(engine, verify=False)
    with safe_open(engine / "rank0.safetensors", "np") as f:  # a float32 checkpoint: 4 bytes an element
        elements = sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
    plan = plan_device(e.model, e.limits, "bfloat16", GIB, utilization=0.5, reserve=64 << 20)
    assert plan.weights == 2 * elements
    layout = PagedKVLayout.of(e.model, e.limits.max_seq_len, "bfloat16", block_size=16)
    room = GIB // 2 - plan.weights - (64 << 20)
    assert plan.kv_pool % layout.bytes_per_block == 0 and room - layout.bytes_per_block < plan.kv_pool <= room
    assert plan.kv_tokens == plan.kv_pool // layout.bytes_per_token
    assert plan.full_sequences == plan.kv_tokens // e.limits.max_seq_len and plan.fits
    small = plan_device(e.model, e.limits, "bfloat16", 64 << 20, utilization=0.9, reserve=64 << 20)
    assert not small.fits and small.kv_pool == 0 and "DOES NOT FIT" in small.describe()


def test_inspect_and_plan_show_it_for_the_gpu_asked(engine, tiny_model_dir):
    proc = trtbuild("inspect", engine, "--gpu-memory", "2GiB", "--gpu-memory-utilization", "0.5", "--json")
    assert proc.returncode == 0, proc.stderr
    gpu = json.loads(proc.stdout)["torch_gpu"]
    e = EngineDir.load(engine, verify=False)
    want = plan_device(e.model, e.limits, "float32", 2 * GIB, utilization=0.5, reserve=2 * GIB)
    assert (gpu["device_bytes"], gpu["utilization"], gpu["source"]) == (2 * GIB, 0.5, "--gpu-memory")
    assert (gpu["kv_tokens"], gpu["fits"]) == (want.kv_tokens, want.fits) == (0, False)  # the 2 GiB reserve
    text = trtbuild("inspect", engine, "--gpu-memory", "16GiB")
    assert text.returncode == 0 and "torch GPU memory" in text.stdout and "sequences of max_seq_len" in text.stdout
    planned = trtbuild("plan", tiny_model_dir("llama"), "--gpu-memory", "16GiB", "--json")
    assert planned.returncode == 0, planned.stderr
    torch_gpu = json.loads(planned.stdout)["torch_gpu"]
    assert torch_gpu["device_bytes"] == 16 * GIB and torch_gpu["fits"] and torch_gpu["kv_tokens"] > 0
    assert_user_error(trtbuild("inspect", engine, "--gpu-memory-utilization", "0"), "--gpu-memory-utilization")
    assert_user_error(trtbuild("plan", tiny_model_dir("llama"), "--gpu-memory", "lots"), "--gpu-memory")

"""`build --kv-layout paged`: the decoder reads and writes a block pool through a block table.

The onnxruntime twin runs it (PagedOrtBackend, the pool bound in place) with the same greedy tokens as
the slot-layout twin and Hugging Face transformers, across block boundaries, in ragged batches, with
sliding windows and with an int8 cache; TensorRT-RTX builds it; the slot layout's graph is unchanged.
"""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import pytest
from hf_reference import hf_greedy, prompt_of
from kv_int8 import hf_cache_absmax, hf_greedy_int8_cache, with_int8_kv_cache

from engine_builder.build.pipeline import build
from engine_builder.formats import graph_io as io
from engine_builder.formats.build_config import BuildConfig, Limits
from engine_builder.runner.engine import EngineDir
from engine_builder.runner.ort_backend import OrtBackend
from engine_builder.runner.ort_paged import PagedOrtBackend

LIMITS = Limits(max_batch=2, max_input_len=24, max_seq_len=64)
BLOCK = 4  # small blocks: a 20-token prompt and 17 steps cross many block boundaries
STEPS = 17


def _build(ckpt, out, layout: str, targets=("onnxruntime",), **kw) -> EngineDir:
    build(ckpt, out, BuildConfig(targets=targets, dtype="float32", limits=LIMITS, kv_layout=layout,
                                 kv_block_size=BLOCK, **kw))
    return EngineDir.load(out)


def greedy(backend, prompts: list[list[int]], steps: int) -> list[list[int]]:
    """Each prompt prefilled alone in its slot, then every row decoded together (a ragged batch)."""
    kv, slots, tokens = backend.kv, [], []
    for i, p in enumerate(prompts):
        s = kv.allocate(i, len(p), steps)
        logits = backend.step(s, np.asarray([p], np.int64))
        kv.advance(s, len(p))
        slots.append(s)
        tokens.append([int(logits[0].argmax())])
    for _ in range(steps - 1):
        logits = backend.step(0, np.asarray([[t[-1]] for t in tokens], np.int64))
        for s, t, row in zip(slots, tokens, logits):
            kv.advance(s, 1)
            t.append(int(row.argmax()))
    for s in slots:
        backend.release(s)
    return tokens


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen3", "gemma2"])  # GQA; a sliding window over the
# gathered blocks; q/k norms (qwen3) and a soft-capped, sliding gemma2 through lower_ort_paged_attention
def test_paged_twin_matches_slots_and_hf(arch, model_dir, checkpoint_dir, tmp_path):
    ckpt = checkpoint_dir(arch)
    slots = OrtBackend(_build(ckpt, tmp_path / "slots", "slots"))
    paged_dir = _build(ckpt, tmp_path / "paged", "paged")
    paged = OrtBackend.open(paged_dir)
    assert isinstance(paged, PagedOrtBackend) and paged_dir.kv_layout_kind == "paged"
    prompts = [prompt_of(20, seed=3), prompt_of(7, seed=4)]
    want = [hf_greedy(model_dir(arch), p, STEPS)[0] for p in prompts]
    assert greedy(slots, prompts, STEPS) == want
    assert greedy(paged, prompts, STEPS) == want
    # the twin's paged block went through lower_ort_paged_attention (rotary on [batch, seq, hidden], pool
    # writes in token order), its residual stream kept the graph's batch/seq dims (no per-rotary Expand of
    # the tables, every residual norm fused): what keeps a batch-1 step's node count near the slot layout's
    layers = paged_dir.twin_paged_layout.num_layers
    matches = {p["name"]: p["matches"] for p in paged_dir.manifest.passes["onnxruntime"]}
    assert matches["lower_ort_paged_attention"] == layers and matches["lower_ort_norms"] == 2 * layers - 1
    ops = [n.op_type for n in onnx.load(str(paged_dir.onnx_path), load_external_data=False).graph.node]
    assert ops.count("Transpose") <= 2 * layers + 3  # q and output per layer; once per step: indices, masks
    assert ops.count("Expand") == 3  # the write indices' (once per step), none per layer
    # the steps really went through the pool: blocks were taken and all came back
    assert paged.kv.pool.num_free == paged.kv.pool.num_blocks - 1
    assert np.abs(paged.kv.keys[0][:, 1:]).sum() > 0  # head-major pool: blocks are axis 1


def test_paged_int8_cache_matches_hf(model_dir, checkpoint_dir, tmp_path):
    scales = {k: v / 127 for k, v in hf_cache_absmax(model_dir("llama"), prompt_of(40, seed=1)).items()}
    ckpt = with_int8_kv_cache(checkpoint_dir("llama"), tmp_path / "ckpt", scales)
    backend = OrtBackend.open(_build(ckpt, tmp_path / "paged", "paged"))
    assert backend.kv.dtype == np.int8
    prompt = prompt_of(20, seed=5)
    assert greedy(backend, [prompt], STEPS)[0] == hf_greedy_int8_cache(model_dir("llama"), prompt, STEPS, scales)[0]


def test_tensorrt_rtx_builds_the_paged_graph(checkpoint_dir, tmp_path):
    pytest.importorskip("tensorrt_rtx", reason="pip install tensorrt-rtx-cu13")
    out = tmp_path / "engine"
    result = build(checkpoint_dir("llama"), out, BuildConfig(
        dtype="float16", twin_dtype="float32", limits=LIMITS, kv_layout="paged", kv_block_size=BLOCK,
        compute_capabilities=("sm86",)))
    assert (out / "rank0.engine").stat().st_size == result.engine_bytes > 100_000
    graph = onnx.load(str(out / "model.trt.onnx"), load_external_data=False).graph
    names = {i.name for i in graph.input}
    assert {io.BLOCK_TABLE, io.kv_pool_key(0), io.kv_pool_value(1)} <= names and io.past_key(0) not in names
    ops = {n.op_type for n in graph.node}
    assert {"ScatterND", "Gather", "Attention"} <= ops and "TensorScatter" not in ops
    # profiles: the pool up to max_pool_blocks, the table up to max_seq_len / block
    layout = EngineDir.load(out).twin_paged_layout
    for profile in result.tensorrt["profiles"]:
        assert profile[io.kv_pool_key(0)][2][io.POOL_BLOCK_AXIS] == layout.max_pool_blocks(LIMITS.max_batch)
        assert profile[io.BLOCK_TABLE][2] == [LIMITS.max_batch, LIMITS.max_seq_len // BLOCK]
    assert EngineDir.load(out).manifest.build.kv_layout == "paged"


def test_slot_graph_is_unchanged_by_the_option(checkpoint_dir, tmp_path):
    """kv_layout slots (the default) emits the graph it always did: the same bytes as a build without it."""
    ckpt = checkpoint_dir("llama")
    build(ckpt, tmp_path / "a", BuildConfig(targets=("onnxruntime",), dtype="float32", limits=LIMITS))
    build(ckpt, tmp_path / "b", BuildConfig(targets=("onnxruntime",), dtype="float32", limits=LIMITS,
                                            kv_layout="slots", kv_block_size=BLOCK))
    digest = [hashlib.sha256((tmp_path / d / "model.onnx").read_bytes()).hexdigest() for d in "ab"]
    assert digest[0] == digest[1]
    graph = onnx.load(str(tmp_path / "a" / "model.onnx"), load_external_data=False).graph
    assert io.past_key(0) in {i.name for i in graph.input}
    assert not {p.key for p in onnx.load(str(tmp_path / "a" / "model.onnx"),
                                          load_external_data=False).metadata_props} & {io.META_KV_LAYOUT}

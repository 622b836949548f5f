"""lower_ort_attention on every tiny architecture: op counts, numerics against the unfused graph,
the exact limits of onnxruntime's CPU GroupQueryAttention, and the in-place KV cache update."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from ort_check import decoder_feeds
from ort_lowering_check import STEPS, assert_matches_unfused, fused_decoder, save_beside, session, top_level_counts

from engine_builder.formats import graph_io as io
from passes.attention_block import find_attention_block, match_attention_nodes
from passes.base import get_pass
from passes.graph_stats import op_counts

GQA = "com.microsoft.GroupQueryAttention"
# ORT 1.31.1 CPU: a multi-token step over a non-empty cache needs batch 1
GQA_LIMIT = "batch_size must be 1 when sequence_length > 1 and past context is given"
# tiny architectures whose rope is a fixed table of the position (no attention factor, whole head, not
# dynamic): GQA's do_rotary; qwen2 (yarn's attention factor) and phi3 (partial longrope) keep RotaryEmbedding
STATIC_ROPE = {"llama", "llama_tied", "mistral", "qwen3", "gemma2", "gemma3_text"}
QK_NORM = {"qwen3", "gemma3_text"}  # q and k normed after the split: GQA takes them apart


@pytest.fixture
def fused(arch, tiny_model_dir, tmp_path):
    return fused_decoder(tiny_model_dir(arch), tmp_path)


def test_lowers_every_layer_and_keeps_numerics(fused):
    cfg, path, model = fused
    layers = cfg.num_layers
    before = op_counts(model)
    assert get_pass("lower_ort_attention").apply(model) == layers
    top, every = top_level_counts(model), op_counts(model)
    # one If per layer: GroupQueryAttention, or the TensorScatter/Attention block as a fallback
    assert top["If"] == every[GQA] == every["Attention"] == layers
    assert top["Attention"] == top["TensorScatter"] == top[GQA] == 0
    assert every["TensorScatter"] == 2 * layers
    # a rope table that is a fixed function of the position: GQA rotates q and k itself (do_rotary) from
    # the projection's packed output, and RotaryEmbedding (3-D [batch, seq, heads * dim]) and the q/k/v
    # Split run in the fallback branch only; any other rope keeps both in the main graph
    gqa = [n for n in ir.traversal.RecursiveGraphIterator(model.graph) if n.op_type == "GroupQueryAttention"]
    rotating = [n for n in gqa if n.attributes.get("do_rotary") is not None and n.attributes["do_rotary"].value]
    assert bool(rotating) == (cfg.architecture in STATIC_ROPE)
    packed = [n for n in rotating if n.inputs[1] is None and n.inputs[2] is None]  # one [.., (h + 2 kv) d] input
    assert len(packed) == (layers if cfg.architecture in STATIC_ROPE - QK_NORM else 0)
    rotary = [n for n in model.graph if n.op_type == "RotaryEmbedding"]
    assert len(rotary) == 2 * (layers - len(rotating)) and all("num_heads" in n.attributes for n in rotary)
    assert every["RotaryEmbedding"] == 2 * layers
    # q, k, v and the output no longer change layout: only the weight transposes remain
    assert top["Transpose"] == before["Transpose"] - 4 * layers
    windows = [n.attributes["local_window_size"].value for n in ir.traversal.RecursiveGraphIterator(model.graph)
               if n.op_type == "GroupQueryAttention" and "local_window_size" in n.attributes]
    attn = cfg.block.attention
    assert windows == [attn.sliding_window] * attn.layer_types.count("sliding_attention")

    lowered = save_beside(model, path, "lowered")
    for level in ("disable_all", "basic"):
        assert_matches_unfused(path, lowered, level)
    assert get_pass("lower_ort_attention").apply(model) == 0  # idempotent
    assert "no Attention-24" in get_pass("lower_ort_attention").why_not(model)


def test_gqa_alone_is_exact_where_cpu_gqa_accepts_the_step(fused):
    """drop_ort_attention_fallback: the GQA branch by itself, exact (causal per sequence, sliding window,
    soft-cap) on every step but one, which onnxruntime refuses and the runner splits into one row per call
    (tests/runner/test_ort_backend.py); what only the fallback read goes with the If."""
    cfg, path, model = fused
    get_pass("lower_ort_attention").apply(model)
    assert get_pass("drop_ort_attention_fallback").apply(model) == cfg.num_layers
    every = op_counts(model)
    assert every["If"] == every["Attention"] == every["TensorScatter"] == every["LessOrEqual"] == 0
    assert every[GQA] == cfg.num_layers
    if cfg.architecture in STATIC_ROPE:  # GQA rotates: no rotary table is computed from position_ids
        # (its own tables are Cos/Sin of constants, folded when onnxruntime loads the graph: test below)
        assert every["RotaryEmbedding"] == 0
    assert model.metadata_props[io.META_GQA_ROWS_PER_CALL] == "1"
    assert get_pass("drop_ort_attention_fallback").apply(model) == 0  # idempotent
    gqa_only = save_beside(model, path, "gqa_only")
    refused = [(seq, past) for seq, past in STEPS if seq > 1 and len(past) > 1 and max(past) > 0]
    assert_matches_unfused(path, gqa_only, "basic", [s for s in STEPS if s not in refused])
    sess = session(gqa_only, "basic")
    for seq, past in refused:
        with pytest.raises(ort.capi.onnxruntime_pybind11_state.InvalidArgument, match=GQA_LIMIT):
            sess.run(None, decoder_feeds(sess, batch=len(past), seq=seq, past=past))


@pytest.mark.parametrize("arch_name", sorted(STATIC_ROPE))
def test_gqa_rotary_tables_are_the_unlowered_cos_and_sin_to_the_bit(arch_name, tiny_model_dir, tmp_path):
    """GQA's cos/sin caches hold, at every position, the very bits the unlowered graph's Cos/Sin give there.
    Close is not enough: tables computed in numpy (float64 cos, rounded) differed from onnxruntime's
    float32 Cos/Sin by 1-2 ulp on 14-16% of SmolLM2's entries; the float32 twin did not notice (KL 8e-12), but
    the int8-activation MatMulNBits of `--quant int8_wo` rounded differently from there on, and its top-1
    agreement with fp32 fell from 0.951 to 0.933 (tests/eval/test_quantized_fidelity.py's bound is 0.94)."""
    _, path, model = fused_decoder(tiny_model_dir(arch_name), tmp_path)
    blocks, _ = match_attention_nodes(model, find_attention_block)
    # the unlowered graph, with each layer's rotary tables [batch, seq, head_dim / 2] as extra outputs
    tables = {b.present_key.name: (b.rotary.cos.name, b.rotary.sin.name) for b in blocks}
    watched = [v for v in {v.name: v for b in blocks for v in (b.rotary.cos, b.rotary.sin)}.values()]
    model.graph.outputs.extend(v for v in watched if v not in model.graph.outputs)
    unlowered = session(save_beside(model, path, "tables"))
    del model.graph.outputs[-len(watched):]
    max_seq = blocks[0].past_key.shape[2]
    seen = {}
    for seq, past in ((max_seq, [0]), (1, [max_seq - 1, 5, 0])):  # every position at once; decode rows
        feeds = decoder_feeds(unlowered, batch=len(past), seq=seq, past=past)
        got = dict(zip([o.name for o in unlowered.get_outputs()], unlowered.run(None, feeds)))
        seen[seq] = feeds["position_ids"], got

    get_pass("lower_ort_attention").apply(model)
    get_pass("drop_ort_attention_fallback").apply(model)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC  # as every twin loads
    opts.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(save_beside(model, path, "lowered")), opts, providers=["CPUExecutionProvider"])
    optimized = onnx.load(opts.optimized_model_filepath, load_external_data=False)  # the weights stay where they are
    assert not [n.op_type for n in optimized.graph.node if n.op_type in ("Cos", "Sin")]  # folded at load
    folded = {t.name: t for t in optimized.graph.initializer}
    gqa = [n for n in optimized.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == len(blocks)
    for node in gqa:
        present_key = node.output[1]
        for cache, unlowered_name in zip(node.input[7:9], tables[present_key]):
            table = onnx.numpy_helper.to_array(folded[cache])
            assert table.dtype == np.float32 and table.shape == (max_seq, blocks[0].head_dim // 2)
            for positions, got in seen.values():  # bit for bit, not allclose
                np.testing.assert_array_equal(table[positions].view(np.uint32), got[unlowered_name].view(np.uint32),
                                              err_msg=f"{present_key}: {cache} vs {unlowered_name}")


@pytest.mark.parametrize("seq, past", [(1, [7, 3]), (5, [3, 9])], ids=["decode", "fallback-prefill"])
def test_cache_is_updated_in_place_through_io_binding(fused, seq, past):
    """past_key.i and present_key.i bound to one OrtValue: the step writes the new tokens into that
    buffer and leaves the rest alone. Slots above each sequence's new length hold a sentinel: GQA
    without a shared buffer rebuilds present and zero-fills them, so a surviving sentinel shows
    no copy was made; the outputs must still match the unfused graph."""
    _, path, model = fused
    get_pass("lower_ort_attention").apply(model)
    lowered = session(save_beside(model, path, "lowered"), "basic")
    reference = session(path)
    feeds = decoder_feeds(reference, batch=len(past), seq=seq, past=past)
    caches = [k for k in feeds if k.startswith(("past_key.", "past_value."))]
    for k in caches:
        for b, n in enumerate(past):
            feeds[k][b, :, n + seq:] = 7.0  # masked for every query, so the reference ignores it too
    expected = dict(zip([o.name for o in reference.get_outputs()], reference.run(None, feeds)))

    bound = {k: ort.OrtValue.ortvalue_from_numpy(feeds[k].copy()) for k in caches}
    addresses = {k: v.data_ptr() for k, v in bound.items()}
    io = lowered.io_binding()
    for name, value in feeds.items():
        if name in bound:
            io.bind_ortvalue_input(name, bound[name])
        else:
            io.bind_cpu_input(name, value)
    io.bind_output("logits")
    for k in caches:
        io.bind_ortvalue_output(k.replace("past_", "present_"), bound[k])
    lowered.run_with_iobinding(io)

    outputs = dict(zip([o.name for o in lowered.get_outputs()], io.get_outputs()))
    np.testing.assert_allclose(outputs["logits"].numpy(), expected["logits"], atol=1e-4, rtol=1e-4)
    for k in caches:
        present = k.replace("past_", "present_")
        assert outputs[present].data_ptr() == bound[k].data_ptr() == addresses[k]
        buffer = bound[k].numpy()
        np.testing.assert_allclose(buffer, expected[present], atol=1e-4, rtol=1e-4, err_msg=present)
        for b, n in enumerate(past):
            assert np.all(buffer[b, :, n + seq:] == 7.0), f"{present}: slots above the new tokens were rewritten"
            assert not np.allclose(buffer[b, :, n:n + seq], feeds[k][b, :, n:n + seq]), "new tokens not written"


def test_float16_graph_lowers_within_fp16_rounding(tiny_model_dir, tmp_path):
    """CPU GQA has a float16 kernel too; results differ from the unfused graph by fp16 rounding only."""
    _, path, model = fused_decoder(tiny_model_dir("llama"), tmp_path, dtype="float16")
    assert get_pass("lower_ort_attention").apply(model) == 2
    reference, lowered = session(path), session(save_beside(model, path, "lowered"), "basic")
    for seq, past in STEPS:
        feeds = decoder_feeds(reference, batch=len(past), seq=seq, past=past)
        for e, g in zip(reference.run(None, feeds), lowered.run(None, feeds)):
            np.testing.assert_allclose(g.astype(np.float32), e.astype(np.float32), atol=1e-3, rtol=1e-3)

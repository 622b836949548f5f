"""The fusion passes on the real decoder graph of every architecture: op counts and numerics.

The unfused graph is the reference (the network tests prove it against transformers); each
fused graph must give the same logits and the same updated KV cache on a prefill over a
partly filled cache and on a decode step, batch 2 with different cache lengths.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from ort_check import decoder_feeds, session_for

import passes  # noqa: F401
from converters.convert import convert
from engine_builder.formats.checkpoint import CheckpointConfig
from engine_builder.network import NetworkOptions, write_onnx
from passes.base import PassManager
from passes.graph_stats import op_counts

FUSIONS = ["fold_constants", "remove_redundant_ops", "fuse_rms_norm", "fuse_rotary", "fuse_kv_cache_update",
           "fuse_attention", "fuse_attention_softcap", "eliminate_dead_code"]


@pytest.fixture
def decoder(arch, tiny_model_dir, tmp_path):
    convert(tiny_model_dir(arch), tmp_path / "ckpt")
    path = write_onnx(tmp_path / "ckpt", tmp_path / "engine", NetworkOptions(max_seq_len=32))
    return CheckpointConfig.load(tmp_path / "ckpt").model, path


def test_fusions_keep_numerics(decoder):
    cfg, path = decoder
    model = ir.load(path)
    before = op_counts(model)
    results = {r.name: r.matches for r in PassManager(FUSIONS).run(model)}
    fused_path = path.with_name("fused.onnx")  # beside rank0.safetensors, so external data resolves
    ir.save(model, fused_path)
    after = op_counts(model)

    layers = cfg.num_layers
    attn, residual = cfg.block.attention, cfg.block.residual
    norms = 2 * layers + 1 + (2 * layers if attn.qk_norm else 0) + \
        layers * (int(residual.post_attention_norm) + int(residual.post_mlp_norm))
    assert results["fuse_rms_norm"] == norms == after["RMSNormalization"]
    assert results["fuse_rotary"] == 2 * layers == after["RotaryEmbedding"]
    assert results["fuse_kv_cache_update"] == 2 * layers == after["TensorScatter"]
    capped = layers if attn.logit_softcap else 0
    assert results["fuse_attention"] == layers - capped and results["fuse_attention_softcap"] == capped
    assert after["Attention"] == layers
    assert after["Softmax"] == after["ScatterND"] == after["ReduceMean"] == after["Neg"] == 0
    assert sum(after.values()) < sum(before.values())
    rotary = [n for n in model.graph if n.op_type == "RotaryEmbedding"]
    if cfg.rope.dim < cfg.head_dim:  # partial rotary folded into the op, not sliced around it
        assert all(n.attributes["rotary_embedding_dim"].value == cfg.rope.dim for n in rotary)

    reference, fused = session_for(path), session_for(fused_path)
    for seq, past in ((5, [3, 9]), (1, [7, 0])):  # prefill over a partly filled cache, then decode
        feeds = decoder_feeds(reference, batch=2, seq=seq, past=past)
        expected, got = reference.run(None, feeds), fused.run(None, feeds)
        for name, e, g in zip([o.name for o in reference.get_outputs()], expected, got):
            np.testing.assert_allclose(g, e, atol=1e-4, rtol=1e-4, err_msg=name)

    # idempotent
    again = PassManager(FUSIONS[2:7]).run(model)
    assert all(r.matches == 0 for r in again), again

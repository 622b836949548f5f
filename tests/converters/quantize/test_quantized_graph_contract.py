"""The contract end to end: checkpoints written by `convert --quant` (and ingested AWQ / GPTQ ones), emitted
as the decoder graph and run by onnxruntime, compute what transformers computes on the same checkpoint
dequantized (converters/quantize/FORMAT.md read by this suite's own helper, checkpoint_to_hf.py)."""

from __future__ import annotations

import shutil

import numpy as np
import onnxruntime as ort
import pytest
import torch
from checkpoint_to_hf import canonical_to_hf, dequantized, hf_model
from runner_engines import add_word_tokenizer
from test_prequantized import AWQ_CONFIG, GPTQ_CONFIG, write_prequantized

from converters.convert import convert
from engine_builder.formats import graph_io as io
from engine_builder.formats.checkpoint import CheckpointConfig
from engine_builder.network import NetworkOptions, write_onnx

SEQ = 24
TOL = 1e-4  # float32 graph against float32 eager transformers, as tests/engine_builder/test_network.py
INGEST_GROUP = 16  # zero points are read as an ONNX uint4 tensor: groups per row must be even (96 / 16)


def ort_logits(ckpt, tmp_path, ids: np.ndarray) -> np.ndarray:
    """All-position logits [seq, vocab] of CKPT's decoder graph for one prompt, empty cache."""
    path = write_onnx(ckpt, tmp_path / "onnx", NetworkOptions(max_seq_len=SEQ, all_logits=True, dtype="float32"))
    options = ort.SessionOptions()
    options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")  # exact, not int8 inputs
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feeds = {i.name: np.zeros([1, *i.shape[1:]], np.float32) for i in session.get_inputs()
             if i.name.startswith(("past_key.", "past_value."))}
    feeds |= {io.INPUT_IDS: ids[None, :], io.POSITION_IDS: np.arange(len(ids))[None, :],
              io.PAST_LENGTHS: np.zeros(1, np.int64)}
    return session.run([io.LOGITS], feeds)[0][0]


def hf_logits(hf_dir, ckpt, ids: np.ndarray) -> np.ndarray:
    tensors, input_scales = dequantized(ckpt)
    assert not input_scales  # weight-only schemes: nothing is rounded at run time, so the two agree to 1e-4
    model = hf_model(hf_dir, canonical_to_hf(tensors, "llama", CheckpointConfig.load(ckpt).model))
    with torch.no_grad():
        return model(torch.from_numpy(ids)[None, :]).logits[0].numpy()


@pytest.mark.parametrize("source", ["int8_wo", "int4_wo", "int4_awq", "awq", "gptq"])
def test_graph_of_quantized_checkpoint_matches_transformers(source, tiny_model_dir, tmp_path):
    hf = tmp_path / "hf"
    shutil.copytree(tiny_model_dir("llama"), hf)
    if source in ("awq", "gptq"):
        src = tmp_path / "src"
        write_prequantized(hf, src, source, {**(AWQ_CONFIG if source == "awq" else GPTQ_CONFIG),
                                             "group_size": INGEST_GROUP}, group_size=INGEST_GROUP)
        convert(src, tmp_path / "ckpt", dtype="float32")
    elif source == "int4_awq":  # calibrated: AWQ scales folded into the norms and the up rows
        add_word_tokenizer(hf, 320)
        text = tmp_path / "words.txt"
        text.write_text(" ".join(f"w{i}" for i in np.random.default_rng(0).integers(30, 100, 200)))
        convert(hf, tmp_path / "ckpt", quant=source, group_size=32, calib=text, calib_samples=4, calib_seq_len=32)
    else:
        convert(hf, tmp_path / "ckpt", quant=source, group_size=32)
    assert CheckpointConfig.load(tmp_path / "ckpt").quantization.scheme == source
    ids = np.random.default_rng(5).integers(3, 320, SEQ)
    got, want = ort_logits(tmp_path / "ckpt", tmp_path, ids), hf_logits(hf, tmp_path / "ckpt", ids)
    assert np.abs(got - want).max() <= TOL

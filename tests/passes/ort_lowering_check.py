"""Shared by the onnxruntime lowering tests: the fused decoder graph of a tiny model, and the
decoder steps every lowered graph must reproduce against the unfused graph."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
from ort_check import decoder_feeds
from test_decoder_pipeline import FUSIONS  # the fusion pipeline every lowering runs after

import passes  # noqa: F401
from converters.convert import convert
from engine_builder.formats.checkpoint import CheckpointConfig
from engine_builder.formats.model_config import ModelConfig
from engine_builder.network import NetworkOptions, write_onnx
from passes.base import PassManager

LEVELS = {"disable_all": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
          "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
          "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}

# (seq, past_lengths), batch = len(past_lengths): a batched prefill over partly filled caches,
# a batched first prefill, a single-sequence chunked prefill, decode with uneven lengths, and
# decode with both sequences past the tiny models' sliding window of 8
STEPS = [(5, [3, 9]), (5, [0, 0]), (6, [11]), (1, [7, 0]), (1, [20, 13])]


def fused_decoder(hf_dir: Path, tmp: Path, dtype: str = "auto") -> tuple[ModelConfig, Path, ir.Model]:
    """(config, unfused model.onnx, fused model) of the tiny HF model in hf_dir."""
    convert(hf_dir, tmp / "ckpt")
    path = write_onnx(tmp / "ckpt", tmp / "engine", NetworkOptions(max_seq_len=32, dtype=dtype))
    model = ir.load(path)
    PassManager(FUSIONS).run(model)
    return CheckpointConfig.load(tmp / "ckpt").model, path, model


def save_beside(model: ir.Model, unfused: Path, name: str) -> Path:
    path = unfused.with_name(f"{name}.onnx")  # beside rank0.safetensors, so external data resolves
    ir.save(model, path)
    return path


def session(path: Path, level: str = "disable_all") -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = LEVELS[level]
    opts.log_severity_level = 3  # TensorScatter warns on every copy it makes
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def assert_matches_unfused(unfused: Path, lowered: Path, level: str,
                           steps: list[tuple[int, list[int]]] = STEPS) -> None:
    """Logits and every updated cache buffer within fp32 1e-4 of the unfused graph, step by step."""
    reference, got = session(unfused), session(lowered, level)
    names = [o.name for o in reference.get_outputs()]
    for seq, past in steps:
        feeds = decoder_feeds(reference, batch=len(past), seq=seq, past=past)
        for name, e, g in zip(names, reference.run(None, feeds), got.run(None, feeds)):
            np.testing.assert_allclose(g, e, atol=1e-4, rtol=1e-4, err_msg=f"{name}, seq {seq}, past {past}")


def top_level_counts(model: ir.Model) -> Counter[str]:
    """Op counts of the main graph only (graph_stats.op_counts also counts If branches)."""
    return Counter(f"{n.domain}.{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type for n in model.graph)

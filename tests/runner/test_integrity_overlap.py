"""LLM() hashes the engine's files while it loads (cold start, issue 16) and still refuses every change the
blocking check refuses, with the same one-line errors, before it returns."""

from __future__ import annotations

import re
import shutil

import pytest
from runner_engines import build_engine

from engine_builder import LLM, SamplingParams
from engine_builder.formats.build_config import Limits
from engine_builder.runner.engine import EngineDir
from engine_builder.util.errors import InputError

LIMITS = Limits(max_batch=2, max_input_len=16, max_seq_len=32)


def test_overlapped_hashing_refuses_what_the_blocking_check_refuses(tiny_engine, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_engine("llama")[0].parent / "ckpt", ckpt)
    engine = build_engine(ckpt, tmp_path / "engine", LIMITS)
    with LLM(engine, backend="onnxruntime") as llm:  # intact: loads and generates
        assert llm.generate("w3 w4", SamplingParams(max_new_tokens=2, temperature=0))[0].token_ids

    graph = (engine / "model.onnx").read_bytes()
    (engine / "model.onnx").write_bytes(graph[:-1] + bytes([graph[-1] ^ 0x01]))  # same size: only the hash can tell
    pending = EngineDir.load(engine, verify="overlap")  # returns while hashing
    with pytest.raises(InputError, match=re.escape(f"{engine / 'model.onnx'} is modified: sha256 ")):
        pending.wait_verified()
    with pytest.raises(InputError, match=re.escape(f"{engine / 'model.onnx'} is modified: sha256 ")):
        LLM(engine, backend="onnxruntime")  # whether or not onnxruntime could parse the changed graph
    (engine / "model.onnx").write_bytes(graph)

    size = (engine / "rank0.safetensors").stat().st_size
    with open(engine / "rank0.safetensors", "r+b") as f:
        f.truncate(size - 4)
    with pytest.raises(InputError, match=rf"rank0.safetensors is modified: {size - 4} bytes, the build wrote {size}"):
        EngineDir.load(engine, verify="overlap")  # a size is refused at once, before any hashing
    with pytest.raises(InputError, match="rank0.safetensors is modified"):
        LLM(engine, backend="onnxruntime")

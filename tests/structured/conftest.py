"""Structured-output fixtures: a tiny random Llama over SmolLM2's real BPE tokenizer (so it can spell
JSON, unlike the word tokenizer of tests/server), and live `trtbuild serve` processes (one each for the
session: these tests send only stateless requests)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch
import transformers
from runner_engines import build_engine

sys.path.insert(0, str(Path(__file__).parents[1] / "server"))
from live_server import live_server  # noqa: E402

from converters.convert import convert  # noqa: E402
from engine_builder.formats.build_config import Limits  # noqa: E402

TINY_BPE_LIMITS = Limits(max_batch=4, max_input_len=384, max_seq_len=640)
# tool definitions make long prompts: more than the 128 input tokens of tests/conftest.py's SmolLM2 engine
SMOL_SERVE_LIMITS = Limits(max_batch=4, max_input_len=512, max_seq_len=768)


@pytest.fixture(scope="session")
def tiny_bpe_engine(smollm2_ckpt, tmp_path_factory) -> Path:
    """2 layers, hidden 64, SmolLM2's vocabulary (49152), tokenizer and chat template; random weights."""
    root = tmp_path_factory.mktemp("tiny-bpe")
    hf = root / "hf"
    config = transformers.LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(hf)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(smollm2_ckpt / name, hf / name)
    convert(hf, root / "ckpt", dtype="float32")
    return build_engine(root / "ckpt", root / "engine", TINY_BPE_LIMITS)


@pytest.fixture(scope="session")
def smol_long_engine(smollm2_ckpt) -> Path:
    """SmolLM2 fp32 (the session's checkpoint) with room for tool definitions in the prompt."""
    (smollm2_ckpt.parent / "long").mkdir(exist_ok=True)  # the dir is named engine: serve calls the model that
    return build_engine(smollm2_ckpt, smollm2_ckpt.parent / "long" / "engine", SMOL_SERVE_LIMITS)


@pytest.fixture(scope="session")
def smol_server(smol_long_engine):
    with live_server(smol_long_engine) as s:
        yield s


@pytest.fixture(scope="session")
def tiny_bpe_server(tiny_bpe_engine):
    with live_server(tiny_bpe_engine) as s:
        yield s

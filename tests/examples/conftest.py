"""Fixtures of the examples' tests: a tiny random Llama over SmolLM2's real BPE tokenizer and chat template, with
room in its prompt for tool definitions (SmolLM2's session engine takes 128 input tokens; a tool prompt holds
~160), for the examples whose output is grammar-constrained and whose content does not matter."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from runner_engines import build_engine

from converters.convert import convert
from engine_builder.formats.build_config import Limits


@pytest.fixture(scope="session")
def tiny_smol_vocab_engine(smollm2_ckpt, tmp_path_factory) -> Path:
    """2 layers, hidden 64, SmolLM2's vocabulary (49152), tokenizer and chat template; random weights. ~3 s."""
    import torch
    import transformers

    root = tmp_path_factory.mktemp("examples-tiny-bpe")
    config = transformers.LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(root / "hf")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(smollm2_ckpt / name, root / "hf" / name)
    convert(root / "hf", root / "ckpt", dtype="float32")
    return build_engine(root / "ckpt", root / "engine", Limits(max_batch=2, max_input_len=384, max_seq_len=512))

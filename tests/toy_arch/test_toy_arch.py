"""An architecture the package does not support, added with one registered file (helium_arch.py) and
this test: tiny random HF model -> convert -> float32 onnxruntime engine -> greedy tokens == transformers."""

from __future__ import annotations

from pathlib import Path

import helium_arch
import numpy as np
import torch
import transformers
from hf_greedy import assert_greedy_equals_hf
from runner_engines import add_word_tokenizer
from tiny_models import COMMON

import converters
from converters.convert import convert
from engine_builder.build.pipeline import build
from engine_builder.formats.build_config import BuildConfig, Limits
from engine_builder.formats.checkpoint import CheckpointConfig

PACKAGES = ("converters", "engine_builder", "passes")
ROOT = Path(__file__).parents[2]
STEPS = 16


def tiny_helium(out: Path) -> Path:
    """2 layers, GQA, q/k/v and MLP biases; norms and biases moved off their init so a wrong one shows.

    Weights 10x transformers' init scale: at 0.02 the perturbed biases swamp attention and greedy
    decoding repeats one token whatever the rotary layout; at 0.2 a wrong layout changes the tokens."""
    config = transformers.HeliumConfig(**{**COMMON, "head_dim": 16, "attention_bias": True, "mlp_bias": True,
                                          "initializer_range": 0.2})
    torch.manual_seed(0)
    model = transformers.HeliumForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(out)
    add_word_tokenizer(out, COMMON["vocab_size"])  # the engine dir's LLM wants a tokenizer
    return out


def test_nothing_in_the_package_names_it():
    """The registration came from tests/: no file under converters/, engine_builder/ or passes/ had to change."""
    assert helium_arch.HeliumConverter.__module__ == "helium_arch"
    assert converters.get_converter("helium") is helium_arch.HeliumConverter
    named = [str(f.relative_to(ROOT)) for pkg in PACKAGES for f in (ROOT / pkg).rglob("*.py")
             if "helium" in f.read_text().lower()]
    assert named == []


def test_greedy_generation_matches_transformers(tmp_path):
    hf_dir = tiny_helium(tmp_path / "hf")
    convert(hf_dir, tmp_path / "ckpt", dtype="float32")
    model = CheckpointConfig.load(tmp_path / "ckpt").model
    assert model.architecture == "helium" and model.rope.interleaved and model.block.attention.qkv_bias
    engine = tmp_path / "engine"
    build(tmp_path / "ckpt", engine, BuildConfig(targets=("onnxruntime",), dtype="float32",
                                                  limits=Limits(max_batch=1, max_input_len=32, max_seq_len=64)))

    prompt = np.random.default_rng(7).integers(3, COMMON["vocab_size"], 20).tolist()
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32,
                                                           attn_implementation="eager").eval()
    assert_greedy_equals_hf(hf, engine, prompt, STEPS)

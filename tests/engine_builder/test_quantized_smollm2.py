"""What onnxruntime's accuracy level costs on the real model: SmolLM2-135M int8_wo (RTN, lm_head
included) in float32, MatMulNBits at level 4 (the default: int8 activations) and at level 0 (exact),
each fed fp32's own greedy continuation of a prompt and compared with fp32 step by step."""

from __future__ import annotations

import json

import numpy as np
import pytest
import transformers
from ort_helpers import OrtDecoder
from quantized_ckpt import quantize_checkpoint
from runner_engines import build_engine
from test_quantized_numerics import EXACT_ORT_PASSES

from engine_builder.formats.manifest import ORT_MODEL

STEPS = 48
PROMPT = "The capital of France is Paris. The largest planet in the solar system is"


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max()
    return x - np.log(np.exp(x).sum())


def forced(model_path, prompt: list[int], tokens: list[int]) -> list[np.ndarray]:
    """Logits [vocab] after the prompt and after each of TOKENS but the last, fed one by one."""
    decoder = OrtDecoder(model_path, level="basic")
    seqs = decoder.empty(1)
    logits = [decoder.run(seqs, np.array([prompt]))[0, -1]]
    logits += [decoder.run(seqs, np.array([[t]]))[0, -1] for t in tokens[:-1]]
    return logits


@pytest.fixture(scope="module")
def int8_engines(smollm2_ckpt, module_tmp_factory):
    root = module_tmp_factory.mktemp("smollm2-int8")
    qckpt = quantize_checkpoint(smollm2_ckpt, root / "ckpt", "int8_wo")
    return {"level4": build_engine(qckpt, root / "level4"),
            "level0": build_engine(qckpt, root / "level0", ort_passes=EXACT_ORT_PASSES)}


def test_accuracy_level_4_costs_little_on_smollm2(smollm2_engine, int8_engines):
    tok = transformers.AutoTokenizer.from_pretrained(smollm2_engine)
    prompt = tok(PROMPT)["input_ids"]
    ref_tokens, ref_logits = OrtDecoder(smollm2_engine / ORT_MODEL, level="basic").greedy(prompt, STEPS)
    assert tok.decode(ref_tokens).startswith(" Jupiter")
    figures = {}
    for name, engine in int8_engines.items():
        level = json.loads((engine / "config.json").read_text())["quantization"]["onnxruntime_accuracy_level"]
        assert level == int(name[-1])
        logits = forced(engine / ORT_MODEL, prompt, ref_tokens)
        top1 = np.mean([np.argmax(a) == np.argmax(b) for a, b in zip(logits, ref_logits)])
        kl = np.mean([np.sum(np.exp(log_softmax(b)) * (log_softmax(b) - log_softmax(a)))
                      for a, b in zip(logits, ref_logits)])
        figures[name] = (float(top1), float(kl))
    # measured (48 steps): level 0 top-1 95.8%, KL 0.0031; level 4 top-1 95.8%, KL 0.0062. RTN int8
    # weights with an int8 lm_head are the main cost; int8 activations add about as much KL again
    assert figures["level0"][0] >= 0.93 and figures["level4"][0] >= 0.93, figures
    assert figures["level0"][1] <= 0.005 and figures["level4"][1] <= 0.01, figures

"""The graphs an engine dir ships, after each target's passes, against Hugging Face (fp32).

model.onnx (onnxruntime passes) and model.trt.onnx (tensorrt passes: the graph TensorRT
parsed) both run in onnxruntime: prefill plus 16 greedy decode steps over the KV cache,
logits within 1e-4 of transformers at every step and the same tokens.
"""

from __future__ import annotations

import numpy as np
import pytest
from hf_reference import hf_greedy, prompt_of
from ort_helpers import OrtDecoder

from engine_builder.build.pipeline import build
from engine_builder.formats.build_config import BuildConfig, Limits
from engine_builder.formats.manifest import ORT_MODEL, TRT_MODEL

TOL = 1e-4
STEPS = 17  # the prefill's token + 16 decode steps


@pytest.fixture(scope="module")
def engine_dir(checkpoint_dir, module_tmp_factory):
    """engine_dir(name, dtype) -> a small engine dir of that tiny model, built once.

    float32 builds both targets (TensorRT decomposes fp32 attention); float16 only the twin."""
    made = {}

    def get(name: str, dtype: str = "float32"):
        if (name, dtype) not in made:
            out = module_tmp_factory.mktemp(f"{name}-{dtype}") / "engine"
            targets = ("tensorrt", "onnxruntime") if dtype == "float32" else ("onnxruntime",)
            build(checkpoint_dir(name), out, BuildConfig(
                targets=targets, dtype=dtype, limits=Limits(max_batch=2, max_input_len=64, max_seq_len=128),
                compute_capabilities=("sm86",)))
            made[name, dtype] = out
        return made[name, dtype]

    return get


@pytest.mark.parametrize("graph", [ORT_MODEL, TRT_MODEL])
def test_after_passes_matches_hf(arch, model_dir, engine_dir, graph):
    prompt = prompt_of(20, seed=7)
    want_tokens, want_logits = hf_greedy(model_dir(arch), prompt, STEPS)
    tokens, logits = OrtDecoder(engine_dir(arch) / graph).greedy(prompt, STEPS)
    errors = [float(np.abs(got - want).max()) for got, want in zip(logits, want_logits)]
    assert max(errors) <= TOL, f"max |logits - HF| per step: {[f'{e:.1e}' for e in errors]}"
    assert tokens == want_tokens


def test_fp16_twin_is_as_accurate_as_hf_fp16(arch, model_dir, engine_dir):
    """fp16 differs by design: the fused, lowered fp16 twin is held to HF's own fp16 error."""
    import torch
    from hf_reference import load_hf

    prompt = prompt_of(20, seed=8)
    with torch.no_grad():
        ref = load_hf(model_dir(arch))(torch.tensor([prompt])).logits[0, -1].numpy()
        hf16 = load_hf(model_dir(arch), torch.float16)(torch.tensor([prompt])).logits[0, -1].float().numpy()
    dec = OrtDecoder(engine_dir(arch, "float16") / ORT_MODEL)
    got = dec.run(dec.empty(1), np.array([prompt]))[0, -1]
    assert np.abs(got - ref).max() <= 1.5 * np.abs(hf16 - ref).max()

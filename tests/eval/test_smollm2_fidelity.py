"""The real model: SmolLM2-135M fp16 onnxruntime engine against its fp32 checkpoint on the shipped text.

The fp32 reference (built on the fly from the checkpoint) must score exactly what Hugging Face
transformers scores on the same windows, and fp16 must stay within bounds set from measurement.
Measured here (512 tokens, 64-token windows): KL 7.4e-6 nats, top-1 0.998 (1 of 504 positions
differs), ppl 49.594 vs 49.603 (1.8e-4 relative); at the CLI defaults (1024 tokens, 256-token
windows): KL 6.0e-6, top-1 0.997, ppl 27.2814 vs 27.2847. The bounds leave ~7x headroom on KL and
~5x on ppl for onnxruntime/CPU differences, and hold top-1 at the issue's 0.99.
The fp16 engine has 8 KV slots because onnxruntime's fp16 CPU step costs nearly the same at batch
8 as at batch 1, so all 8 windows share each step.
"""

from __future__ import annotations

import math

import pytest
import torch
from runner_engines import build_engine

from engine_builder.eval import evaluate
from engine_builder.eval.text import load_text
from engine_builder.formats.build_config import Limits

TOKENS, CONTEXT = 512, 64


@pytest.fixture(scope="module")
def smollm2_fp16_engine(smollm2_ckpt, module_tmp_factory):
    return build_engine(smollm2_ckpt, module_tmp_factory.mktemp("smollm2-fp16") / "engine",
                        Limits(max_batch=8, max_input_len=CONTEXT, max_seq_len=CONTEXT), dtype="float16")


def hf_windows_ppl(hf_smollm2) -> float:
    model, tokenizer = hf_smollm2
    ids = tokenizer(load_text(None).text, add_special_tokens=False)["input_ids"][:TOKENS]
    batch = torch.tensor(ids).reshape(TOKENS // CONTEXT, CONTEXT)  # [windows, context]: the same windows as eval
    with torch.no_grad():
        logp = model(batch).logits[:, :-1].double().log_softmax(-1)  # [windows, context - 1, vocab]
    nll = -logp.gather(-1, batch[:, 1:, None]).sum().item()
    return math.exp(nll / (batch.shape[0] * (CONTEXT - 1)))


def test_fp16_against_fp32_checkpoint(smollm2_fp16_engine, smollm2_ckpt, hf_smollm2):
    result = evaluate(smollm2_fp16_engine, reference=smollm2_ckpt, max_tokens=TOKENS, context=CONTEXT)
    assert (result.tokens, result.windows, result.context) == (TOKENS - TOKENS // CONTEXT, 8, CONTEXT)
    assert result.reference_ppl == pytest.approx(hf_windows_ppl(hf_smollm2), rel=1e-4)
    print(f"\nSmolLM2 fp16 vs fp32: ppl {result.ppl:.4f} vs {result.reference_ppl:.4f}, KL {result.kl:.3g}, "
          f"top-1 {result.top1_agreement:.4f}, {result.seconds:.1f}s")
    assert result.top1_agreement >= 0.99
    assert 0 < result.kl < 5e-5
    assert result.ppl == pytest.approx(result.reference_ppl, rel=1e-3)

"""lm-eval (EleutherAI's harness) drives a real `trtbuild serve` through local-completions: its
loglikelihood requests read /v1/completions echo + logprobs, which must equal the twin's own
log-softmax. The task is tests/structured/lm_eval_tasks/tiny_qa.yaml (16 two-choice questions)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import yaml

from engine_builder import LLM
from engine_builder.runner.logits_processors import log_softmax

TASKS = Path(__file__).parent / "lm_eval_tasks"


def _direct_loglikelihood(llm: LLM, context: str, continuation: str) -> tuple[float, bool]:
    """lm-eval's split (context tokens, then the rest of context + continuation), scored one token per
    engine call with float32 log_softmax: the twin's own numbers."""
    whole = llm.tokenizer(context + continuation, add_special_tokens=False).input_ids
    ctx = llm.tokenizer(context, add_special_tokens=False).input_ids
    backend = llm.backend
    backend.kv.allocate(0, len(whole), 1)
    total, greedy = 0.0, True
    try:
        for i in range(len(whole) - 1):
            logits = backend.step(0, np.asarray([[whole[i]]], np.int64))
            backend.kv.advance(0, 1)
            if i + 1 >= len(ctx):
                logp = log_softmax(np.array(logits))[0]
                total += float(logp[whole[i + 1]])
                greedy &= int(logp.argmax()) == whole[i + 1]
    finally:
        backend.release(0)
    return total, greedy


def test_lm_eval_local_completions_matches_direct_scoring(smol_server, smol_long_engine, tmp_path, monkeypatch):
    import lm_eval
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    task = yaml.safe_load((TASKS / "tiny_qa.yaml").read_text())
    task["dataset_kwargs"]["data_files"]["test"] = str(TASKS / "tiny_qa.jsonl")
    (tmp_path / "tiny_qa.yaml").write_text(yaml.safe_dump(task))
    results = lm_eval.simple_evaluate(
        model="local-completions",
        model_args=f"base_url={smol_server.url}/v1/completions,model=engine,tokenizer={smol_long_engine},"
                   "tokenizer_backend=huggingface,tokenized_requests=True,num_concurrent=1,max_retries=1",
        tasks=["trtbuild_tiny_qa"], task_manager=TaskManager(include_path=str(tmp_path)), log_samples=True)
    samples = results["samples"]["trtbuild_tiny_qa"]
    assert len(samples) == 16
    with LLM(smol_long_engine, backend="onnxruntime") as llm:
        correct = 0
        for sample in samples:
            scores = []
            for (context, continuation), (served,) in zip(sample["arguments"], sample["resps"]):
                direct = _direct_loglikelihood(llm, context, continuation)
                assert math.isclose(served[0], direct[0], rel_tol=0, abs_tol=1e-4), (served, direct)
                assert served[1] == direct[1]
                scores.append(direct[0])
            correct += int(np.argmax(scores)) == sample["target"]
    acc = results["results"]["trtbuild_tiny_qa"]["acc,none"]
    assert acc == correct / len(samples)
    assert acc > 0.5  # SmolLM2 answers these; a broken echo/logprobs path scores at chance or below

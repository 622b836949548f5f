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


def _direct_loglikelihoods(llm: LLM, context: str, continuations: list[str]) -> list[tuple[float, bool]]:
    """lm-eval's split (its _encode_pair: the context's tokens, then what the whole adds), scored one
    token per engine call with float32 log_softmax: the twin's own numbers. The context is fed once and
    each continuation continues from it (the KV cache rewound to the context's end)."""
    ctx = llm.tokenizer(context, add_special_tokens=False).input_ids
    conts = [llm.tokenizer(context + c, add_special_tokens=False).input_ids[len(ctx):] for c in continuations]
    backend = llm.backend
    backend.kv.allocate(0, len(ctx) + max(map(len, conts)), 1)

    def step(token: int) -> np.ndarray:
        logits = np.array(backend.step(0, np.asarray([[token]], np.int64)))  # [1, vocab], a copy
        backend.kv.advance(0, 1)
        return log_softmax(logits)[0]

    out = []
    try:
        for t in ctx[:-1]:
            step(t)
        after_context = step(ctx[-1])
        for cont in conts:
            backend.kv.rewind(0, len(ctx))
            logp, total, greedy = after_context, 0.0, True
            for i, token in enumerate(cont):
                total += float(logp[token])
                greedy &= int(logp.argmax()) == token
                if i + 1 < len(cont):
                    logp = step(token)
            out.append((total, greedy))
    finally:
        backend.release(0)
    return out


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
            context = sample["arguments"][0][0]
            assert all(a[0] == context for a in sample["arguments"])
            direct = _direct_loglikelihoods(llm, context, [a[1] for a in sample["arguments"]])
            for (served,), (ll, greedy) in zip(sample["resps"], direct):
                assert math.isclose(served[0], ll, rel_tol=0, abs_tol=1e-4), (served, ll)
                assert served[1] == greedy
            scores = [ll for ll, _ in direct]
            correct += int(np.argmax(scores)) == sample["target"]
    acc = results["results"]["trtbuild_tiny_qa"]["acc,none"]
    assert acc == correct / len(samples)
    assert acc > 0.5  # SmolLM2 answers these; a broken echo/logprobs path scores at chance or below

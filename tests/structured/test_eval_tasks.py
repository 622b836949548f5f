"""`trtbuild eval ENGINE --tasks ...` as a user runs it: lm-eval scores the engine through its own OpenAI
API (a loopback server for the run), and the accuracy equals scoring the same items directly on the twin
(tiny random model over SmolLM2's tokenizer: the scores are arbitrary, their ranking must match)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import yaml
from cli_process import assert_user_error, trtbuild
from test_lm_eval import _direct_loglikelihoods

from engine_builder import LLM

TASKS = Path(__file__).parent / "lm_eval_tasks"


def _task_dir(tmp_path: Path) -> Path:
    task = yaml.safe_load((TASKS / "tiny_qa.yaml").read_text())
    task["dataset_kwargs"]["data_files"]["test"] = str(TASKS / "tiny_qa.jsonl")
    (tmp_path / "tiny_qa.yaml").write_text(yaml.safe_dump(task))
    return tmp_path


def test_eval_tasks_accuracy_equals_direct_scoring(tiny_bpe_engine, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    proc = trtbuild("eval", tiny_bpe_engine, "--tasks", "trtbuild_tiny_qa", "--include-path", _task_dir(tmp_path),
                    "--backend", "onnxruntime", "--limit", "8", "--json")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["tasks"] == ["trtbuild_tiny_qa"] and got["samples"]["trtbuild_tiny_qa"] == 8
    docs = [json.loads(line) for line in (TASKS / "tiny_qa.jsonl").read_text().splitlines()[:8]]
    with LLM(tiny_bpe_engine, backend="onnxruntime") as llm:
        correct = 0
        for doc in docs:  # the task's doc_to_text, and lm-eval's " " between context and each choice
            scores = _direct_loglikelihoods(llm, f"Question: {doc['question']}\nAnswer:",
                                            [f" {c}" for c in doc["choices"]])
            correct += int(np.argmax([ll for ll, _ in scores])) == doc["answer"]
    assert got["results"]["trtbuild_tiny_qa"]["acc,none"] == correct / len(docs)


def test_harness_options_need_tasks(tiny_bpe_engine):
    assert_user_error(trtbuild("eval", tiny_bpe_engine, "--limit", "3", timeout=120), "go with --tasks")

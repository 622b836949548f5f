"""Speculative decoding set once, in a recipe: `runtime.speculative` goes into the engine dir (runtime.json,
a draft engine's path made relative to the engine dir), `run` and `serve` then speculate by default
with the same tokens, and `--speculative off` turns it off; `chat --speculative` answers as plain chat."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from cli_process import assert_user_error, trtbuild
from test_chat_cli import Q1, Q2, chat

from engine_builder import LLM, SamplingParams
from engine_builder.formats.runtime_config import RUNTIME_FILE

PROMPT = "w5 w6 w7 w8 w9 w10 w5 w6 w7 w8 w9 w10 w5 w6 w7"


def _run_json(engine, *flags: str) -> dict:
    proc = trtbuild("run", engine, "--prompt", PROMPT, "--max-new-tokens", "30", "--temperature", "0", "--json",
                    "--backend", "onnxruntime", "--no-chat", *flags)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_recipe_runtime_speculative_is_the_engines_default(tiny_serve_engine, tmp_path):
    ckpt = tiny_serve_engine.parent / "ckpt"
    drafts = tmp_path / "drafts"
    shutil.copytree(tiny_serve_engine, drafts / "draft-engine")  # a draft engine beside the recipe
    recipe = drafts / "spec.yaml"
    recipe.write_text("model: tiny\nbuild:\n  targets: [onnxruntime]\n  dtype: float32\n"
                      "  limits: {max_batch: 2, max_input_len: 32, max_seq_len: 96}\n"
                      "runtime:\n  speculative: {method: draft, draft_engine: draft-engine, num_draft_tokens: 3}\n")
    out = tmp_path / "built" / "engine"
    out.parent.mkdir()
    proc = trtbuild("build", ckpt, out, "--recipe", recipe)
    assert proc.returncode == 0, proc.stderr
    saved = json.loads((out / RUNTIME_FILE).read_text())
    assert saved["speculative"] == {"method": "draft", "draft_engine": "../../drafts/draft-engine",
                                    "num_draft_tokens": 3}

    want = LLM(out).generate(PROMPT, SamplingParams(max_new_tokens=30, temperature=0))[0]
    got = _run_json(out)  # no flag: the recipe's runtime block
    assert got["token_ids"] == list(want.token_ids)
    assert got["speculative"]["method"] == "draft" and got["speculative"]["verify_steps"] > 0
    ngram = _run_json(out, "--speculative", "ngram")  # a flag wins over the engine's default
    assert ngram["token_ids"] == list(want.token_ids) and ngram["speculative"]["method"] == "ngram"
    off = _run_json(out, "--speculative", "off")
    assert off["token_ids"] == list(want.token_ids) and "speculative" not in off
    # the pair moves together: the draft path is relative to the engine dir
    (tmp_path / "moved").mkdir()
    shutil.move(tmp_path / "built", tmp_path / "moved" / "built")
    shutil.move(drafts, tmp_path / "moved" / "drafts")
    assert _run_json(tmp_path / "moved" / "built" / "engine")["speculative"]["method"] == "draft"


@pytest.mark.parametrize("runtime, needle", [
    ("{speculative: {method: draft}}", "needs runtime.speculative.draft_engine"),
    ("{speculative: {method: medusa}}", "runtime.speculative.method"),
    ("{speculative: {method: ngram, num_draft_tokens: 0}}", "positive integer"),
    ("{speculative: {method: ngram, k: 2}}", "k"),
])
def test_bad_runtime_blocks_are_refused_before_the_build(tiny_serve_engine, tmp_path, runtime, needle):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(f"build:\n  targets: [onnxruntime]\nruntime: {runtime}\n")
    assert_user_error(trtbuild("build", tiny_serve_engine.parent / "ckpt", tmp_path / "out", "--recipe", recipe,
                               timeout=120), needle)
    assert not (tmp_path / "out").exists()


def test_chat_with_speculation_answers_as_plain_chat(smollm2_engine, smollm2_llm):
    proc = chat(smollm2_engine, f"{Q1}\n{Q2}\n", "--speculative", "ngram")
    assert proc.returncode == 0, proc.stderr
    params = SamplingParams(max_new_tokens=24, temperature=0)
    first = smollm2_llm.chat([{"role": "user", "content": Q1}], params)[0].text
    second = smollm2_llm.chat([{"role": "user", "content": Q1}, {"role": "assistant", "content": first},
                               {"role": "user", "content": Q2}], params)[0].text
    assert proc.stdout == f"{first}\n{second}\n"
    turns = [line for line in proc.stderr.splitlines() if line.startswith("[turn")]
    assert len(turns) == 2 and all(re.search(r"speculative ngram: \d+/\d+ drafts accepted", t) for t in turns)

"""`trtbuild run --speculative` as a real process: the same tokens as plain greedy, the acceptance figures
in --json, and one-line errors (exit 2) for bad flags."""

from __future__ import annotations

import json

import pytest
from test_cli_run import trtbuild_run

from engine_builder import LLM, SamplingParams
from engine_builder.runner.speculative.speculative_config import from_flags
from engine_builder.util.errors import InputError

PROMPT = "w5 w6 w7 w8 w9 w10 w5 w6 w7 w8 w9 w10 w5 w6 w7"


def test_run_speculative_json_has_the_same_tokens_and_acceptance(tiny_engine):
    engine, _ = tiny_engine("llama")
    proc = trtbuild_run(engine, "--prompt", PROMPT, "--max-new-tokens", "30", "--temperature", "0", "--json",
                        "--speculative", "draft", "--draft-engine", engine, "--num-draft-tokens", "4")
    assert proc.returncode == 0, proc.stderr
    want = LLM(engine).generate(PROMPT, SamplingParams(max_new_tokens=30, temperature=0))[0]
    got = json.loads(proc.stdout)
    assert (got["token_ids"], got["text"]) == (list(want.token_ids), want.text)
    stats = got["speculative"]  # the engine drafting for itself: every draft survives
    assert stats["method"] == "draft" and stats["verify_steps"] > 0 and stats["acceptance_rate"] == 1.0
    assert stats["mean_accepted_length"] == 5.0 or stats["verify_steps"] * 5 > stats["accepted_tokens"]


def test_bad_speculative_flags_are_one_line_errors(tiny_engine, tmp_path):
    engine, _ = tiny_engine("llama")
    for flags, message in ((["--speculative", "medusa"], "not one of ngram, draft"),
                           (["--draft-engine", str(engine)], "need --speculative")):
        proc = trtbuild_run(engine, "--prompt", "w1", *flags)
        assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, \
            (flags, proc.stderr)
    for args, message in ((("draft",), "needs --draft-engine"), (("draft", tmp_path), "not an engine dir"),
                          (("ngram", None, 0), "positive integer"), (("ngram", engine), "only used with")):
        with pytest.raises(InputError, match=message):
            from_flags(*args)

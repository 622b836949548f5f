"""`trtbuild run` as a real process: streamed text, --json, and one-line errors for bad input.

The command is run the way cli.py will register it: `user_errors(run)` (one line on stderr, exit 2).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engine_builder import LLM, SamplingParams

RUN = ("import typer; from engine_builder.cli.console import user_errors; from engine_builder.cli.run_cmd import run; "
       "typer.run(user_errors(run))")


def trtbuild_run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RUN, *map(str, args)], input=stdin, capture_output=True,
                          text=True, timeout=300)


def test_json_output_matches_the_library(smollm2_engine, smollm2_llm):
    proc = trtbuild_run(smollm2_engine, "--prompt", "The capital of France is", "--max-new-tokens", "24",
                        "--temperature", "0", "--stop", ".", "--stop", "never", "--json", "--no-chat")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)  # stdout holds exactly one JSON object
    expected = smollm2_llm.generate("The capital of France is",
                                    SamplingParams(max_new_tokens=24, temperature=0, stop=(".", "never")))[0]
    assert result["text"] == expected.text == " Paris"
    assert result["token_ids"] == list(expected.token_ids)
    assert (result["finish_reason"], result["stop_reason"]) == ("stop", ".")
    assert result["backend"] == "onnxruntime" and "TensorRT not usable" in result["backend_reason"]
    assert result["timings"]["prefill_ms"] > 0 and result["timings"]["decode_tok_s"] > 0


def test_a_chat_model_answers_in_its_template_by_default(smollm2_engine, smollm2_llm):
    """`run --prompt` on an instruct model is a user turn (llama.cpp's CLI does the same); --no-chat is raw text."""
    question = "What is the capital of France?"
    proc = trtbuild_run(smollm2_engine, "--prompt", question, "--max-new-tokens", "24", "--temperature", "0", "--json")
    assert proc.returncode == 0, proc.stderr
    params = SamplingParams(max_new_tokens=24, temperature=0)
    expected = smollm2_llm.chat([{"role": "user", "content": question}], params)[0]
    assert json.loads(proc.stdout)["token_ids"] == list(expected.token_ids) and "Paris" in expected.text


def test_streams_text_to_stdout_and_stats_to_stderr(tiny_engine):
    engine, _ = tiny_engine("llama")
    proc = trtbuild_run(engine, "--prompt", "w1 w5 w9", "--max-new-tokens", "6", "--temperature", "0", "--no-chat")
    assert proc.returncode == 0, proc.stderr
    expected = LLM(engine).generate("w1 w5 w9", SamplingParams(max_new_tokens=6, temperature=0))[0]
    assert proc.stdout == expected.text + "\n"
    assert proc.stderr.startswith("[onnxruntime] 6 tokens, finish length")


def test_prompt_from_stdin_and_seeded_sampling(tiny_engine):
    engine, _ = tiny_engine("llama")
    args = (engine, "--max-new-tokens", "8", "--temperature", "1.0", "--top-k", "40", "--seed", "7", "--json",
            "--no-chat")
    first, again = trtbuild_run(*args, stdin="w1 w5 w9\n"), trtbuild_run(*args, stdin="w1 w5 w9\n")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["token_ids"] == json.loads(again.stdout)["token_ids"]
    expected = LLM(engine).generate("w1 w5 w9", SamplingParams(max_new_tokens=8, temperature=1.0, top_k=40,
                                                               seed=7))[0]
    assert json.loads(first.stdout)["token_ids"] == list(expected.token_ids)


@pytest.mark.parametrize("args,message", [
    (["--prompt", ""], "error: the prompt is empty; pass --prompt TEXT"),
    (["--prompt", "w3 " * 40], "error: the prompt has 40 tokens but the engine takes at most 32 (max_input_len); "
                               "shorten the prompt"),
    (["--prompt", "w3", "--max-new-tokens", "200"], "error: prompt 1 tokens + max_new_tokens 200 = 201 exceeds "
                                                    "the engine's max_seq_len 96"),
    (["--prompt", "w3", "--top-p", "2"], "error: top_p must be in (0, 1] (1 = off), got 2.0"),
    (["--prompt", "w3", "--temperature", "-1"], "error: temperature must be in [0, 100] (0 = greedy), got -1.0"),
    (["--prompt", "w3", "--num-beams", "0"], "error: num_beams must be >= 1"),
    (["--prompt", "w3", "--backend", "tensorrt"], "error: cannot use the TensorRT engine"),
    (["--prompt", "w3", "--backend", "cuda"], "error: backend 'cuda' is not one of auto, onnxruntime, tensorrt"),
    ([], "error: the prompt is empty"),  # no --prompt and empty stdin
])
def test_bad_input_is_one_line_and_exit_2(args, message, tiny_engine):
    engine, _ = tiny_engine("llama")
    proc = trtbuild_run(engine, *args, stdin="")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(message) and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stdout == ""


def test_missing_or_wrong_engine_dir(tiny_engine, tmp_path):
    engine, _ = tiny_engine("llama")
    for path, message in ((tmp_path / "nope", "does not exist; build one with `trtbuild build"),
                          (engine.parent / "ckpt", "is not a trtbuild engine dir")):
        proc = trtbuild_run(path, "--prompt", "w3")
        assert proc.returncode == 2 and message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr

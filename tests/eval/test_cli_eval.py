"""`trtbuild eval` as a real process: --json figures equal the library's, and bad input gets one line, exit 2."""

from __future__ import annotations

import json

import pytest
from cli_process import error_lines, trtbuild
from word_texts import word_ids, write_words

from engine_builder.eval import evaluate


def test_json_gives_the_library_figures(tiny, tmp_path):
    t = tiny("llama")
    ids = word_ids(200)
    text = write_words(tmp_path / "words.jsonl", ids, jsonl=True)
    proc = trtbuild("eval", t.engine, "--reference", t.ckpt, "--text", text, "--max-tokens", 200, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)  # stdout holds exactly one JSON object: the bar went to stderr
    # the same words as plain text, scored by the library against the engine-dir form of the reference
    expected = evaluate(t.engine, reference=t.engine, text=write_words(tmp_path / "words.txt", ids), max_tokens=200)
    assert out["ppl"] == pytest.approx(expected.ppl, rel=1e-9)
    assert out["kl"] == pytest.approx(0, abs=1e-9) and out["top1_agreement"] == 1.0
    assert out["reference"] == {"path": str(t.ckpt), "ppl": pytest.approx(expected.reference_ppl, rel=1e-9)}
    assert (out["tokens"], out["windows"], out["context"]) == (197, 3, 96)  # windows of 96, 96 and 8 tokens
    assert out["backend"] == "onnxruntime" and out["seconds"] > 0 and out["text"] == str(text)


def test_table_names_the_figures_and_the_context(tiny, tmp_path):
    t = tiny("llama")
    proc = trtbuild("eval", t.engine, "--text", write_words(tmp_path / "w.txt", word_ids(40)), "--max-tokens", 40,
                    "--context", 20)
    assert proc.returncode == 0, proc.stderr
    assert "perplexity" in proc.stdout and "38 positions in 2 windows of up to 20 tokens" in proc.stdout
    assert "KL" not in proc.stdout  # no reference, no comparison


def test_help_teaches():
    proc = trtbuild("eval", "--help")
    assert proc.returncode == 0
    for needle in ("--reference", "--text", "--max-tokens", "--context", "--backend", "--json", "KL", "Example:"):
        assert needle in proc.stdout


@pytest.mark.parametrize("case,message", [
    ("missing_engine", "does not exist; build one with `trtbuild build"),
    ("checkpoint_as_engine", "is not a trtbuild engine dir (config.json schema is not 'trtbuild.engine'"),
    ("missing_text", "does not exist; pass a .txt or .jsonl file to --text"),
    ("empty_text", "is empty; pass a file with at least a few hundred words"),
    ("other_vocab", "has another vocabulary (320 logits, 300 tokens) than"),
    ("hf_dir_reference", "is neither a trtbuild checkpoint nor an engine dir"),
    ("one_token", "--max-tokens must be at least 2"),
    ("context_too_long", "--context 500 exceeds"),
    ("tensorrt_here", "cannot use the TensorRT engine in"),
])
def test_bad_input_is_one_line_and_exit_2(tiny, tmp_path, case, message):
    t = tiny("llama")
    text = write_words(tmp_path / "w.txt", word_ids(50))
    (tmp_path / "empty.txt").write_text("  \n")
    args = {
        "missing_engine": [tmp_path / "nope"],
        "checkpoint_as_engine": [t.ckpt],
        "missing_text": [t.engine, "--text", tmp_path / "nope.txt"],
        "empty_text": [t.engine, "--text", tmp_path / "empty.txt"],
        "other_vocab": [t.engine, "--reference", tiny("llama", words=300).engine, "--text", text],
        "hf_dir_reference": [t.engine, "--reference", t.hf, "--text", text],
        "one_token": [t.engine, "--max-tokens", 1],
        "context_too_long": [t.engine, "--context", 500, "--text", text],
        "tensorrt_here": [t.engine, "--backend", "tensorrt", "--text", text],
    }[case]
    proc = trtbuild("eval", *args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], proc.stderr

"""`trtbuild run --json-schema FILE`: a real process whose answer validates; bad files are one-line errors."""

from __future__ import annotations

import json

import jsonschema
from cli_process import assert_user_error, error_lines, trtbuild
from schemas import ORDER, UNSUPPORTED


def test_run_json_schema_file(smollm2_engine, tmp_path):
    schema = tmp_path / "order.json"
    schema.write_text(json.dumps(ORDER))
    proc = trtbuild("run", smollm2_engine, "--chat", "--prompt", "Order some fruit. Answer in JSON.",
                    "--json-schema", schema, "--max-new-tokens", "64", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["finish_reason"] == "stop"
    jsonschema.validate(json.loads(out["text"]), ORDER)


def test_run_json_schema_errors(smollm2_engine, tmp_path):
    assert_user_error(trtbuild("run", smollm2_engine, "-p", "x", "--json-schema", tmp_path / "missing.json"),
                      "--json-schema", "cannot read")
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    assert_user_error(trtbuild("run", smollm2_engine, "-p", "x", "--json-schema", bad), "not valid JSON")
    bad.write_text(json.dumps(UNSUPPORTED["not"]))
    assert_user_error(trtbuild("run", smollm2_engine, "-p", "x", "--json-schema", bad), "cannot enforce", "\"not\"")


# llguidance gives up right after the answer's `{`, whatever the model picks (`{}` is not valid: each branch wants a
# key; their parser row is 4,767 items, its limit 2,000); within the grammar limits (200 branches, 8 KB)
GIVES_UP_AT_ONCE = {"anyOf": [{"type": "object", "minProperties": 1, "maxProperties": i + 1} for i in range(200)]}


def test_run_exits_2_naming_why_when_the_grammar_engine_gives_up(tiny_bpe_engine, tmp_path):
    """An answer llguidance gave up on mid-way (finish_reason "error") is not a success: run prints what it got,
    the reason as one line on stderr, and exits 2 (it exited 0), with --json and streaming alike."""
    schema = tmp_path / "gives_up.json"
    schema.write_text(json.dumps(GIVES_UP_AT_ONCE))
    args = ("run", tiny_bpe_engine, "--prompt", "Answer in JSON.", "--json-schema", schema, "--max-new-tokens", "16",
            "--temperature", "0")
    proc = trtbuild(*args, "--json")
    assert_user_error(proc, "gave up on this json_schema mid-answer", "Current row has", "simplify the constraint")
    out = json.loads(proc.stdout)
    assert out["finish_reason"] == "error" and "gave up on this json_schema" in out["stop_reason"]
    assert out["text"].startswith("{")
    streamed = trtbuild(*args)
    assert streamed.returncode == 2, streamed.stderr
    *_, summary, why = error_lines(streamed.stderr)
    assert "finish error" in summary and why == error_lines(proc.stderr)[0]  # the same one line
    assert streamed.stdout == out["text"] + "\n" and "Traceback" not in streamed.stderr

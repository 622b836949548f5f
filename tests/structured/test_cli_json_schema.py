"""`trtbuild run --json-schema FILE`: a real process whose answer validates; bad files are one-line errors."""

from __future__ import annotations

import json

import jsonschema
from cli_process import assert_user_error, trtbuild
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

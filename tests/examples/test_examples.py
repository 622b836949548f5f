"""Every script in examples/ run as a user runs it (a real `python examples/NAME.py ...` process) against the
session's engines, with assertions on what it prints: SmolLM2 where the answer's content is the point, tiny
random engines where the grammar or the plumbing is."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from runner_engines import add_word_tokenizer

from engine_builder import LLM, SamplingParams

ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "examples"


def run_example(name: str, *args: object, expect: int = 0, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(EXAMPLES / name), *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == expect, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_every_example_has_a_test_a_docstring_and_stays_short():
    tested = set(re.findall(r'run_example\("([a-z_]+\.py)"', Path(__file__).read_text()))
    scripts = {p.name for p in EXAMPLES.glob("*.py")}
    assert scripts == tested
    readme = (EXAMPLES / "README.md").read_text()
    for name in scripts:
        text = (EXAMPLES / name).read_text()
        assert text.startswith('"""') and ".venv/bin/python examples/" in text.split('"""')[1], name
        assert len(text.splitlines()) <= 80, name
        assert f"[{name}]({name})" in readme, name


def test_python_api_prints_text_and_finish_reasons(smollm2_engine):
    out = run_example("python_api.py", smollm2_engine).stdout
    assert out.count("finish_reason=") == 4
    assert set(re.findall(r"finish_reason=(\w+)", out)) <= {"stop", "length"}
    assert "finish_reason=stop stop_reason='10'" in out  # "1, 2, 3, 4," counts on until the stop string
    assert re.search(r"^chat -> '.*Paris.*'$", out, re.M), out


def test_streaming_prints_each_delta_as_generate_would(tiny_serve_engine):
    prompt = "w5 w17 w42"
    proc = run_example("streaming.py", tiny_serve_engine, "--no-chat", "--prompt", prompt, "--max-new-tokens", 24)
    with LLM(tiny_serve_engine) as llm:
        whole = llm.generate(prompt, SamplingParams(max_new_tokens=24, temperature=0))[0]
    assert proc.stdout == whole.text + "\n"
    deltas, tokens = map(int, re.search(r"\[(\d+) deltas, (\d+) tokens", proc.stderr).groups())
    assert tokens == len(whole.token_ids) and deltas > 1  # one delta per word here


def test_openai_client_starts_a_server_and_streams(smollm2_engine):
    lines = run_example("openai_client.py", smollm2_engine, "--max-tokens", 32).stdout.splitlines()
    model, answer = lines[0].split(": ", 1)
    assert model == smollm2_engine.name and "Paris" in answer
    assert re.fullmatch(r"\[finish_reason=stop, \d+ prompt \+ \d+ completion tokens\]", lines[1])
    assert lines[2] == f"streamed: {answer}"  # greedy: the stream spells the same answer


def test_structured_output_validates_against_the_schema(smollm2_engine, tmp_path):
    schema = {"type": "object", "required": ["name", "age", "likes_cats"], "additionalProperties": False,
              "properties": {"name": {"type": "string", "maxLength": 20},
                             "age": {"type": "integer", "minimum": 0, "maximum": 120},
                             "likes_cats": {"type": "boolean"}}}
    (tmp_path / "person.json").write_text(json.dumps(schema))
    proc = run_example("structured_output.py", smollm2_engine, "--schema", tmp_path / "person.json",
                       "--prompt", "Invent a person and describe them as JSON.")
    jsonschema.validate(json.loads(proc.stdout), schema)
    assert "valid against the schema" in proc.stderr


@pytest.fixture(scope="module")
def tiny_smol_vocab_server(tiny_smol_vocab_engine):
    """The examples' own `served()` (openai_client.py) around the tiny engine: tools.py gets its --base-url."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        from openai_client import served
    finally:
        sys.path.remove(str(EXAMPLES))
    with served(tiny_smol_vocab_engine) as client:
        yield str(client.base_url).removesuffix("/v1/")


def test_tools_calls_a_function_and_answers_with_its_result(tiny_smol_vocab_server):
    out = run_example("tools.py", "--base-url", tiny_smol_vocab_server).stdout
    assert "finish_reason=tool_calls" in out  # tool_choice required: grammar-constrained, whatever the weights
    arguments = json.loads(re.search(r"^tool call: get_weather\((.*)\)$", out, re.M).group(1))
    jsonschema.validate(arguments, {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                                    "required": ["city"], "additionalProperties": False})
    assert "\nanswer: " in out


def test_embeddings_rank_the_related_sentences_first(minilm_engine):
    lines = run_example("embeddings.py", minilm_engine).stdout.splitlines()
    assert lines[0] == "6 vectors of 384 dims, norms 1.0000..1.0000"
    ranked = [(float(line.split("  ", 1)[0]), line.split("  ", 1)[1]) for line in lines[2:]]
    assert [text for _, text in ranked[:2]] == ["A man is eating a piece of bread.", "Someone is having a meal."]
    assert ranked[0][0] > 0.7 and ranked[-1][0] < 0.1  # sentence-transformers: 0.7553 ... -0.0461


def tiny_source(tiny_model_dir, tmp_path: Path) -> Path:
    hf = tmp_path / "hf"
    shutil.copytree(tiny_model_dir("llama"), hf)
    add_word_tokenizer(hf, 320)
    return hf


def test_ci_engine_build_measures_and_passes_its_gate(tiny_model_dir, tmp_path):
    (tmp_path / "tiny.yaml").write_text("model: tiny-llama\nbuild:\n  targets: all\n  dtype: float32\n"
                                        "  limits: {max_batch: 2, max_input_len: 32, max_seq_len: 96}\n")
    # words of the tiny vocabulary (the shipped text would be all unknown words to it)
    (tmp_path / "eval.txt").write_text(" ".join(f"w{(i * 37) % 317 + 3}" for i in range(400)))
    proc = run_example("ci_engine_build.py", tiny_source(tiny_model_dir, tmp_path), tmp_path / "ci",
                       "--recipe", tmp_path / "tiny.yaml", "--quant", "int8_wo", "--max-kl", 0.01, "--min-top1", 0.8,
                       "--eval-text", tmp_path / "eval.txt", "--eval-tokens", 256)
    summary = json.loads(proc.stdout)
    assert summary["ok"] is True and list(summary["steps"]) == ["convert", "quantize", "build", "verify", "eval"]
    assert all(step["rc"] == 0 for step in summary["steps"].values())
    gate = summary["gate"]
    assert 0 < gate["kl"] <= 0.01 and gate["top1_agreement"] >= 0.8  # int8 drift measured against float32
    build = json.loads((tmp_path / "ci" / "build.json").read_text())
    assert build["targets"] == ["onnxruntime", "tensorrt"] and (tmp_path / "ci" / "engine" / "rank0.engine").is_file()
    assert json.loads((tmp_path / "ci" / "verify.json").read_text())["ok"] is True
    assert json.loads((tmp_path / "ci" / "quantize.json").read_text())["quantization"] == "int8_wo"


def test_ci_engine_build_fails_with_the_refusing_step(tiny_model_dir, tmp_path):
    (tmp_path / "bad.yaml").write_text("build:\n  dtype: float32\n  max_seq_len: 96\n")  # not under limits:
    proc = run_example("ci_engine_build.py", tiny_source(tiny_model_dir, tmp_path), tmp_path / "ci",
                       "--recipe", tmp_path / "bad.yaml", expect=2)
    summary = json.loads(proc.stdout)
    assert summary["ok"] is False and summary["steps"]["build"]["rc"] == 2 and "eval" not in summary["steps"]
    assert "max_seq_len" in proc.stderr and not (tmp_path / "ci" / "engine").exists()

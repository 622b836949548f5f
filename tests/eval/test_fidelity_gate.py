"""Recipe fidelity gates through `trtbuild build --recipe`: a pass records the figures in the manifest and
--json, a miss exits 2 naming figure, bound and recipe and leaves no engine dir; bad gates fail before building."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cli_process import error_lines
from test_cli_eval import trtbuild
from word_texts import word_ids, write_words

from engine_builder.formats.build_config import Fidelity, load_recipe
from engine_builder.util.errors import ConfigError


def write_recipe(path: Path, ckpt: Path, **fidelity) -> Path:
    """A tiny fp16 onnxruntime recipe whose gate compares against CKPT on words.txt beside the recipe."""
    write_words(path.parent / "words.txt", word_ids(200))
    gate = {"reference": os.path.relpath(ckpt, path.parent), "text": "words.txt", "max_tokens": 200, **fidelity}
    path.write_text(json.dumps({  # JSON is YAML
        "model": "tiny llama",
        "build": {"targets": ["onnxruntime"], "dtype": "float16",
                  "limits": {"max_batch": 4, "max_input_len": 8, "max_seq_len": 96}},
        "fidelity": gate}))
    return path


def test_passing_gate_records_the_figures(tiny, tmp_path):
    t = tiny("llama")
    recipe = write_recipe(tmp_path / "gated.yaml", t.ckpt, max_ppl_ratio=1.01, max_kl=0.01, min_top1_agreement=0.9)
    proc = trtbuild("build", t.ckpt, tmp_path / "engine", "--recipe", recipe, "--json")
    assert proc.returncode == 0, proc.stderr
    fidelity = json.loads(proc.stdout)["fidelity"]
    manifest = json.loads((tmp_path / "engine" / "config.json").read_text())
    assert manifest["fidelity"] == fidelity
    assert fidelity["bounds"] == {"max_ppl_ratio": 1.01, "max_kl": 0.01, "min_top1_agreement": 0.9}
    assert fidelity["recipe"] == str(recipe) and fidelity["reference"]["path"] == str(tmp_path / os.path.relpath(
        t.ckpt, tmp_path))
    assert 0 < fidelity["kl"] <= 0.01 and fidelity["top1_agreement"] >= 0.9  # fp16 against the fp32 checkpoint
    assert fidelity["ppl_ratio"] == pytest.approx(fidelity["ppl"] / fidelity["reference"]["ppl"])
    assert (fidelity["tokens"], fidelity["context"]) == (197, 96)


def test_failing_gate_exits_2_and_writes_nothing(tiny, tmp_path):
    t = tiny("llama")
    recipe = write_recipe(tmp_path / "strict.yaml", t.ckpt, max_ppl=100)  # a random model scores ~vocab size
    proc = trtbuild("build", t.ckpt, tmp_path / "engine", "--recipe", recipe)
    assert proc.returncode == 2
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: fidelity gate failed: ppl "), proc.stderr
    assert lines[0].endswith(f" > 100 (max_ppl in {recipe}); no engine dir was written")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["strict.yaml", "words.txt"]  # no engine, no temp dir


@pytest.mark.parametrize("fidelity,message", [
    ({"max_perplexity": 10}, "unknown key(s) max_perplexity; valid keys: reference, text, max_tokens"),
    ({"reference": None, "max_kl": 0.1}, "fidelity.max_kl compares against a reference: set fidelity.reference"),
    ({"reference": "no-such-ckpt"}, "does not exist; convert or build it first"),
    ({"min_top1_agreement": 99}, "fidelity.min_top1_agreement is a fraction in [0, 1], got 99"),
])
def test_bad_gate_fails_before_building(tiny, tmp_path, fidelity, message):
    t = tiny("llama")
    proc = trtbuild("build", t.ckpt, tmp_path / "engine", "--recipe", write_recipe(tmp_path / "r.yaml", t.ckpt,
                                                                                   **fidelity))
    assert proc.returncode == 2 and message in proc.stderr and len(error_lines(proc.stderr)) == 1, proc.stderr
    assert not (tmp_path / "engine").exists()


def test_gate_block_loads_from_yaml(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("build: {dtype: float32}\nfidelity:\n  reference: ../ckpt\n  min_top1_agreement: 0.99\n")
    assert load_recipe(recipe).fidelity == Fidelity(reference="../ckpt", min_top1_agreement=0.99)
    with pytest.raises(ConfigError, match="fidelity.max_tokens must be an integer >= 2"):
        Fidelity(max_tokens=1)
    with pytest.raises(ConfigError, match="fidelity.reference must be a path"):
        Fidelity(reference=5)  # type: ignore[arg-type]

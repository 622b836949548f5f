"""Issue 15: hostile or broken input on the command line and in files. Each attack runs through the real
CLI where it is a CLI matter: exit 2, one `error:` line, no traceback, nothing deleted or half-written."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from cli_process import assert_user_error, trtbuild
from runner_engines import add_word_tokenizer, build_engine

from converters.convert import convert
from engine_builder.formats.build_config import BuildConfig, Limits, apply_overrides, load_recipe, parse_set
from engine_builder.formats.checkpoint import CheckpointConfig
from engine_builder.formats.dataclass_io import from_dict
from engine_builder.formats.memory_plan import MEMORY_ENV, check_engine_memory, plan_engine
from engine_builder.formats.model_config import ModelConfig
from engine_builder.util.atomic_dir import atomic_output_dir, remove_stale_temp_dirs
from engine_builder.util.errors import ConfigError, InputError


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def tiny(tiny_model_dir, module_tmp_factory):
    """(HF dir, checkpoint dir, engine dir) of the tiny llama with a word tokenizer, made once through the library."""
    root = module_tmp_factory.mktemp("hardening")
    hf, ckpt = root / "hf", root / "ckpt"
    shutil.copytree(tiny_model_dir("llama"), hf)
    add_word_tokenizer(hf, 320)
    convert(hf, ckpt, dtype="float32")
    engine = build_engine(ckpt, root / "engine", Limits(max_batch=2, max_input_len=8, max_seq_len=32))
    return hf, ckpt, engine


@pytest.fixture(scope="module")
def checkpoint(tiny) -> CheckpointConfig:
    return CheckpointConfig.load(tiny[1])


@pytest.fixture
def hf_copy(tiny_model_dir, tmp_path) -> Path:
    dst = tmp_path / "src" / "hf"
    shutil.copytree(tiny_model_dir("llama"), dst)
    return dst


# --- 1. --force never deletes an input -------------------------------------------------------------------


@pytest.mark.parametrize("where,relation", [("same", "is input"), ("parent", "contains input"),
                                            ("inside", "is inside input")])
def test_convert_force_refuses_out_that_overlaps_the_source(hf_copy, where, relation):
    out = {"same": hf_copy, "parent": hf_copy.parent, "inside": hf_copy / "ckpt"}[where]
    before = snapshot(hf_copy.parent)
    assert_user_error(trtbuild("convert", hf_copy, out, "--force"), relation, "outside the inputs")
    assert snapshot(hf_copy.parent) == before and not (hf_copy / "ckpt").exists()


def test_build_force_refuses_out_that_overlaps_any_input(tiny, tmp_path):
    _, ckpt, _ = tiny
    own = tmp_path / "ckpt"
    shutil.copytree(ckpt, own)
    other = tmp_path / "ckpt2"
    shutil.copytree(ckpt, other)
    # the recipe, and the fidelity gate's reference and text it names, are inputs too
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "words.txt").write_text("w1 w2 w3 " * 100)
    recipe = recipes / "r.yaml"
    recipe.write_text(json.dumps({"build": {"targets": ["onnxruntime"]},
                                  "fidelity": {"reference": os.path.relpath(own, recipes), "text": "words.txt"}}))
    before = snapshot(tmp_path)
    assert_user_error(trtbuild("build", own, own, "--force"), "is input")
    assert_user_error(trtbuild("build", own, tmp_path, "--force"), "contains input")
    assert_user_error(trtbuild("build", own, recipes, "--force", "--recipe", recipe), "contains input", "r.yaml")
    assert_user_error(trtbuild("build", other, own, "--force", "--recipe", recipe), "is input", "../ckpt")
    assert snapshot(tmp_path) == before


def test_build_onnx_force_refuses_the_dir_holding_the_graph(tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"not read: the output check comes first")
    before = snapshot(tmp_path)
    assert_user_error(trtbuild("build", "--onnx", tmp_path / "model.onnx", tmp_path, "--force"), "contains input")
    assert snapshot(tmp_path) == before


def test_force_replaces_only_a_previous_output(tiny, tmp_path):
    hf, ckpt, _ = tiny
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("mine")
    assert_user_error(trtbuild("convert", hf, mine, "--force"), "not a previous output", "trtbuild.checkpoint")
    assert_user_error(trtbuild("build", ckpt, mine, "--force", "--target", "onnxruntime"), "trtbuild.engine")
    assert (mine / "keep.txt").read_text() == "mine"
    # a checkpoint dir is not what `build` writes either
    shutil.copytree(ckpt, tmp_path / "old-ckpt")
    assert_user_error(trtbuild("build", ckpt, tmp_path / "old-ckpt", "--force"), "not a previous output")
    # a previous checkpoint is replaced
    assert trtbuild("convert", hf, tmp_path / "old-ckpt", "--force").returncode == 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".old-ckpt.")]


# --- 2. recipes: alias bombs, wrong types, paths in messages -----------------------------------------------

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8)) + "model: *i\n"


@pytest.mark.parametrize("text,needles", [
    (BOMB, ["more than 32 aliases"]),
    ("build:\n  limits: " + "[" * 200 + "]" * 200 + "\n", ["nested deeper than 32"]),
    ("build: &a {limits: *a}\n", ["a recursive alias (*a)"]),
    ("build:\n  limits:\n    max_seq_len: '4096'\n", ["build.limits.max_seq_len: expected int, got str"]),
    ("build:\n  limits:\n    max_batch: true\n", ["build.limits.max_batch: expected int, got bool"]),
    ("build:\n  opt_level: 2.5\n", ["build.opt_level: expected int, got float"]),
    ("build:\n  targets: [onnxruntime, 5]\n", ["build.targets[1]: expected str, got int"]),
    ("build:\n  passes: {tensorrt: fold_constants}\n", ["build.passes.tensorrt: expected a list, got str"]),
    ("build: [1, 2]\n", ["build: expected a mapping, got a list"]),
    ("fidelity: {max_kl: .nan, reference: x}\n", ["fidelity.max_kl must be a non-negative number"]),
    ("fidelity: {max_tokens: 2.0e+9}\n", ["fidelity.max_tokens: expected int, got float"]),
    ("1: 2\n", ["key 1 is not a string"]),
    ("build: {limits: {max_seq_len: !!python/object:os.system [ls]}}\n", ["not valid YAML"]),
    ("[unclosed\n", ["not valid YAML"]),
])
def test_bad_recipe_is_one_line_naming_the_key(tmp_path, text, needles):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    assert_user_error(trtbuild("build", tmp_path / "no-ckpt", tmp_path / "out", "--recipe", recipe), *needles)
    assert not (tmp_path / "out").exists()


def test_non_utf8_recipe(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_bytes(b"model: caf\xe9\n")
    assert_user_error(trtbuild("build", tmp_path / "no-ckpt", tmp_path / "out", "--recipe", recipe),
                      "not UTF-8", "0xe9", "save it as UTF-8")


@pytest.mark.parametrize("setting,needles", [
    ("opt_level=abc", ["build config: opt_level: expected int, got str"]),
    ("targets=5", ["targets: expected a list, got int"]),
    ("limits=5", ["limits: expected a mapping, got int"]),
    ("limits.max_seq_len=.nan", ["limits.max_seq_len: expected int, got float"]),
    ("dtype=[1", ["--set dtype is not valid YAML"]),
    ("passes.tensorrt=&a [*a]", ["--set passes.tensorrt has a recursive alias"]),
    ("limits=&a {max_batch: *a}", ["--set limits has a recursive alias"]),
    ("weights=*x", ["--set weights is not valid YAML"]),
])
def test_bad_set_value_is_one_line(tmp_path, setting, needles):
    assert_user_error(trtbuild("build", tmp_path / "no-ckpt", tmp_path / "out", "--set", setting), *needles)


def test_from_dict_checks_every_type_with_its_path(checkpoint):
    with pytest.raises(ConfigError, match=r"^ModelConfig: missing key\(s\) architecture"):
        from_dict(ModelConfig, {})
    good = apply_overrides(BuildConfig(), parse_set(["limits.max_seq_len=4096", "targets=[onnxruntime]"]))
    assert good.limits.max_seq_len == 4096 and good.targets == ("onnxruntime",)
    with pytest.raises(ConfigError, match=r"compute_capabilities\[0\]: expected str, got int"):
        apply_overrides(BuildConfig(), {"compute_capabilities": [80]})
    data = json.loads(checkpoint.to_json())
    data["model"]["block"]["norm"]["kind"] = "group_norm"
    with pytest.raises(ConfigError, match=r"model.block.norm.kind: expected one of 'rms_norm', 'layer_norm', "
                                          r"got 'group_norm'"):
        from_dict(CheckpointConfig, data)
    data = json.loads(checkpoint.to_json())
    data["model"]["rope"]["scaling"]["short_factor"] = [1, "x"]
    with pytest.raises(ConfigError, match=r"model.rope.scaling.short_factor\[1\]: expected float, got str"):
        from_dict(CheckpointConfig, data)
    data["model"]["rope"]["scaling"]["short_factor"] = [1, 2]  # ints are taken for floats
    assert from_dict(CheckpointConfig, data).model.rope.scaling.short_factor == (1.0, 2.0)


def test_shipped_recipes_still_load():
    for path in sorted((Path(__file__).parents[2] / "recipes").glob("*.yaml")):
        load_recipe(path).build.validate()


# --- 3. sizes: planned before anything is allocated ----------------------------------------------------------


@pytest.mark.parametrize("args,needles", [
    (["--set", "limits.max_seq_len=1000000000"], ["max_seq_len 1000000000 is above 16777216"]),
    (["--max-seq-len", "16000000", "--max-input-len", "16000000", "--max-batch", "64"],
     ["needs about", "GB", "KV cache", "bytes/token x max_batch 64 x max_seq_len 16000000", MEMORY_ENV]),
])
def test_absurd_limits_are_refused_before_building(tiny, tmp_path, args, needles):
    proc = trtbuild("build", tiny[1], tmp_path / "out", *args, timeout=120)
    assert_user_error(proc, *needles)
    assert not list(tmp_path.iterdir())


def test_absurd_vocab_in_a_checkpoint_is_refused(tiny, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny[1], ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    config["model"]["vocab_size"] = 10 ** 12
    (ckpt / "config.json").write_text(json.dumps(config))
    assert_user_error(trtbuild("build", ckpt, tmp_path / "out"), "vocab_size 1000000000000 is above")


def test_absurd_vocab_in_an_hf_config_is_refused_by_convert(hf_copy, tmp_path):
    config = json.loads((hf_copy / "config.json").read_text())
    (hf_copy / "config.json").write_text(json.dumps({**config, "vocab_size": 10 ** 12}))
    assert_user_error(trtbuild("convert", hf_copy, tmp_path / "out"), "vocab_size 1000000000000 is above")


@pytest.mark.parametrize("seq_len,needles", [
    ("1000000000", ["--calib-seq-len 1000000000 is above"]),
    ("16000000", ["calibrating", "on windows of 16000000 tokens needs about"]),
])
def test_absurd_calibration_window_is_refused_before_converting(tiny, tmp_path, seq_len, needles):
    proc = trtbuild("convert", tiny[0], tmp_path / "out", "--quant", "int4_awq", "--group-size", "32",
                    "--calib-seq-len", seq_len)
    assert_user_error(proc, *needles)
    assert not list(tmp_path.iterdir())


def test_runtime_refuses_an_engine_too_large_for_this_machine(tiny, tmp_path):
    engine = tmp_path / "engine"
    shutil.copytree(tiny[2], engine)
    manifest = json.loads((engine / "config.json").read_text())
    manifest["build"]["limits"] = {"max_batch": 65536, "max_input_len": 8, "max_seq_len": 16_000_000}
    (engine / "config.json").write_text(json.dumps(manifest))
    assert_user_error(trtbuild("run", engine, "--prompt", "w1"), f"engine dir {engine} needs about", "KV cache")


def test_memory_plan_figures(tiny, checkpoint, monkeypatch):
    model = checkpoint.model
    limits = Limits(max_batch=2, max_input_len=8, max_seq_len=32)
    plan = plan_engine(model, limits, "float32")
    # the KV cache figure is exactly the layout's; weights match the checkpoint's float32 tensors
    assert plan.kv_cache == 2 * model.num_layers * model.num_kv_heads * model.head_dim * 4 * 2 * 32
    assert plan.weights == (tiny[1] / "rank0.safetensors").stat().st_size - _header_bytes(tiny[1])
    monkeypatch.setenv(MEMORY_ENV, "0.000001")
    with pytest.raises(ConfigError, match=f"more than {MEMORY_ENV}=0.000001"):
        check_engine_memory(model, limits, "float32")
    monkeypatch.setenv(MEMORY_ENV, "lots")
    with pytest.raises(ConfigError, match="not a positive number"):
        check_engine_memory(model, limits, "float32")


def _header_bytes(ckpt: Path) -> int:
    data = (ckpt / "rank0.safetensors").read_bytes()
    return 8 + int.from_bytes(data[:8], "little")


# --- 4 / 5. bad floats and wrong types in a model config ----------------------------------------------------


@pytest.mark.parametrize("hf,needles", [
    ({"rope_theta": float("nan")}, ["rope.theta must be a positive finite number", "nan"]),
    ({"rope_theta": -1.0}, ["rope.theta"]),
    ({"rms_norm_eps": 0.0}, ["block.norm.eps"]),
    ({"rms_norm_eps": float("inf")}, ["block.norm.eps"]),
    ({"rms_norm_eps": "tiny"}, ["config.json cannot describe a llama model", "'tiny'"]),
    ({"rope_parameters": "x"}, ["config.json cannot describe a llama model"]),
])
def test_bad_float_in_an_hf_config_is_refused_by_convert(hf_copy, tmp_path, hf, needles):
    config = json.loads((hf_copy / "config.json").read_text())
    for key, value in hf.items():  # transformers 5 keeps rope_theta in rope_parameters
        home = config["rope_parameters"] if key == "rope_theta" and "rope_parameters" in config else config
        home[key] = value
    (hf_copy / "config.json").write_text(json.dumps(config))
    assert_user_error(trtbuild("convert", hf_copy, tmp_path / "out"), *needles)
    assert not (tmp_path / "out").exists()


def test_validate_names_each_bad_field(checkpoint):
    model = checkpoint.model
    bad = {
        "rope.theta": replace(model, rope=replace(model.rope, theta=math.nan)),
        "rope.local_theta": replace(model, rope=replace(model.rope, local_theta=0.0)),
        "rope.scaling.factor": replace(model, rope=replace(model.rope, scaling=replace(model.rope.scaling,
                                                                                       factor=-2.0))),
        "rope.scaling.long_factor[1]": replace(model, rope=replace(model.rope, scaling=replace(
            model.rope.scaling, long_factor=(1.0, math.inf)))),
        "block.norm.eps": replace(model, block=replace(model.block, norm=replace(model.block.norm, eps=-1e-6))),
        "block.attention.scale": replace(model, block=replace(model.block, attention=replace(
            model.block.attention, scale=math.nan))),
        "embedding_multiplier": replace(model, embedding_multiplier=0.0),
        "final_logit_softcap": replace(model, final_logit_softcap=math.inf),
        "hidden_size: expected int, got str": replace(model, hidden_size="64"),
        "num_layers 100000 is above": replace(model, num_layers=100_000),
    }
    for name, config in bad.items():
        with pytest.raises(ConfigError, match=f"^model config: {name}".replace("[", r"\[").replace("]", r"\]")):
            config.validate()
    model.validate()


def test_wrong_type_in_a_checkpoint_config_is_one_line(tiny, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny[1], ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    config["model"]["hidden_size"] = "64"
    (ckpt / "config.json").write_text(json.dumps(config))
    assert_user_error(trtbuild("build", ckpt, tmp_path / "out"), "model.hidden_size: expected int, got str")


# --- 6. temp dirs of killed runs ---------------------------------------------------------------------------------


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_temp_dirs_of_dead_runs_are_removed_and_live_ones_kept(tiny, tmp_path):
    hf = tiny[0]
    out = tmp_path / "ckpt"
    dead, live, legacy, other = (tmp_path / f".ckpt.tmp-{dead_pid()}-x1", tmp_path / f".ckpt.tmp-{os.getpid()}-x2",
                                 tmp_path / ".ckpt.tmp-abc123", tmp_path / f".other.tmp-{dead_pid()}-x3")
    old = tmp_path / f".ckpt.old-{dead_pid()}-x4"
    for d in (dead, live, legacy, other, old):
        d.mkdir()
        (d / "rank0.safetensors").write_bytes(b"half")
    proc = trtbuild("convert", hf, out)
    assert proc.returncode == 0, proc.stderr
    assert not dead.exists() and not old.exists()
    assert live.exists() and legacy.exists() and other.exists()  # a live run's, an unknown owner's, another OUT's
    assert remove_stale_temp_dirs(out) == []


def test_temp_dir_carries_the_pid_and_goes_on_failure(tmp_path):
    with pytest.raises(RuntimeError), atomic_output_dir(tmp_path / "out") as tmp:
        assert tmp.name.startswith(f".out.tmp-{os.getpid()}-")
        raise RuntimeError
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(InputError, match="is inside input"), atomic_output_dir(tmp_path / "a" / "b", inputs=[tmp_path]):
        pass


# --- 7. text that is not UTF-8 ---------------------------------------------------------------------------------------


def run_bytes(*args: bytes | str | Path, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "engine_builder.cli", *map(os.fsencode, args)], input=stdin,
                          capture_output=True, timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(errors="replace"),
                                       proc.stderr.decode(errors="replace"))


def test_non_utf8_prompt_on_the_command_line_and_stdin(tiny):
    engine = tiny[2]
    assert_user_error(run_bytes("run", engine, "--prompt", b"caf\xe9"), "--prompt is not UTF-8", "0xe9")
    assert_user_error(run_bytes("run", engine, stdin=b"caf\xe9 au lait\n"), "stdin is not UTF-8", "0xe9", "iconv")


def test_non_utf8_text_files(tiny, tmp_path):
    hf, _, engine = tiny
    latin1 = tmp_path / "calib.txt"
    latin1.write_bytes(b"word " * 50 + b"caf\xe9\n")
    assert_user_error(trtbuild("convert", hf, tmp_path / "out", "--quant", "int4_awq", "--group-size", "32",
                               "--calib", latin1), f"calibration text {latin1} is not UTF-8", "0xe9", "iconv",
                      "--calib")
    assert not (tmp_path / "out").exists()
    assert_user_error(trtbuild("eval", engine, "--text", latin1), f"eval text {latin1} is not UTF-8", "--text")
    surrogate = tmp_path / "t.jsonl"
    surrogate.write_text('{"text": "w1 w2"}\n{"text": "w3 \\udc80"}\n')
    assert_user_error(trtbuild("eval", engine, "--text", surrogate), "line 2", "surrogate")


def test_missing_parents_are_made_and_a_file_parent_is_refused(tmp_path):
    """`convert SRC build/ckpt` on a fresh clone: the missing build/ is made (mkdir -p), when the output is written;
    a path under a file is a one-line error before any work."""
    out = tmp_path / "build" / "deeper" / "ckpt"
    with atomic_output_dir(out) as tmp:
        (tmp / "config.json").write_text("{}")
    assert (out / "config.json").is_file()
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(InputError, match="a-file is not a directory"):
        with atomic_output_dir(tmp_path / "a-file" / "sub" / "out"):
            pass

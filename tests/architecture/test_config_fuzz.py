"""Issue 15, property-based, continued: a hostile or broken checkpoint config.json (for `build`), Hugging Face
config.json (for `convert`) or any combination of any command's options exits 0 or 2 with one line, never a
traceback. In process (typer's runner) over real files.

The configs start from a real one (a tiny llama converted here) with a few values replaced at random dotted
paths, so most examples get past JSON parsing into the typed checks. The checkpoint has no weights file, so a
config that passes every check fails fast where the weights are read instead of starting a real build."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_input_fuzz import assert_exit_0_or_one_line, runner
from tiny_models import make_tiny_model

from converters.convert import convert
from engine_builder.cli.commands import app

SETTINGS = settings(max_examples=120, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

scalars = (st.none() | st.booleans() | st.integers(-(2 ** 66), 2 ** 66) | st.floats(allow_nan=True, allow_infinity=True)
           | st.text(max_size=8) | st.sampled_from([0, 1, -1, 3, 1e-30, "float32", "int4_awq", "llama", "silu"]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)


def _paths(obj, prefix=()):
    """Every dotted path of a JSON object, containers included (replacing one replaces its whole subtree)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield (*prefix, k)
            yield from _paths(v, (*prefix, k))


def _mutated(config: dict, data) -> dict:
    config = json.loads(json.dumps(config))
    paths = list(_paths(config))
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        node = config
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            continue  # an earlier replacement removed this path
        if data.draw(st.booleans(), label="delete") and len(path) > 1:
            node.pop(path[-1], None)
        else:
            node[path[-1]] = data.draw(values)
    return config


def _copy_with_mutated_config(src: Path, dst: Path, data) -> Path:
    """DST: a copy of model dir SRC whose config.json has a few values replaced or deleted (_mutated)."""
    shutil.copytree(src, dst, dirs_exist_ok=True)
    (dst / "config.json").write_text(json.dumps(_mutated(json.loads((src / "config.json").read_text()), data)))
    return dst


@pytest.fixture(scope="module")
def tiny(module_tmp_factory) -> tuple[Path, Path]:
    """(the tiny llama's HF dir, its checkpoint dir without the weights file)."""
    root = module_tmp_factory.mktemp("fuzz")
    hf = make_tiny_model("llama", root / "hf")
    ckpt = root / "ckpt"
    convert(hf, ckpt, dtype="float32")
    for f in ckpt.glob("*.safetensors"):
        f.unlink()
    return hf, ckpt


@SETTINGS
@given(data=st.data())
def test_any_checkpoint_config_is_a_build_or_one_line(tmp_path, tiny, data):
    ckpt = _copy_with_mutated_config(tiny[1], Path(tmp_path) / "ckpt", data)
    out = Path(tmp_path) / "engine"
    assert_exit_0_or_one_line(["build", str(ckpt), str(out), "--force"])
    assert not out.exists(), "a failed build must leave no output"


@SETTINGS
@given(data=st.data())
def test_any_hf_config_is_a_checkpoint_or_one_line(tmp_path, tiny, data):
    hf = _copy_with_mutated_config(tiny[0], Path(tmp_path) / "hf", data)
    assert_exit_0_or_one_line(["convert", str(hf), str(Path(tmp_path) / "ckpt"), "--force"])


def _commands() -> dict[str, list]:
    import typer.main

    group = typer.main.get_command(app)
    return {name: [p for p in cmd.params if p.param_type_name == "option" and "--help" not in p.opts]
            for name, cmd in group.commands.items()}


COMMANDS = _commands()
option_values = (st.text(max_size=10) | st.integers(-(2 ** 40), 2 ** 40).map(str) | st.sampled_from(
    ["0", "-1", "nan", "inf", "1e309", "", " ", "all", "float32", "int4_awq", "tensorrt", "x=y", "a.b=[1]", "\x00"]))


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_options_of_any_command_exit_0_or_2(tmp_path, data):
    """Positional arguments name paths that do not exist (or one existing empty file), so nothing long runs:
    what is fuzzed is option parsing and the checks that come before any work."""
    name = data.draw(st.sampled_from(sorted(COMMANDS)))
    args = [name]
    for _ in range(data.draw(st.integers(0, 4))):
        option = data.draw(st.sampled_from(COMMANDS[name])) if COMMANDS[name] else None
        if option is None:
            break
        flag = data.draw(st.sampled_from(option.opts + option.secondary_opts))
        args.append(flag)
        if not option.is_flag and flag not in option.secondary_opts:
            args.append(data.draw(option_values))
    empty = Path(tmp_path) / "empty"
    empty.touch()
    args += data.draw(st.lists(st.sampled_from([str(Path(tmp_path) / "missing"), str(empty), "-"]), max_size=2))
    result = runner.invoke(app, args, catch_exceptions=True)
    assert result.exception is None or isinstance(result.exception, SystemExit), (args, repr(result.exception))
    assert result.exit_code in (0, 2), (args, result.exit_code, result.output)
    assert "Traceback" not in result.output, (args, result.output)

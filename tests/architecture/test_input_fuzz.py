"""Issue 15, property-based: whatever recipe YAML or `--set` value a user passes, `trtbuild build` exits 0 or 2
with one `error:` line, never a traceback. In process (typer's runner) so a few hundred examples take seconds;
the checkpoint does not exist, so a config that loads fails there, after every recipe and --set check."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis")
from cli_process import error_lines  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from engine_builder.cli.commands import app  # noqa: E402

KEYS = ["model", "quantization", "build", "fidelity", "targets", "dtype", "limits", "max_batch", "max_input_len",
        "max_seq_len", "compute_capabilities", "opt_level", "trt_flavour", "weights", "passes", "tensorrt",
        "onnxruntime", "kv_layout", "kv_block_size",
        "reference", "text", "max_tokens", "context", "max_ppl", "max_kl", "min_top1_agreement"]
SET_KEYS = ["dtype", "targets", "opt_level", "weights", "trt_flavour", "compute_capabilities", "limits",
            "limits.max_batch", "limits.max_input_len", "limits.max_seq_len", "passes", "passes.tensorrt",
            "passes.onnxruntime", "kv_layout", "kv_block_size", "limits.nope", "nope.max_batch", ""]

scalars = (st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70) | st.floats(allow_nan=True)
           | st.text(max_size=12) | st.sampled_from(["all", "float32", "tensorrt", "onnxruntime", "sm80", ".nan"]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), inner, max_size=4), max_leaves=12)
recipes = st.dictionaries(st.sampled_from(KEYS), values, max_size=5).map(
    lambda d: yaml.safe_dump(d, allow_unicode=True)) | st.text(max_size=80) | st.sampled_from(
    ["a: &a [*a]", "b: &b {c: *b}", "[" * 100, "build: !!binary aGk=", "build: !!set {a, b}", "? [a]\n: 1",
     "build: 2026-11-25", "--- 1\n--- 2"])
set_values = st.tuples(st.sampled_from(SET_KEYS), st.text(max_size=20) | values.map(
    lambda v: yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip()))

runner = CliRunner()


def assert_exit_0_or_one_line(args: list[str]) -> None:
    result = runner.invoke(app, args, catch_exceptions=True)
    assert result.exception is None or isinstance(result.exception, SystemExit), (args, result.exception)
    assert result.exit_code in (0, 2), (args, result.output)
    if result.exit_code == 2:
        lines = error_lines(result.stderr)
        assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, (
            args, result.stderr)


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=recipes)
def test_any_recipe_is_a_build_or_one_line(tmp_path, text):
    recipe = Path(tmp_path) / "r.yaml"
    recipe.write_text(text, encoding="utf-8", errors="surrogatepass")
    assert_exit_0_or_one_line(["build", str(tmp_path / "no-ckpt"), str(tmp_path / "out"), "--recipe", str(recipe)])


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sets=st.lists(set_values, min_size=1, max_size=3))
def test_any_set_value_is_a_build_or_one_line(tmp_path, sets):
    args = ["build", str(tmp_path / "no-ckpt"), str(tmp_path / "out")]
    for key, value in sets:
        args += ["--set", f"{key}={value}"]
    assert_exit_0_or_one_line(args)

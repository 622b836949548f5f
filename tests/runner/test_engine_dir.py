"""Loading an engine dir for running: every wrong directory is a one-line InputError with the fix."""

from __future__ import annotations

import json
import shutil

import pytest
from cli_process import assert_user_error, trtbuild

from engine_builder.formats.manifest import ENGINE_SCHEMA_VERSION, EngineManifest
from engine_builder.runner.engine import EngineDir
from engine_builder.runner.ort_backend import OrtBackend
from engine_builder.util.errors import InputError


def test_loads_limits_model_and_generation_config(tiny_engine):
    engine = EngineDir.load(tiny_engine("llama")[0])
    assert engine.limits.max_batch == 4 and engine.limits.max_seq_len == 96
    assert engine.model.num_layers == 2 and engine.dtype == "float32"
    assert engine.generation_config["eos_token_id"] == 2
    assert engine.onnx_path.is_file() and engine.tensorrt is None


def test_bad_dirs(tiny_engine, tmp_path):
    good = tiny_engine("llama")[0]
    with pytest.raises(InputError, match=r"does not exist; build one with `trtbuild build <ckpt-dir>"):
        EngineDir.load(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="is not an engine dir"):
        EngineDir.load(tmp_path / "empty")
    ckpt = good.parent / "ckpt"  # a checkpoint dir has a config.json too
    with pytest.raises(InputError, match="not a trtbuild engine dir .*a checkpoint dir"):
        EngineDir.load(ckpt)

    def variant(name: str, edit) -> object:
        d = tmp_path / name
        shutil.copytree(good, d)
        edit(d)
        return d

    newer = variant("newer", lambda d: (d / "config.json").write_text(json.dumps(
        {**json.loads((d / "config.json").read_text()), "schema_version": 99})))
    with pytest.raises(InputError, match="engine schema 99.*rebuild it"):
        EngineDir.load(newer)
    no_twin = variant("no-twin", lambda d: (d / "model.onnx").unlink())
    with pytest.raises(InputError, match="model.onnx is missing.*rebuild"):
        EngineDir.load(no_twin)
    corrupt = variant("corrupt", lambda d: (d / "config.json").write_text("{"))
    with pytest.raises(InputError, match="not valid JSON"):
        EngineDir.load(corrupt)
    no_tok = variant("no-tokenizer", lambda d: [(d / f).unlink() for f in ("tokenizer.json", "tokenizer_config.json")])
    with pytest.raises(InputError, match="no tokenizer files"):
        EngineDir.load(no_tok).load_tokenizer()


def test_the_typed_manifest_round_trips_and_checks_its_limits_once(tiny_engine, tmp_path):
    good = tiny_engine("llama")[0]
    manifest = EngineManifest.load(good)
    assert manifest.model is not None and manifest.build.limits.max_seq_len == 96 and manifest.targets
    copy = tmp_path / "copy"
    shutil.copytree(good, copy)
    manifest.save(copy)
    assert EngineManifest.load(copy) == manifest
    assert json.loads((copy / "config.json").read_text()) == json.loads((good / "config.json").read_text())

    data = json.loads((good / "config.json").read_text())
    data["build"]["limits"]["max_input_len"] = 4096  # above max_seq_len 96
    (copy / "config.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match="max_input_len 4096 exceeds max_seq_len 96.*--force"):
        EngineDir.load(copy)
    (copy / "config.json").write_text(json.dumps({**json.loads((good / "config.json").read_text()), "extra": 1}))
    with pytest.raises(InputError, match="unknown key.*extra.*--force"):
        EngineDir.load(copy)


def test_an_engine_dir_of_the_previous_format_is_one_line_naming_it_and_the_rebuild(tiny_engine, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(tiny_engine("llama")[0], old)
    data = json.loads((old / "config.json").read_text())
    (old / "config.json").write_text(json.dumps({**data, "schema_version": ENGINE_SCHEMA_VERSION - 1}))
    for command in (("run", old, "--prompt", "w3"), ("inspect", old), ("eval", old)):
        assert_user_error(trtbuild(*command), f"engine schema {ENGINE_SCHEMA_VERSION - 1}",
                          f"trtbuild build <ckpt-dir> {old} --force")


def test_the_kv_cache_comes_from_the_manifest_and_must_match_the_graph(tiny_engine, tmp_path):
    good = tiny_engine("llama")[0]
    engine = EngineDir.load(good)
    layout = engine.kv_layout  # [batch, kv_heads, max_seq, head_dim] per layer, as the emitter declared it
    assert (layout.num_layers, layout.max_seq, layout.dtype) == (2, 96, "float32")
    backend = OrtBackend(engine)
    assert backend.kv.nbytes == engine.limits.max_batch * layout.max_seq * layout.bytes_per_token
    mixed = tmp_path / "mixed"
    shutil.copytree(good, mixed)
    data = json.loads((good / "config.json").read_text())
    data["build"]["limits"]["max_seq_len"] = 64  # a manifest that does not describe this model.onnx
    (mixed / "config.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match="KV cache of 2 layers of .*96.*manifest describes 2 layers of .*64.*--force"):
        OrtBackend(EngineDir.load(mixed))


def test_the_host_ram_plan_refuses_the_twin_at_open_not_the_dir(tiny_engine, monkeypatch):
    """Loading an engine dir checks its files; the RAM the twin would take is weighed when a backend that keeps
    the engine in this machine's RAM opens (a GPU backend keeps its KV on the device), before it allocates."""
    from engine_builder.formats.memory_plan import MEMORY_ENV
    from engine_builder.util.errors import ConfigError

    engine = EngineDir.load(tiny_engine("llama")[0])
    monkeypatch.setenv(MEMORY_ENV, "0.000001")
    assert EngineDir.load(engine.path).path == engine.path
    with pytest.raises(ConfigError, match="needs about .* more than TRTBUILD_MEMORY_GB"):
        OrtBackend(engine)


@pytest.mark.parametrize("junk", ["not json", '{"model": 5}'])
def test_a_broken_tokenizer_in_an_engine_dir_is_one_line_at_run(tiny_engine, tmp_path, junk):
    """An engine dir's tokenizer.json edited after convert (run --no-verify skips the hashes that would catch it):
    whatever its parser raises (JSONDecodeError, transformers' KeyError) is one line and exit 2, not a traceback."""
    engine, _ = tiny_engine("llama")
    broken = tmp_path / "engine"
    shutil.copytree(engine, broken)
    (broken / "tokenizer.json").write_text(junk)
    assert_user_error(trtbuild("run", broken, "--prompt", "w3", "--max-new-tokens", "2", "--no-verify"),
                      "cannot load the tokenizer", "restore the model's tokenizer files")

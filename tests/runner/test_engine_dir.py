"""Loading an engine dir for running: every wrong directory is a one-line InputError with the fix."""

from __future__ import annotations

import json
import shutil

import pytest

from engine_builder.errors import InputError
from engine_builder.runner.engine_dir import EngineDir


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

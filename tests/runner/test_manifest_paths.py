"""A manifest's `files` entries are plain names of files inside the engine dir (issue 36, MEDIUM 5): `..`,
an absolute path or a symbolic link out of the dir is refused, one line and exit 2, by verify, run, serve and
inspect alike, before any file it names is read; no message carries the hash of a file outside the dir.
Each case edits a copy of the session's tiny engine (1 MB), never a build."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
from cli_process import assert_user_error, trtbuild

from engine_builder.formats.manifest import EngineManifest
from engine_builder.runner.engine_integrity import verify_engine_dir
from engine_builder.util.errors import InputError

WEIGHTS = "rank0.safetensors"


def _copy(engine, tmp_path, name: str):
    """A copy of ENGINE at tmp_path/name/engine, and a file outside it with the weights' bytes (a secret)."""
    dst = tmp_path / name / "engine"
    shutil.copytree(engine, dst)
    secret = tmp_path / name / "secret.bin"
    shutil.copy(dst / WEIGHTS, secret)
    return dst, secret


def _rename_weights_entry(engine, new_name: str, sha256: str | None = None) -> None:
    manifest = json.loads((engine / "config.json").read_text())
    for entry in manifest["files"]:
        if entry["name"] == WEIGHTS:
            entry["name"] = new_name
            if sha256 is not None:
                entry["sha256"] = sha256
    (engine / "config.json").write_text(json.dumps(manifest))


def test_dotdot_absolute_and_odd_names_are_refused_at_load(tiny_serve_engine, tmp_path):
    engine, secret = _copy(tiny_serve_engine, tmp_path, "names")
    for name in ("../secret.bin", str(secret), "sub/../../secret.bin", "..", "", "a\\b"):
        _rename_weights_entry(engine, name)
        with pytest.raises(InputError, match="not a plain file name inside the engine dir"):
            EngineManifest.load(engine)
        shutil.copy(tiny_serve_engine / "config.json", engine / "config.json")  # the build's manifest again
    assert [v.status for v in verify_engine_dir(engine)] == ["ok"] * len(EngineManifest.load(engine).files)


def test_verify_refuses_a_name_out_of_the_dir_without_printing_its_hash(tiny_serve_engine, tmp_path):
    engine, secret = _copy(tiny_serve_engine, tmp_path, "verify")
    secret_sha = hashlib.sha256(secret.read_bytes()).hexdigest()
    _rename_weights_entry(engine, "../secret.bin", sha256="0" * 64)  # a wrong hash: main printed the real one's
    proc = trtbuild("verify", engine)
    assert_user_error(proc, "'../secret.bin'", "not a plain file name")
    assert secret_sha[:8] not in proc.stdout + proc.stderr


def test_run_serve_and_inspect_refuse_alike(tiny_serve_engine, tmp_path):
    absolute, secret = _copy(tiny_serve_engine, tmp_path, "absolute")
    _rename_weights_entry(absolute, str(secret))  # run once loaded these weights from another dir
    assert_user_error(trtbuild("run", absolute, "--prompt", "w3 w4", "--max-new-tokens", "2"), "not a plain file name")
    assert_user_error(trtbuild("serve", absolute, "--port", "0"), "not a plain file name")
    linked, secret = _copy(tiny_serve_engine, tmp_path, "symlink")
    (linked / WEIGHTS).unlink()
    (linked / WEIGHTS).symlink_to(secret)  # the same bytes, so every hash matches: only the link is wrong
    assert_user_error(trtbuild("inspect", linked), "symbolic link out of the engine dir")
    assert_user_error(trtbuild("verify", linked), "symbolic link out of the engine dir")


def test_an_oversized_or_deeply_nested_manifest_is_one_line_exit_2(tiny_serve_engine, tmp_path):
    """Issue 36 LOW 8 (the engine dir's part): a RecursionError traceback and a 1.4 GB parse before."""
    nested, _ = _copy(tiny_serve_engine, tmp_path, "nested")
    (nested / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    assert_user_error(trtbuild("verify", nested), "not valid JSON (nested too deeply)")
    huge, _ = _copy(tiny_serve_engine, tmp_path, "huge")
    (huge / "config.json").write_text(json.dumps({"schema": "x", "pad": "a" * (5 << 20)}))
    assert_user_error(trtbuild("inspect", huge), "more than any engine manifest")

"""The engine dir's integrity: every file the engine reads has the sha256 its build recorded, checked by
every load (LLM, run, serve, eval) and by `trtbuild verify`; the checkpoint no longer shares its inode."""

from __future__ import annotations

import filecmp
import hashlib
import json
import os
import re
import shutil
import time

import httpx
import pytest
from cli_process import assert_user_error, trtbuild
from runner_engines import build_engine
from server.live_server import LiveServer

from engine_builder import LLM, SamplingParams
from engine_builder.build.third_party import build_third_party
from engine_builder.formats.build_config import BuildConfig, Limits
from engine_builder.formats.manifest import EngineManifest
from engine_builder.network.weights import link_weights
from engine_builder.runner import engine_integrity
from engine_builder.runner.engine import EngineDir
from engine_builder.runner.engine_integrity import verify_engine_dir
from engine_builder.util.errors import InputError

LIMITS = Limits(max_batch=2, max_input_len=16, max_seq_len=32)
GREEDY = SamplingParams(max_new_tokens=6, temperature=0, ignore_eos=True)
REBUILD = "trtbuild build <ckpt-dir>"


@pytest.fixture
def built(tiny_engine, tmp_path):
    """(checkpoint dir, engine dir) of a tiny llama, both private to the test (it may edit them)."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_engine("llama")[0].parent / "ckpt", ckpt)
    return ckpt, build_engine(ckpt, tmp_path / "engine", LIMITS)


def flip_byte(path, offset: int = -1) -> None:
    """Edit PATH in place (same inode), as a tool that rewrites a tensor would: the last byte is the
    high byte of the last float32 weight."""
    with open(path, "r+b") as f:
        f.seek(offset, os.SEEK_END if offset < 0 else os.SEEK_SET)
        byte = f.read(1)[0]
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte ^ 0xFF]))


def tokens(engine, **kwargs) -> tuple[int, ...]:
    with LLM(engine, backend="onnxruntime", **kwargs) as llm:
        return llm.generate("w3 w4 w5", GREEDY)[0].token_ids


def test_the_manifest_records_every_file_the_engine_reads(built):
    _, engine = built
    manifest = EngineManifest.load(engine)
    names = {d.name for d in manifest.files}
    assert {"model.onnx", "rank0.safetensors", "model.prepacked.onnx", "model.prepacked.onnx.data"} <= names
    assert not names & {"config.json", "tokenizer.json"}
    for d in manifest.files:
        data = (engine / d.name).read_bytes()
        assert (d.size, d.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert [v.status for v in verify_engine_dir(engine)] == ["ok"] * len(names)


def test_the_engine_owns_its_weights_so_editing_the_checkpoint_changes_no_answer(built):
    ckpt, engine = built
    assert not os.path.samefile(ckpt / "rank0.safetensors", engine / "rank0.safetensors")
    before = tokens(engine)
    flip_byte(ckpt / "rank0.safetensors")
    assert tokens(engine) == before
    assert trtbuild("verify", engine).returncode == 0


def test_a_changed_weight_byte_is_refused_by_every_loader_naming_the_file(built):
    _, engine = built
    flip_byte(engine / "rank0.safetensors")
    for load in (lambda: EngineDir.load(engine), lambda: LLM(engine, backend="onnxruntime")):
        with pytest.raises(InputError, match=re.escape(f"{engine / 'rank0.safetensors'} is modified: sha256 ") +
                           f".*{re.escape(f'`{REBUILD} {engine} --force`')}"):
            load()
    assert_user_error(trtbuild("run", engine, "--prompt", "w3", "--max-new-tokens", "2"),
                      str(engine / "rank0.safetensors"), f"{REBUILD} {engine} --force", f"trtbuild verify {engine}")
    proc = trtbuild("verify", engine)
    assert_user_error(proc, "1 of", "rank0.safetensors", f"{REBUILD} {engine} --force")
    assert "modified: sha256" in proc.stdout and "model.onnx" in proc.stdout
    report = json.loads(trtbuild("verify", engine, "--json").stdout)
    assert report["ok"] is False
    assert {f["name"]: f["status"] for f in report["files"]}["rank0.safetensors"] == "modified"
    # the documented opt-out for trusted dirs loads it anyway
    assert EngineDir.load(engine, verify=False).path == engine
    assert trtbuild("run", engine, "--prompt", "w3", "--max-new-tokens", "2", "--no-verify").returncode == 0
    # serve refuses before it binds a port, and takes the same opt-out
    assert_user_error(trtbuild("serve", engine, "--port", "0"), str(engine / "rank0.safetensors"),
                      f"{REBUILD} {engine} --force")
    server = LiveServer(engine, "--no-verify")
    try:
        assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200
    finally:
        assert server.stop() == 0


def test_truncated_missing_and_unrecorded_files(built, tmp_path):
    _, engine = built
    size = (engine / "rank0.safetensors").stat().st_size
    with open(engine / "rank0.safetensors", "r+b") as f:
        f.truncate(size - 4)
    with pytest.raises(InputError, match=rf"rank0.safetensors is modified: {size - 4} bytes, the build wrote {size}"):
        EngineDir.load(engine)
    info = trtbuild("inspect", engine, "--json")  # sizes only: no hashing, names the command that hashes
    assert info.returncode == 0, info.stderr
    integrity = json.loads(info.stdout)["integrity"]
    assert integrity["size_changed"] == ["rank0.safetensors"] and integrity["check"] == f"trtbuild verify {engine}"
    shown = " ".join(trtbuild("inspect", engine).stdout.replace("│", " ").split())  # the table, unwrapped
    assert "SIZE CHANGED: rank0.safetensors" in shown and "trtbuild verify" in shown

    (engine / "rank0.safetensors").unlink()
    (engine / "model.onnx.data").write_bytes(b"not from the build")
    verdicts = {v.name: v for v in verify_engine_dir(engine)}
    assert verdicts["rank0.safetensors"].status == "missing" and verdicts["model.onnx"].ok
    assert verdicts["model.onnx.data"].status == "unrecorded"
    with pytest.raises(InputError, match=r"rank0.safetensors is missing \(and 1 more file\(s\)\)"):
        EngineDir.load(engine)


def test_a_dir_sharing_the_checkpoints_inode_refuses_once_the_checkpoint_is_edited(built):
    """An engine dir whose weights are a hard link to the checkpoint (scratch dirs of link_weights, or
    one linked by hand): an edit of the checkpoint is caught at the next load, never a silent answer."""
    ckpt, engine = built
    (engine / "rank0.safetensors").unlink()
    link_weights(ckpt, engine)  # the hard link of scratch dirs
    assert os.path.samefile(ckpt / "rank0.safetensors", engine / "rank0.safetensors")
    tokens(engine)
    flip_byte(ckpt / "rank0.safetensors")
    with pytest.raises(InputError, match=r"rank0.safetensors is modified"):
        tokens(engine)
    assert trtbuild("verify", engine).returncode == 2


def test_a_load_skips_rehashing_only_an_inode_unchanged_since_this_process_hashed_it(built, monkeypatch, tmp_path):
    _, engine = built
    hashed = []

    def counting(path):
        hashed.append(path.name)
        return sha256(path)

    sha256 = engine_integrity.sha256_file
    monkeypatch.setattr(engine_integrity, "sha256_file", counting)
    monkeypatch.setattr(engine_integrity, "_hashed", {})
    monkeypatch.setattr(engine_integrity, "_recorded", None)
    monkeypatch.setenv("TRTBUILD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(engine_integrity, "_SETTLED_NS", 0)  # the files were written just now
    EngineDir.load(engine)
    first = len(hashed)
    assert first == len(EngineManifest.load(engine).files)
    EngineDir.load(engine)  # e.g. `serve` loads the dir, then LLM() loads it again
    assert len(hashed) == first
    time.sleep(0.05)  # past the clock's tick: the write below moves ctime
    flip_byte(engine / "rank0.safetensors")
    with pytest.raises(InputError, match="rank0.safetensors is modified"):
        EngineDir.load(engine)
    assert hashed[first:] == ["rank0.safetensors"]


def test_the_per_user_record_spares_the_next_process_hashing_but_not_an_edited_or_replaced_file(
        built, monkeypatch, tmp_path):
    """What one load verified in full, the next process's load does not hash again (issue 16's cold start),
    while any later write to a file, or a file put in its place, is still refused before any token; and
    `trtbuild verify` hashes every file whatever the record says."""
    _, engine = built
    weights = engine / "rank0.safetensors"
    hashed = []

    def counting(path):
        hashed.append(path.name)
        return sha256(path)

    def new_process():  # what a fresh process starts with: nothing hashed in memory, the record on disk
        monkeypatch.setattr(engine_integrity, "_hashed", {})
        monkeypatch.setattr(engine_integrity, "_recorded", None)

    sha256 = engine_integrity.sha256_file
    monkeypatch.setattr(engine_integrity, "sha256_file", counting)
    monkeypatch.setenv("TRTBUILD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(engine_integrity, "_SETTLED_NS", 0)  # the files were written just now
    names = sorted(d.name for d in EngineManifest.load(engine).files)
    new_process()
    EngineDir.load(engine)
    assert sorted(hashed) == names
    record = tmp_path / "cache" / "verified-files.json"
    assert record.stat().st_mode & 0o777 == 0o600 and len(json.loads(record.read_text())["files"]) == len(names)

    new_process()
    EngineDir.load(engine, verify="overlap").wait_verified()  # how `run` loads
    assert sorted(hashed) == names  # nothing hashed again

    time.sleep(0.05)  # past the clock's tick: the edit below moves ctime
    before = weights.stat()
    flip_byte(weights)  # edited in place: same inode, size and (set back) mtime; only ctime tells
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    new_process()
    with pytest.raises(InputError, match="rank0.safetensors is modified"):
        EngineDir.load(engine, verify="overlap").wait_verified()
    assert hashed[len(names):] == ["rank0.safetensors"]
    flip_byte(weights)  # back to the build's bytes; then replaced by a changed copy with the old mtime
    new_process()
    EngineDir.load(engine)
    mtime = weights.stat().st_mtime_ns
    shutil.copyfile(weights, tmp_path / "swap")
    flip_byte(tmp_path / "swap")
    os.utime(tmp_path / "swap", ns=(mtime, mtime))
    os.replace(tmp_path / "swap", weights)
    new_process()
    with pytest.raises(InputError, match="rank0.safetensors is modified"):
        EngineDir.load(engine)

    # a record vouching for the changed file (it is the user's own file, as trusted as the dir): a load
    # believes it, `trtbuild verify` does not read it
    entry = [*engine_integrity.fingerprint(weights.stat()),
             next(d.sha256 for d in EngineManifest.load(engine).files if d.name == "rank0.safetensors")]
    data = json.loads(record.read_text())
    record.write_text(json.dumps({**data, "files": [*data["files"], entry]}))
    new_process()
    EngineDir.load(engine)
    proc = trtbuild("verify", engine, "--json")
    assert proc.returncode == 2
    assert {f["name"]: f["status"] for f in json.loads(proc.stdout)["files"]}["rank0.safetensors"] == "modified"


def test_link_weights_own_copy_gives_the_engine_its_own_inode(built, tmp_path):
    ckpt, _ = built
    out = tmp_path / "out"
    out.mkdir()
    link_weights(ckpt, out)
    assert os.path.samefile(out / "rank0.safetensors", ckpt / "rank0.safetensors")
    link_weights(ckpt, out, own_copy=True)  # replaces the link
    assert not os.path.samefile(out / "rank0.safetensors", ckpt / "rank0.safetensors")
    assert filecmp.cmp(out / "rank0.safetensors", ckpt / "rank0.safetensors", shallow=False)
    assert sorted(p.name for p in out.iterdir()) == ["rank0.safetensors"]  # no temp file left


def test_build_onnx_records_its_files_too(built, tmp_path):
    _, engine = built
    out = tmp_path / "from-onnx"
    build_third_party(engine / "model.onnx", out, BuildConfig(targets=("onnxruntime",), limits=LIMITS))
    names = {d.name for d in EngineManifest.load(out).files}
    assert names == {"model.onnx", "model.onnx.data"}
    assert all(v.ok for v in verify_engine_dir(out))
    flip_byte(out / "model.onnx.data")
    proc = trtbuild("verify", out, "--json")
    assert proc.returncode == 2
    assert {f["name"]: f["status"] for f in json.loads(proc.stdout)["files"]}["model.onnx.data"] == "modified"

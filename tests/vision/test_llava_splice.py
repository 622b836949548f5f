"""LLaVA's engine dir (issue 35): vision.onnx is a verified file of the manifest."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cli_process import assert_user_error, trtbuild
from runner_engines import build_engine
from tiny_llava import tiny_llava

from converters.convert import convert
from engine_builder.formats.build_config import Limits
from engine_builder.formats.manifest import EngineManifest
from engine_builder.formats.vision_spec import VISION_MODEL
from engine_builder.runner.engine_integrity import verify_engine_dir

LIMITS = Limits(max_batch=2, max_input_len=48, max_seq_len=64)


@pytest.fixture(scope="module")
def llava(module_tmp_factory) -> tuple[Path, Path]:
    """(HF dir, checkpoint dir)."""
    root = module_tmp_factory.mktemp("llava-splice")
    hf_dir = tiny_llava(root / "hf")
    convert(hf_dir, root / "ckpt", dtype="float32")
    return hf_dir, root / "ckpt"


def flip_byte(path: Path) -> None:
    """Edit PATH's last byte in place (same inode and size), as tests/runner/test_engine_integrity.py does."""
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        byte = f.read(1)[0]
        f.seek(-1, os.SEEK_END)
        f.write(bytes([byte ^ 0xFF]))


def test_vision_onnx_is_a_verified_file_and_a_changed_byte_is_refused(llava, tmp_path):
    """The manifest's files record vision.onnx; `trtbuild verify` refuses a changed byte in it (exit 2)."""
    _, ckpt = llava
    engine = build_engine(ckpt, tmp_path / "engine", LIMITS)
    recorded = {d.name: d for d in EngineManifest.load(engine).files}
    assert VISION_MODEL in recorded and recorded[VISION_MODEL].size == (engine / VISION_MODEL).stat().st_size
    assert all(v.ok for v in verify_engine_dir(engine))
    assert trtbuild("verify", engine).returncode == 0
    flip_byte(engine / VISION_MODEL)
    proc = trtbuild("verify", engine)
    assert_user_error(proc, "1 of", VISION_MODEL, f"trtbuild build <ckpt-dir> {engine} --force")
    assert {v.name: v.status for v in verify_engine_dir(engine)}[VISION_MODEL] == "modified"

"""Fixtures for the network tests: tiny models (plus variants tests/tiny_models.py lacks) and checkpoints."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from extra_models import make_extra_model  # noqa: E402
from tiny_models import TINY_MODELS  # noqa: E402

from converters.convert import convert  # noqa: E402


@pytest.fixture(scope="session")
def model_dir(tiny_model_dir, tmp_path_factory):
    """model_dir(name) -> HF dir of a tiny model from TINY_MODELS or EXTRA_MODELS."""
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name in TINY_MODELS:
            return tiny_model_dir(name)
        if name not in made:
            made[name] = make_extra_model(name, tmp_path_factory.mktemp(name) / "hf")
        return made[name]

    return get


@pytest.fixture(scope="session")
def checkpoint_dir(model_dir, tmp_path_factory):
    """checkpoint_dir(name, dtype) -> `trtbuild convert` output of that tiny model, made once."""
    made: dict[tuple[str, str], Path] = {}

    def get(name: str, dtype: str = "float32") -> Path:
        if (name, dtype) not in made:
            out = tmp_path_factory.mktemp(f"{name}-{dtype}") / "ckpt"
            convert(model_dir(name), out, dtype=dtype)
            made[name, dtype] = out
        return made[name, dtype]

    return get

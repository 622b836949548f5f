"""Shared fixtures: tiny random models per architecture, and the real SmolLM2 GGUF."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tiny_models import TINY_MODELS, make_tiny_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """tiny_model_dir(name) -> HF dir of that tiny model, made once per session."""
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = make_tiny_model(name, tmp_path_factory.mktemp(name) / "hf")
        return made[name]

    return get


@pytest.fixture(params=sorted(TINY_MODELS))
def arch(request) -> str:
    return request.param

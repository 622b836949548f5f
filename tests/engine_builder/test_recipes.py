"""Every shipped recipe loads (no unknown keys) and validates."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine_builder.formats.build_config import load_recipe

RECIPES = sorted((Path(__file__).parents[2] / "recipes").glob("*.yaml"))


def test_there_are_recipes_for_each_family():
    names = {p.name for p in RECIPES}
    assert {"smollm2-135m-fp16.yaml", "smollm2-135m-fp32-onnxruntime.yaml"} <= names
    for family in ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3"):
        assert f"{family}-fp16.yaml" in names


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_is_valid(path):
    recipe = load_recipe(path)
    recipe.build.validate()
    assert recipe.model

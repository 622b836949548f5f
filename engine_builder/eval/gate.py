"""Recipe fidelity gates: `trtbuild build --recipe r.yaml` runs eval on the finished onnxruntime twin
before the engine dir is renamed into place, and refuses to publish an engine that misses a bound.

    gate = fidelity_gate(recipe.fidelity, Path("recipes/r.yaml"))   # checks its paths now, before the build
    build(ckpt, out, config, gate=gate)                             # gate(tmp_engine_dir, say) -> figures

A miss raises FidelityGateError naming the figure, the bound and the recipe; the figures of a pass
go into the manifest's "fidelity" block.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine_builder.eval.text import DEFAULT_MAX_TOKENS
from engine_builder.formats.build_config import Fidelity
from engine_builder.util.errors import ConfigError, InputError

Gate = Callable[[Path, Callable[[str], None]], dict[str, Any]]

# recipe key -> (figure it bounds, True when the figure must stay at or below the bound)
BOUNDS = {
    "max_ppl": ("ppl", True),
    "max_ppl_ratio": ("ppl_ratio", True),
    "max_kl": ("kl", True),
    "min_top1_agreement": ("top1_agreement", False),
}


class FidelityGateError(ConfigError):
    """The built engine misses a bound of its recipe's fidelity block."""


def fidelity_gate(fidelity: Fidelity, recipe_path: Path) -> Gate:
    """The check `build` runs on its finished engine dir. Paths resolve against the recipe's dir and must
    exist now, so a typo fails before minutes of building."""
    base = Path(recipe_path).parent
    reference = _existing(base, fidelity.reference, "reference", recipe_path)
    text = _existing(base, fidelity.text, "text", recipe_path)
    bounds = {key: getattr(fidelity, key) for key in BOUNDS if getattr(fidelity, key) is not None}

    def gate(engine_dir: Path, say: Callable[[str], None]) -> dict[str, Any]:
        from engine_builder.eval.evaluation import evaluate

        def progress(stage: str, done: int, total: int) -> None:
            say(f"fidelity gate: {stage}" + (f" {done}/{total}" if total else ""))

        result = evaluate(engine_dir, reference=reference, text=text,
                          max_tokens=fidelity.max_tokens or DEFAULT_MAX_TOKENS, context=fidelity.context,
                          backend="onnxruntime", progress=progress)
        figures = result.to_json()
        if result.reference_ppl is not None:
            figures["ppl_ratio"] = result.ppl / result.reference_ppl
        for key, bound in bounds.items():
            figure, at_most = BOUNDS[key]
            value = figures[figure]
            # written as "not within" so a NaN figure (a broken engine) fails every bound
            if not (value <= bound if at_most else value >= bound):
                sign = ">" if at_most else "<"
                raise FidelityGateError(f"fidelity gate failed: {figure} {value:.4g} {sign} {bound:g} ({key} in "
                                        f"{recipe_path}); no engine dir was written")
        return {**figures, "recipe": str(recipe_path), "bounds": bounds}

    return gate


def _existing(base: Path, value: str | None, key: str, recipe_path: Path) -> Path | None:
    if value is None:
        return None
    path = base / value
    if not path.exists():
        raise InputError(f"fidelity.{key} {path} (in {recipe_path}, relative to it) does not exist; "
                         f"{'convert or build it first' if key == 'reference' else 'fix the path'}")
    return path

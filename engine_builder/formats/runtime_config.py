"""How an engine runs by default: a recipe's `runtime:` block, kept in the engine dir as runtime.json.

    # recipe
    runtime:
      speculative: {method: ngram, num_draft_tokens: 4}              # or: adaptive when left out
      # speculative: {method: draft, draft_engine: ../smollm2-int4}  # relative to the recipe file

`trtbuild build --recipe` writes it into the engine dir (a draft_engine path rewritten relative to the
engine dir, so the pair moves together), and `run`, `chat` and `serve` on that engine speculate that
way unless their own --speculative says otherwise (`--speculative off` turns it off). Not among the
manifest's verified files: it is a default, like generation_config.json, and never changes numerics.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from engine_builder.formats.dataclass_io import from_dict
from engine_builder.util.errors import ConfigError

RUNTIME_FILE = "runtime.json"


@dataclass(frozen=True)
class SpeculativeDefaults:
    method: Literal["ngram", "draft"]
    draft_engine: str | None = None  # an engine dir with the same tokenizer (draft only)
    num_draft_tokens: int | None = None  # None: adaptive to the acceptance rate

    def __post_init__(self) -> None:
        if self.method == "draft" and not self.draft_engine:
            raise ConfigError("runtime.speculative.method draft needs runtime.speculative.draft_engine (an engine "
                              "dir built from a model with the same tokenizer, relative to the recipe)")
        if self.method != "draft" and self.draft_engine:
            raise ConfigError(f"runtime.speculative.draft_engine is only used with method draft, not {self.method}")
        n = self.num_draft_tokens
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ConfigError(f"runtime.speculative.num_draft_tokens must be a positive integer, got {n!r}")


@dataclass(frozen=True)
class RuntimeConfig:
    speculative: SpeculativeDefaults | None = None


def write_runtime(engine_dir: Path, runtime: RuntimeConfig, recipe_path: Path) -> None:
    """runtime.json in ENGINE_DIR, paths made relative to the engine dir (they were relative to the recipe)."""
    data = asdict(runtime)
    spec = data.get("speculative")
    if spec and spec.get("draft_engine"):
        draft = (Path(recipe_path).parent / spec["draft_engine"]).resolve()
        spec["draft_engine"] = os.path.relpath(draft, Path(engine_dir).resolve())
    (Path(engine_dir) / RUNTIME_FILE).write_text(json.dumps(data, indent=2) + "\n")


def read_runtime(engine_dir: Path) -> RuntimeConfig:
    """The engine dir's runtime defaults (none when it has no runtime.json); a draft_engine is returned as a
    path relative to the current directory, ready to open."""
    path = Path(engine_dir) / RUNTIME_FILE
    if not path.is_file():
        return RuntimeConfig()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is not readable JSON ({exc}); rebuild the engine or delete the file") from None
    runtime = from_dict(RuntimeConfig, data, where=str(path))
    spec = runtime.speculative
    if spec is not None and spec.draft_engine is not None:
        draft = str(Path(engine_dir) / spec.draft_engine)
        runtime = RuntimeConfig(SpeculativeDefaults(spec.method, draft, spec.num_draft_tokens))
    return runtime

"""The reference `trtbuild eval` compares against: an engine dir, or a checkpoint dir built on the fly.

A checkpoint (config.json schema trtbuild.checkpoint, written by `trtbuild convert`) becomes a
float32 onnxruntime engine in a temp dir, sized for exactly the windows being scored, and is
deleted afterwards. An engine dir (schema trtbuild.engine) is used as it is.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from engine_builder.formats.build_config import BuildConfig, Limits
from engine_builder.formats.checkpoint import CHECKPOINT_SCHEMA, CheckpointConfig
from engine_builder.formats.manifest import ENGINE_SCHEMA
from engine_builder.runner.engine import EngineDir, load_tokenizer
from engine_builder.util.errors import InputError


@dataclass(frozen=True)
class Reference:
    path: Path
    kind: Literal["engine", "checkpoint"]
    vocab_size: int
    engine: EngineDir | None  # the loaded engine dir; None for a checkpoint until it is built

    def load_tokenizer(self) -> Any:
        return self.engine.load_tokenizer() if self.engine is not None else load_tokenizer(self.path)


def load_reference(path: Path) -> Reference:
    """Tell a checkpoint dir from an engine dir by its config.json schema."""
    path = Path(path)
    config = path / "config.json"
    what = "pass a checkpoint dir from `trtbuild convert` or an engine dir from `trtbuild build` to --reference"
    if not config.is_file():
        raise InputError(f"reference {path} is not a checkpoint or engine dir (no config.json); {what}")
    try:
        schema = json.loads(config.read_text()).get("schema")
    except (OSError, ValueError, AttributeError):
        raise InputError(f"reference {config} is not a trtbuild config.json; {what}") from None
    if schema == ENGINE_SCHEMA:
        engine = EngineDir.load(path)
        return Reference(path, "engine", engine.model.vocab_size, engine)
    if schema == CHECKPOINT_SCHEMA:
        return Reference(path, "checkpoint", CheckpointConfig.load(path).model.vocab_size, None)
    raise InputError(f"reference {path} is neither a trtbuild checkpoint nor an engine dir (config.json schema "
                     f"{schema!r}; a Hugging Face dir? convert it first with `trtbuild convert`); {what}")


def check_same_vocab(engine: EngineDir, tokenizer: Any, reference: Reference, reference_tokenizer: Any) -> None:
    """KL and top-1 compare distributions token id by token id: both sides must mean the same tokens."""
    if engine.model.vocab_size != reference.vocab_size or tokenizer.get_vocab() != reference_tokenizer.get_vocab():
        raise InputError(f"reference {reference.path} has another vocabulary ({reference.vocab_size} logits, "
                         f"{len(reference_tokenizer)} tokens) than {engine.path} ({engine.model.vocab_size} logits, "
                         f"{len(tokenizer)} tokens); compare against a checkpoint or engine of the same model")


@contextlib.contextmanager
def opened_reference(reference: Reference, slots: int, context: int,
                     say: Callable[[str], None]) -> Iterator[EngineDir]:
    """The reference as an engine dir; a checkpoint is built for SLOTS windows of CONTEXT tokens first."""
    if reference.engine is not None:
        yield reference.engine
        return
    from engine_builder.build.pipeline import build

    say("building the float32 reference engine")
    # one token per step: prompts never exceed 1 token, and a window needs at most `context` KV positions
    limits = Limits(max_batch=slots, max_input_len=1, max_seq_len=context)
    with tempfile.TemporaryDirectory(prefix="trtbuild-eval-reference-") as tmp:
        out = Path(tmp) / "engine"
        build(reference.path, out, BuildConfig(targets=("onnxruntime",), dtype="float32", limits=limits))
        yield EngineDir.load(out)

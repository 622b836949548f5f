"""The Python API of an encoder engine (BERT family): Embeddings(engine_dir).embed(texts).

    from engine_builder import Embeddings
    with Embeddings("minilm-engine") as model:                   # onnxruntime twin; files checked at load
        vectors = model.embed(["A sentence.", "Another one."])    # float32 [2, model.dimensions]
        vector = model.embed("A sentence.")                       # float32 [model.dimensions]

Vectors come pooled and (where the model has a Normalize module) unit-length, as sentence-transformers'
encode gives them; texts longer than `max_tokens` are cut there, as sentence-transformers does.
`LLM(encoder_dir).embed(texts)` is the same call (an LLM over an encoder engine holds one of these as
`.embeddings`). `.embedder` is the core under it (runner/embedder.py: token ids in, vectors and token
counts out), what `trtbuild serve`'s EmbeddingBatcher drives.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engine_builder.runner.embedder import Embedder, check_encoder, check_texts
from engine_builder.runner.engine import EngineDir
from engine_builder.util.errors import InputError

__all__ = ["Embeddings"]


class Embeddings:
    def __init__(self, engine_dir: str | Path | EngineDir, backend: str = "auto", *, threads: int | None = None,
                 verify: bool = True) -> None:
        """Open an encoder engine dir. backend: auto or onnxruntime (the runtime drives encoders on the
        onnxruntime twin; tensorrt is refused with that reason). threads: onnxruntime intra-op threads
        (default: the physical cores this process may use). verify=False skips checking the files' sha256
        against the manifest. An EngineDir already loaded (an LLM's) is taken as it is: its loader checks
        its files. A text-generation engine dir is refused (InputError) before its tokenizer loads."""
        if isinstance(engine_dir, EngineDir):
            self.embedder = _open(engine_dir, backend, threads)
            return
        # the sha256 are checked in a thread while the tokenizer and the session load, as LLM() does
        engine = EngineDir.load(engine_dir, verify="overlap" if verify else False)
        try:
            self.embedder = _open(engine, backend, threads)
        except Exception:
            engine.wait_verified()  # a changed file explains a failed load better than the failure itself
            raise
        try:
            engine.wait_verified()
        except InputError:
            self.close()
            raise

    @property
    def engine(self) -> EngineDir:
        return self.embedder.engine

    @property
    def tokenizer(self) -> Any:
        return self.embedder.tokenizer

    @property
    def dimensions(self) -> int:
        """The length of each vector (the model's hidden size)."""
        return self.embedder.dimensions

    @property
    def max_tokens(self) -> int:
        """The most tokens of a text (special tokens included) the engine takes; longer texts are cut there."""
        return self.embedder.max_tokens

    @property
    def max_batch(self) -> int:
        """The most texts one engine call takes; embed() splits longer lists."""
        return self.embedder.max_batch

    @property
    def backend_name(self) -> str:
        return self.embedder.backend_name

    @property
    def backend_reason(self) -> str:
        return self.embedder.backend_reason

    def embed(self, texts: str | Sequence[str]) -> np.ndarray:
        """float32 [dimensions] for one string, [len(texts), dimensions] for a list, in order (as
        sentence-transformers' encode). Empty texts, and texts that are not strings, are an InputError."""
        vectors = self.embedder.embed(check_texts(texts)).embeddings
        return vectors[0] if isinstance(texts, str) else vectors

    def close(self) -> None:
        self.embedder.close()

    def __enter__(self) -> Embeddings:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _open(engine: EngineDir, backend: str, threads: int | None) -> Embedder:
    check_encoder(engine)  # before the tokenizer loads
    return Embedder(engine, engine.load_tokenizer(), backend, threads)

"""Embeddings from an encoder engine dir (BERT family): texts -> pooled, optionally unit-length vectors.

    embedder = Embedder(EngineDir.load("minilm-engine"), tokenizer)
    vectors = embedder.embed(["A sentence.", "Another one."]).embeddings     # float32 [2, hidden]

The user's entry point over it is runner/embeddings.py's Embeddings (engine dir, tokenizer, file checks);
this is the core it and the server's EmbeddingBatcher drive (token ids in, vectors and token counts out).

Texts are tokenized with the engine's tokenizer (special tokens added, truncated to the longest input
the engine takes: its max_input_len, sentence-transformers' max_seq_length), sorted by length and cut
into batches of up to max_batch rows, each padded only to its own longest text, where the cut saves more
padding than an engine call costs (plan_batches): a batch of mixed lengths pays for little padding. The
graph pools and normalizes (formats/encoder_spec.py), so a call returns the final vectors.

The onnxruntime twin runs here; a TensorRT engine of an encoder is built and shipped, but this runtime
does not drive it yet (no GPU could test it), so backend "tensorrt" is refused with that reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine_builder.formats import encoder_spec as io
from engine_builder.formats.encoder_spec import EncoderSpec
from engine_builder.runner.engine import EngineDir
from engine_builder.runner.tunables import EMBED_BATCH_OVERHEAD_TOKENS
from engine_builder.util.errors import CapacityError, InputError, UnsupportedError

BACKEND_REASON = "encoder engines run on the onnxruntime twin"


@dataclass(frozen=True)
class EmbeddingOutput:
    embeddings: np.ndarray  # float32 [texts, hidden], in input order
    token_counts: tuple[int, ...]  # tokens each text became (special tokens included), for usage

    @property
    def total_tokens(self) -> int:
        return sum(self.token_counts)


class Embedder:
    def __init__(self, engine: EngineDir, tokenizer: Any, backend: str = "auto", threads: int | None = None) -> None:
        check_encoder(engine)
        if backend not in ("auto", "onnxruntime"):
            raise UnsupportedError(f"backend {backend!r} cannot run encoder engines yet; {BACKEND_REASON} "
                                   "(use --backend onnxruntime or auto)")
        import onnxruntime as ort

        from engine_builder.runner.ort_backend import session_options

        self.engine, self.tokenizer = engine, tokenizer
        self.spec: EncoderSpec = engine.model.encoder
        self.dimensions = engine.model.hidden_size
        self.max_batch = engine.limits.max_batch
        self.max_tokens = min(engine.limits.max_input_len,
                              self.spec.max_tokens(engine.model.max_position_embeddings))
        self.backend_name, self.backend_reason = "onnxruntime", BACKEND_REASON
        engine.check_host_memory()
        self._session = ort.InferenceSession(str(engine.onnx_path), session_options(engine.dtype, threads),
                                             providers=["CPUExecutionProvider"])
        self._pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.spec.pad_token_id)

    def tokenize(self, texts: Sequence[str], max_tokens: int | None = None) -> list[list[int]]:
        """Token ids of each text, special tokens added, truncated to max_tokens (as sentence-transformers does;
        default and upper bound: the engine's)."""
        texts = check_texts(texts)
        longest = min(max_tokens or self.max_tokens, self.max_tokens)
        return [list(ids) for ids in self.tokenizer(texts, truncation=True, max_length=longest,
                                                    add_special_tokens=True).input_ids]

    def embed(self, texts: Sequence[str]) -> EmbeddingOutput:
        return self.embed_ids(self.tokenize(texts))

    def embed_ids(self, token_ids: Sequence[Sequence[int]]) -> EmbeddingOutput:
        """Vectors of already tokenized texts, in order; each row at most max_tokens long."""
        if not token_ids:
            raise InputError("no texts given; pass at least one")
        vocab = self.engine.model.vocab_size
        for ids in token_ids:
            if not ids:
                raise InputError("a text became zero tokens; pass non-empty token lists")
            if len(ids) > self.max_tokens:
                raise CapacityError(f"an input has {len(ids)} tokens but this engine takes at most {self.max_tokens}; "
                                    "shorten it (tokenize() truncates)")
            if min(ids) < 0 or max(ids) >= vocab:
                raise InputError(f"token ids must be in [0, {vocab}) for this model")
        out = np.empty((len(token_ids), self.dimensions), np.float32)
        order = sorted(range(len(token_ids)), key=lambda i: len(token_ids[i]))  # similar lengths share a batch
        for start, end in plan_batches([len(token_ids[i]) for i in order], self.max_batch):
            rows = order[start:end]
            out[rows] = self._run([token_ids[i] for i in rows])
        return EmbeddingOutput(out, tuple(len(ids) for ids in token_ids))

    def _run(self, batch: list[Sequence[int]]) -> np.ndarray:
        width = max(len(ids) for ids in batch)
        input_ids = np.full((len(batch), width), self._pad, np.int64)  # [rows, width], right-padded
        mask = np.zeros((len(batch), width), np.int64)
        for row, ids in enumerate(batch):
            input_ids[row, :len(ids)] = ids
            mask[row, :len(ids)] = 1
        (embeddings,) = self._session.run([io.EMBEDDINGS], {io.INPUT_IDS: input_ids, io.ATTENTION_MASK: mask})
        return embeddings  # [rows, hidden]

    def close(self) -> None:
        self._session = None


def plan_batches(lengths: Sequence[int], max_batch: int,
                 overhead: int = EMBED_BATCH_OVERHEAD_TOKENS) -> list[tuple[int, int]]:
    """Cut LENGTHS (ascending) into runs of at most MAX_BATCH rows, each padded to its last (longest) row,
    so that padded tokens + OVERHEAD per engine call are fewest (dynamic programming over the cut points).
    A batch of mixed lengths then pays for its short texts' own length, not for the longest text's."""
    n = len(lengths)
    best = [0] + [float("inf")] * n  # best[end]: the cost of rows [0, end)
    cut = [0] * (n + 1)
    for end in range(1, n + 1):
        for start in range(max(0, end - max_batch), end):
            cost = best[start] + (end - start) * lengths[end - 1] + overhead
            if cost < best[end]:
                best[end], cut[end] = cost, start
    runs, end = [], n
    while end:
        runs.append((cut[end], end))
        end = cut[end]
    return runs[::-1]


def check_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str):
        texts = [texts]
    texts = list(texts)
    if not texts:
        raise InputError("no texts given; pass a string or a list of strings")
    bad = next((t for t in texts if not isinstance(t, str)), None)
    if bad is not None:
        raise InputError(f"texts must be strings, got {type(bad).__name__}")
    if any(not t for t in texts):
        raise InputError("a text is empty; pass non-empty strings")
    return texts


def check_encoder(engine: EngineDir) -> None:
    """Refuse a text-generation engine dir, before anything of it loads."""
    if engine.model.encoder is None:
        raise InputError(f"{engine.path} is a text-generation ({engine.model.architecture}) engine, not an "
                         "encoder: embeddings need an encoder engine (e.g. a BERT / sentence-transformers model); "
                         "generate text with this one instead (LLM.generate, `trtbuild run --prompt`)")

"""EmbeddingBatcher over the real MiniLM engine: concurrent requests share engine calls and get exactly the
vectors they get alone; a failing step fails only its own requests; shutdown refuses new work."""

from __future__ import annotations

import numpy as np
import pytest

from engine_builder import Embeddings
from engine_builder.executor.embedding_batcher import EmbeddingBatcher
from engine_builder.util.errors import InputError

TEXTS = ["A man is eating food.", "Hi", "A cheetah is running behind its prey across the savanna.", "东京", "ok"]


@pytest.fixture(scope="module")
def embedder(minilm_engine):
    with Embeddings(minilm_engine) as model:
        yield model.embedder


def test_requests_submitted_together_share_steps_and_keep_their_vectors(embedder):
    ids = embedder.tokenize(TEXTS)
    alone = [embedder.embed_ids([row]).embeddings[0] for row in ids]
    batcher = EmbeddingBatcher(embedder)
    try:
        futures = [batcher.submit([ids[i % 5], ids[(i + 1) % 5]]) for i in range(20)]
        for i, future in enumerate(futures):
            np.testing.assert_allclose(future.result(60), [alone[i % 5], alone[(i + 1) % 5]], atol=1e-6)
        stats = batcher.stats()
        assert stats.requests_finished == 20 and stats.texts == 40
        assert stats.steps < 20  # the requests queued while the engine ran went in together
    finally:
        batcher.shutdown()
    with pytest.raises(InputError, match="shut down"):
        batcher.submit([ids[0]])


def test_a_failing_step_fails_only_its_requests(embedder):
    batcher = EmbeddingBatcher(embedder)
    try:
        bad = batcher.submit([[101, 10 ** 6, 102]])  # a token id outside the vocabulary
        with pytest.raises(InputError, match="token ids must be in"):
            bad.result(60)
        good = batcher.submit(embedder.tokenize(["still serving"]))
        assert good.result(60).shape == (1, 384)
        assert batcher.stats().requests_failed == 1 and batcher.alive
    finally:
        batcher.shutdown()

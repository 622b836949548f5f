"""`trtbuild run ENGINE --embed TEXT`: print the embedding of each TEXT from an encoder engine.

stdout: one JSON array of floats per --embed, in order (pipe it into jq or numpy); with --json, one
object per text with its embedding, dimensions and token count. The backend goes to stderr.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from engine_builder.util.errors import InputError


def run_embed(engine_dir: Path, texts: list[str], backend: str, verify: bool, as_json: bool) -> None:
    from engine_builder.runner.embeddings import Embeddings

    if any(not t.strip() for t in texts):
        raise InputError("--embed got an empty text; pass the text to embed, e.g. --embed \"A sentence.\"")
    # a text-generation engine dir is refused before it loads: "embeddings need an encoder engine"
    with Embeddings(engine_dir, backend=backend, verify=verify) as model:
        output = model.embedder.embed(texts)  # the vectors and each text's token count
    for vector, tokens in zip(output.embeddings, output.token_counts):
        values = [float(v) for v in vector]
        line = {"embedding": values, "dimensions": len(values), "tokens": tokens} if as_json else values
        sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()
    sys.stderr.write(f"[{model.backend_name}] {len(texts)} text(s), {output.total_tokens} tokens, "
                     f"{model.dimensions} dimensions\n")

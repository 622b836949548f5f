"""How far a shared prefill call's logits are from each prompt's solo call, and how often that flips a draw.

    .venv/bin/python benchmarks/prefill_branch_numerics.py [--engine DIR] [--work build/bench-serve] [--json]

A shared call (runner/batched_prefill.py) runs the graph's GroupQueryAttention branch when every row of its
slot range starts at 0, and the generic Attention-24 branch when one starts past 0 (a prefix-cache hit, a
decoding request riding along: passes/lower_ort_attention.py); a solo prefill is one row, always GQA. For
serve_soak's prompts, three at a time, this prints the largest |logit difference| between each prompt's
solo call and the same row of a shared call, without and with a rider at length 5, and the probability that
the Sampler's inverse-CDF draw (one uniform u, float32 cumsum over the vocab) picks a different token from
the two sets of logits, for temperatures 0.7, 1.0 and 1.3: the measure of the u that land between the two
cumulative distributions at some token boundary. No timing: the figures do not depend on machine load.
SmolLM2-135M-Instruct fp32 on the onnxruntime twin (prefill_burst.py's engine unless --engine). Given an engine
built `--kv-layout paged`, both lines read 0: that graph has no branch (Attention-24 for every call), whatever
the labels say. So do slot engines built since passes/drop_ort_attention_fallback.py dropped the If: the
backend runs a call with a row past 0 a row per call, each GroupQueryAttention; the non-zero figures are those
of engines built with the If.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(ROOT / "tests")]

from decode import engine_dirs  # noqa: E402
from prefill_logits import shared_logits, solo_logits  # noqa: E402
from serve_soak import PROMPTS  # noqa: E402

TEMPERATURES = (0.7, 1.0, 1.3)
RIDER_LENGTH = 5


def flip_probability(a: np.ndarray, b: np.ndarray, temperature: float) -> float:
    """P(u) that Sampler's draw differs between logits a and b [vocab] (no top_k/top_p): the union of the
    intervals between the two normalized float32 CDFs at every token."""
    def cdf(x: np.ndarray) -> np.ndarray:
        c = np.cumsum(np.exp((x - x.max()) / np.float32(temperature)).astype(np.float32)).astype(np.float64)
        return c / c[-1]
    fa, fb = cdf(a), cdf(b)
    lo, hi = np.minimum(fa, fb), np.maximum(fa, fb)  # both nondecreasing in the token index
    prev_hi = np.concatenate([[0.0], hi[:-1]])
    return float(np.maximum(0.0, hi - np.maximum(lo, prev_hi)).sum())


def measure(llm) -> list[dict]:
    encoded = [llm.encode(p) for p in PROMPTS]
    rows = []
    for at in range(0, len(encoded) - 2, 3):
        group = encoded[at:at + 3]
        solo = solo_logits(llm.backend, group)
        for rider in (False, True):
            shared = shared_logits(llm.backend, group, RIDER_LENGTH if rider else None)
            rows.append({"prompts": f"{at}-{at + len(group) - 1}",
                         "branch": "Attention-24 (rider at 5)" if rider else "GQA (all rows at 0)",
                         "max_abs_logit_diff": max(float(np.abs(a - b).max()) for a, b in zip(solo, shared)),
                         **{f"flip_t{t}": max(flip_probability(a, b, t) for a, b in zip(solo, shared))
                            for t in TEMPERATURES}})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", type=Path, help="a SmolLM2 slot-layout engine dir (default: built under --work)")
    parser.add_argument("--work", type=Path, default=Path("build/bench-serve"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from engine_builder import LLM

    engine = args.engine or engine_dirs(args.work, ["default"], 8, 64)["default"]
    llm = LLM(engine, backend="onnxruntime")
    rows = measure(llm)
    llm.close()
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        flips = ", ".join(f"t={t}: {r[f'flip_t{t}']:.2e}" for t in TEMPERATURES)
        print(f"prompts {r['prompts']}, {r['branch']}: max |dlogit| {r['max_abs_logit_diff']:.2e}; "
              f"P(draw differs) {flips}")


if __name__ == "__main__":
    main()

"""Grammar overhead per token: JSON-schema-constrained decode vs plain decode, batch 1, SmolLM2 fp32 on
the onnxruntime twin (target: <= 10 % per token), with llguidance's own mask time per token.

Both runs decode the same chat prompt greedily; the plain one with ignore_eos so it runs the whole
budget. Per-token time = decode-step seconds / decode tokens (Timings), so the constrained run's
earlier end does not bias it. Runs alternate; medians. The engine's own figure replays the constrained
answer's tokens through a fresh llguidance matcher and times each mask computation.

    .venv/bin/python benchmarks/grammar.py [--engine DIR] [--runs 3] [--new-tokens 96] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

SCHEMA = {"type": "object", "properties": {
    "cities": {"type": "array", "minItems": 3, "maxItems": 8, "items": {
        "type": "object", "properties": {
            "name": {"type": "string", "maxLength": 30}, "country": {"type": "string", "maxLength": 30},
            "population": {"type": "integer", "minimum": 0},
            "landmarks": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 4}},
        "required": ["name", "country", "population", "landmarks"], "additionalProperties": False}}},
    "required": ["cities"], "additionalProperties": False}
MESSAGES = [{"role": "user", "content": "List some large cities with their country, population and landmarks as JSON."}]


def _engine(path: str | None, tmp: Path) -> Path:
    if path:
        return Path(path)
    from converters.convert import convert
    from engine_builder.build.pipeline import build
    from engine_builder.formats.build_config import BuildConfig, Limits
    from engine_builder.util.bundled import smollm2_gguf

    convert(smollm2_gguf(), tmp / "ckpt", dtype="float32")
    build(tmp / "ckpt", tmp / "engine", BuildConfig(targets=("onnxruntime",), dtype="float32",
                                                    limits=Limits(max_batch=1, max_input_len=256, max_seq_len=512)))
    return tmp / "engine"


def _per_token(llm, params) -> tuple[float, list[int]]:
    out = llm.chat(MESSAGES, params)[0]
    t = llm.last_timings
    return t.decode_seconds / t.decode_tokens, list(out.token_ids)


def _mask_us(llm, tokens: list[int]) -> list[float]:
    """llguidance's own time to compute each mask along the constrained answer."""
    grammars = llm.generator.grammars
    matcher = grammars.matcher(llm.default_params(json_schema=SCHEMA))
    times = []
    for t in tokens:
        t0 = time.perf_counter()
        matcher._fill()
        times.append((time.perf_counter() - t0) * 1e6)
        matcher.accept(t)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", help="a SmolLM2 engine dir (default: convert + build the bundled GGUF)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from engine_builder import LLM

    with tempfile.TemporaryDirectory() as tmp:
        engine = _engine(args.engine, Path(tmp))
        with LLM(engine, backend="onnxruntime") as llm:
            plain = llm.default_params(max_new_tokens=args.new_tokens, ignore_eos=True)
            constrained = llm.default_params(max_new_tokens=args.new_tokens, json_schema=SCHEMA)
            _per_token(llm, constrained)  # warm-up: the grammar compile and the tokenizer load are not per token
            _per_token(llm, plain)
            plain_s, constrained_s, tokens = [], [], []
            for _ in range(args.runs):
                plain_s.append(_per_token(llm, plain)[0])
                s, tokens = _per_token(llm, constrained)
                constrained_s.append(s)
            mask = _mask_us(llm, tokens)
    p, c = statistics.median(plain_s), statistics.median(constrained_s)
    result = {"plain_ms_per_token": p * 1e3, "constrained_ms_per_token": c * 1e3,
              "overhead_pct": (c / p - 1) * 100, "constrained_tokens": len(tokens),
              "llguidance_mask_us_median": statistics.median(mask), "llguidance_mask_us_max": max(mask),
              "llguidance_mask_pct_of_plain_token": statistics.median(mask) / (p * 1e6) * 100, "target_pct": 10.0}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"plain {result['plain_ms_per_token']:.2f} ms/token, json_schema {result['constrained_ms_per_token']:.2f} "
          f"ms/token ({len(tokens)} tokens): overhead {result['overhead_pct']:+.1f} % (target <= 10 %); "
          f"llguidance mask median {result['llguidance_mask_us_median']:.0f} us "
          f"({result['llguidance_mask_pct_of_plain_token']:.2f} % of a plain token), max "
          f"{result['llguidance_mask_us_max']:.0f} us")


if __name__ == "__main__":
    main()

"""xgrammar vs llguidance on SmolLM2's tokenizer: grammar compile time and token-mask time per step.

Each engine compiles the same JSON schemas (cold: a fresh compiler per schema, no cache), then
walks a schema-valid answer token by token: per step, fill the next-token mask, then accept the
token. Medians over steps and runs. This is what decided runner/grammar.py's engine.

    .venv/bin/python benchmarks/grammar_engines.py [--runs 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

SCHEMAS = {
    "person": ({"type": "object", "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3}},
        "required": ["name", "age", "tags"], "additionalProperties": False},
        {"name": "Ada Lovelace", "age": 36, "tags": ["a", "c"]}),
    "nested": ({"type": "object", "properties": {
        "user": {"type": "object", "properties": {"id": {"type": "integer"}, "email": {"type": "string"}},
                 "required": ["id", "email"], "additionalProperties": False},
        "score": {"type": "number", "minimum": 0, "maximum": 1}, "ok": {"type": "boolean"}},
        "required": ["user", "score", "ok"], "additionalProperties": False},
        {"user": {"id": 12345, "email": "ada@example.com"}, "score": 0.75, "ok": True}),
    "any_json": ({"type": "object"}, {"city": "Paris", "population": 2100000, "landmarks": ["Louvre", "Eiffel"]}),
}


def _answer_ids(tokenizer, answer: dict) -> list[int]:
    # the compact form both engines accept under their default whitespace rules
    return tokenizer.encode(json.dumps(answer, separators=(", ", ": ")), add_special_tokens=False)


def bench_llguidance(tokenizer, runs: int) -> dict[str, float]:
    import llguidance
    import llguidance.hf
    import llguidance.numpy

    t0 = time.perf_counter()
    lltok = llguidance.hf.from_tokenizer(tokenizer)
    tok_s = time.perf_counter() - t0
    compile_ms, mask_us = [], []
    for _ in range(runs):
        for schema, answer in SCHEMAS.values():
            t0 = time.perf_counter()
            grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
            matcher = llguidance.LLMatcher(lltok, grammar)
            compile_ms.append((time.perf_counter() - t0) * 1e3)
            mask = llguidance.numpy.allocate_token_bitmask(1, lltok.vocab_size)
            for t in _answer_ids(tokenizer, answer):
                t0 = time.perf_counter()
                llguidance.numpy.fill_next_token_bitmask(matcher, mask, 0)
                mask_us.append((time.perf_counter() - t0) * 1e6)
                assert matcher.consume_token(t), matcher.get_error()
    return {"tokenizer_init_s": tok_s, "compile_ms_median": statistics.median(compile_ms),
            "mask_us_median": statistics.median(mask_us), "mask_us_p99": _p99(mask_us)}


def bench_xgrammar(tokenizer, runs: int) -> dict[str, float]:
    import xgrammar

    t0 = time.perf_counter()
    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    tok_s = time.perf_counter() - t0
    compile_ms, mask_us = [], []
    for _ in range(runs):
        for schema, answer in SCHEMAS.values():
            compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
            t0 = time.perf_counter()
            compiled = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
            matcher = xgrammar.GrammarMatcher(compiled)
            compile_ms.append((time.perf_counter() - t0) * 1e3)
            mask = xgrammar.allocate_token_bitmask(1, info.vocab_size)
            for t in _answer_ids(tokenizer, answer):
                t0 = time.perf_counter()
                matcher.fill_next_token_bitmask(mask)
                mask_us.append((time.perf_counter() - t0) * 1e6)
                assert matcher.accept_token(t), t
    return {"tokenizer_init_s": tok_s, "compile_ms_median": statistics.median(compile_ms),
            "mask_us_median": statistics.median(mask_us), "mask_us_p99": _p99(mask_us)}


def _p99(values: list[float]) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * 0.99))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import transformers

    from engine_builder.util.bundled import smollm2_gguf

    gguf = smollm2_gguf()
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    result = {"llguidance": bench_llguidance(tokenizer, args.runs), "xgrammar": bench_xgrammar(tokenizer, args.runs)}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for name, r in result.items():
        print(f"{name:10s} tokenizer init {r['tokenizer_init_s']:.3f} s  compile {r['compile_ms_median']:.2f} ms  "
              f"mask median {r['mask_us_median']:.1f} us  p99 {r['mask_us_p99']:.1f} us")


if __name__ == "__main__":
    main()

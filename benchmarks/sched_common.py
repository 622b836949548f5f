"""What the scheduling benchmarks share: the SmolLM2 engine they run on, long system prompts, medians.

The engine: SmolLM2-135M-Instruct (the bundled GGUF) as a float32 onnxruntime twin with 9 KV slots of
2,048 positions (8 decoding streams + one long prompt), built once into --engine DIR and reused.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

# the repo root ahead of benchmarks/ (whose passes.py would shadow the passes package)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_ENGINE = Path("/tmp/trtbuild-bench-sched/engine")


def engine_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", type=Path, default=DEFAULT_ENGINE,
                        help="engine dir to use, built there from the bundled SmolLM2 when missing")


def smollm2_engine(engine: Path) -> Path:
    from converters.convert import convert
    from engine_builder.build.pipeline import build
    from engine_builder.formats.build_config import BuildConfig, Limits
    from engine_builder.util.bundled import smollm2_gguf

    if (engine / "config.json").exists():
        return engine
    ckpt = engine.parent / "ckpt"
    engine.parent.mkdir(parents=True, exist_ok=True)  # convert and build refuse a missing parent dir
    if not (ckpt / "config.json").exists():
        convert(smollm2_gguf(), ckpt, dtype="float32")
    build(ckpt, engine, BuildConfig(targets=("onnxruntime",), dtype="float32",
                                    limits=Limits(max_batch=9, max_input_len=2048, max_seq_len=2048)))
    return engine


def text_of_tokens(tokenizer, tokens: int, start_word: int = 0) -> str:
    """About TOKENS tokens of the shipped public-domain text, from word START_WORD on."""
    from engine_builder.util.text_files import builtin_text

    words = builtin_text("eval.txt").text.split()
    end = start_word + 1
    while len(tokenizer(" ".join(words[start_word:end])).input_ids) < tokens:
        end += 20
    return " ".join(words[start_word:end])


def median(values) -> float:
    return statistics.median(values) if values else float("nan")

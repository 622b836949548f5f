"""What each `--lm-head` choice costs on SmolLM2-135M int4_awq (or int4_wo) g32: fidelity against the fp32 engine (ppl
ratio, KL, top-1, the windows `trtbuild eval` scores) and batch-1 decode speed of the onnxruntime twin.

    python benchmarks/lm_head.py [--scheme int4_awq|int4_wo] [--max-tokens 1024] [--context 256] [--runs 3] [--json]

Variants: float (`--lm-head float`), int8 (per output channel, convert's default for weight-only
schemes) and same (int4 in groups of 32, like the body). The tied embedding stays float32 in all.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from quant_decode import engine_dir, ours  # noqa: E402
from smollm2_quant import checkpoint  # noqa: E402


def variants(scheme: str) -> dict[str, str]:
    return {"float": f"{scheme}_g32", "int8": f"{scheme}_g32_lm8", "same": f"{scheme}_g32_lm4"}


def lm_head_mb(ckpt: Path) -> float:
    """MB of lm_head's own tensors (0: a float lm_head of a tied model is the embedding itself)."""
    import math

    from safetensors import safe_open

    with safe_open(str(ckpt / "rank0.safetensors"), "numpy") as f:
        sizes = {"I8": 1, "U8": 1, "F16": 2, "BF16": 2, "F32": 4}
        return sum(math.prod(f.get_slice(n).get_shape()) * sizes[f.get_slice(n).get_dtype()]
                   for n in f.keys() if n.startswith("lm_head.")) / 1e6  # noqa: SIM118 (not a dict)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--work", type=Path, default=Path("build/bench-quant"))
    parser.add_argument("--scheme", choices=["int4_awq", "int4_wo"], default="int4_awq",
                        help="int4_wo needs no calibration: minutes faster to convert")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    VARIANTS = variants(args.scheme)  # noqa: N806
    from engine_builder import LLM
    from engine_builder.build.pipeline import build
    from engine_builder.eval import evaluate
    from engine_builder.formats.build_config import BuildConfig, Limits

    args.work.mkdir(parents=True, exist_ok=True)
    limits = Limits(max_batch=4, max_input_len=64, max_seq_len=args.context)
    evals = {}
    for variant in ["fp32", *VARIANTS.values()]:
        evals[variant] = args.work / f"engine-{variant}-eval{args.context}"
        if not evals[variant].exists():
            build(checkpoint(args.work, variant), evals[variant],
                  BuildConfig(targets=("onnxruntime",), dtype="float32", limits=limits))
    rows = {}
    for choice, variant in VARIANTS.items():
        r = evaluate(evals[variant], reference=evals["fp32"], max_tokens=args.max_tokens, context=args.context,
                     backend="onnxruntime")
        ckpt, engine = engine_dir(args.work, variant, args.new_tokens)
        llm = LLM(engine, backend="onnxruntime")
        ours(llm, 8)  # warm-up
        speed = statistics.median(ours(llm, args.new_tokens) for _ in range(args.runs))
        llm.close()
        rows[choice] = {"ppl_ratio": r.ppl / r.reference_ppl, "kl": r.kl, "top1": r.top1_agreement,
                        "decode_tok_s": speed, "lm_head_mb": lm_head_mb(ckpt),
                        "ckpt_mb": (ckpt / "rank0.safetensors").stat().st_size / 1e6}
    if args.json:
        print(json.dumps({"max_tokens": args.max_tokens, "context": args.context, "rows": rows}))
        return
    print(f"SmolLM2-135M {args.scheme} g32, onnxruntime float32 twin; eval: {args.max_tokens} tokens in windows of "
          f"{args.context} vs the fp32 engine; decode: batch 1, {args.new_tokens} tokens, median of {args.runs}")
    print(f"{'--lm-head':<10} {'ppl ratio':>9} {'KL':>8} {'top-1':>7} {'tok/s':>7} {'lm_head MB':>10} {'ckpt MB':>8}")
    for choice, r in rows.items():
        print(f"{choice:<10} {r['ppl_ratio']:>9.3f} {r['kl']:>8.4f} {r['top1']:>7.3f} {r['decode_tok_s']:>7.1f} "
              f"{r['lm_head_mb']:>10.1f} {r['ckpt_mb']:>8.1f}")


if __name__ == "__main__":
    main()

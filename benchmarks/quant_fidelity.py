"""Fidelity per quantization variant, against llama.cpp's own requantization of the same model.

    .venv/bin/python benchmarks/quant_fidelity.py [--max-tokens 1024] [--context 256]
                                                  [--variants int8_wo_g32 int4_awq_g32 ...] [--work build/bench-quant]
                                                  [--json]

SmolLM2-135M-Instruct exists here only as the bundled Q4_1 GGUF, so the float model every scheme
quantizes is that GGUF dequantized. Ours: each variant (benchmarks/smollm2_quant.py) is built as an
onnxruntime float32 engine and scored by `trtbuild eval`'s `evaluate` against the fp32 engine on the
shipped eval text. llama.cpp (`llama-cpp-python`, `make bench-install`): `llama_model_quantize`
requantizes the same GGUF into the nearest formats a llama.cpp user would pick (Q8_0: int8 in blocks
of 32; Q4_0: symmetric int4 in blocks of 32; Q4_K_M for reference, which on SmolLM2 falls back to 5-
and 8-bit blocks for most tensors: 576 is not a multiple of its 256-wide super-blocks), and "q8_0 KV"
runs the original with llama.cpp's int8 KV cache (blocks of 32 along head_dim, flash attention).
Each is scored against the Q4_1 original in llama.cpp (float16 KV cache), on the same token windows.

Printed per row: perplexity / its reference's perplexity, mean KL(reference || model) and top-1
agreement; and for each of our variants, its KL divided by that of the llama.cpp format it is paired
with (below 1: closer to its reference than llama.cpp's requantization is to its own).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from smollm2_quant import checkpoint, import_llama_cpp  # noqa: E402

# llama.cpp format -> its ftype constant's name in llama_cpp (None: the Q4_1 original itself)
LLAMA_FORMATS = {"Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "Q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
                 "Q4_K_M": "LLAMA_FTYPE_MOSTLY_Q4_K_M", "q8_0 KV": None}
# our variant -> the llama.cpp format of the same width and block
PAIRS = {"int8_wo": "Q8_0", "int8_wo_g32": "Q8_0", "int4_wo": "Q4_0", "int4_wo_g32": "Q4_0", "int4_awq": "Q4_0",
         "int4_awq_g32": "Q4_0", "int4_awq_g32_lm8": "Q4_0", "int4_awq_g32_lm4": "Q4_0",
         "int4_wo_g32_lm8": "Q4_0", "int4_wo_g32_lm4": "Q4_0", "fp32_kv8": "q8_0 KV",
         "gguf": None}  # the GGUF's own blocks: no llama.cpp requantization pairs with its Q4_1 original
DEFAULT_VARIANTS = ["int8_wo", "int8_wo_g32", "int4_wo_g32", "int4_awq", "int4_awq_g32", "fp32_kv8"]
GGML_TYPE_Q8_0 = 8  # llama.cpp's KV-cache type for "q8_0 KV": int8 in blocks of 32 along head_dim


def ours(work: Path, variants: list[str], max_tokens: int, context: int) -> dict[str, dict]:
    from engine_builder.build.pipeline import build
    from engine_builder.eval import evaluate
    from engine_builder.formats.build_config import BuildConfig, Limits

    limits = Limits(max_batch=4, max_input_len=64, max_seq_len=context)
    engines = {}
    for v in ["fp32", *variants]:
        engines[v] = work / f"engine-{v}-eval{context}"
        if not engines[v].exists():
            build(checkpoint(work, v), engines[v], BuildConfig(targets=("onnxruntime",), dtype="float32",
                                                                limits=limits))
    rows = {}
    for v in variants:
        r = evaluate(engines[v], reference=engines["fp32"], max_tokens=max_tokens, context=context,
                     backend="onnxruntime")
        rows[v] = {"ppl_ratio": r.ppl / r.reference_ppl, "kl": r.kl, "top1": r.top1_agreement}
    return rows


def llama_cpp_requantized(work: Path, max_tokens: int, context: int) -> dict[str, dict]:
    from engine_builder.eval.text import load_text, token_windows
    from engine_builder.runner.engine import EngineDir
    from engine_builder.util.bundled import smollm2_gguf

    lc = import_llama_cpp()
    source = smollm2_gguf()
    # the windows `evaluate` scores, from the same tokenizer (the fp32 engine's)
    tokenizer = EngineDir.load(work / f"engine-fp32-eval{context}").load_tokenizer()
    windows = token_windows(tokenizer, load_text(None), max_tokens, context)
    targets = np.concatenate([w[1:] for w in windows])  # [positions]

    def log_probs(path: Path, **kv_cache) -> np.ndarray:  # [positions, vocab]
        model = lc.Llama(model_path=str(path), n_ctx=context, logits_all=True, verbose=False, **kv_cache)
        scores = []
        for w in windows:
            model.reset()
            model.eval(w.tolist())
            scores.append(np.array(model.scores[:len(w) - 1], np.float32))
        x = np.concatenate(scores)
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    def ppl(lp: np.ndarray) -> float:
        return float(np.exp(-lp[np.arange(len(targets)), targets].mean()))

    reference = log_probs(source)
    rows = {}
    for name, ftype in LLAMA_FORMATS.items():
        path = work / f"smollm2-{name}.gguf" if ftype else source
        # a quantized V cache needs flash attention in llama.cpp
        kv_cache = {} if ftype else {"type_k": GGML_TYPE_Q8_0, "type_v": GGML_TYPE_Q8_0, "flash_attn": True}
        if not path.exists():
            params = lc.llama_model_quantize_default_params()
            params.ftype, params.allow_requantize = getattr(lc, ftype), True
            if lc.llama_model_quantize(str(source).encode(), str(path).encode(), ctypes.byref(params)):
                raise SystemExit(f"llama.cpp could not requantize {source} to {name}")
        lp = log_probs(path, **kv_cache)
        rows[name] = {"ppl_ratio": ppl(lp) / ppl(reference),
                      "kl": float((np.exp(reference) * (reference - lp)).sum(-1).mean()),
                      "top1": float((reference.argmax(-1) == lp.argmax(-1)).mean())}
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, choices=sorted(PAIRS))
    parser.add_argument("--work", type=Path, default=Path("build/bench-quant"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import_llama_cpp()

    args.work.mkdir(parents=True, exist_ok=True)
    rows = ours(args.work, args.variants, args.max_tokens, args.context)
    theirs = llama_cpp_requantized(args.work, args.max_tokens, args.context)
    for v, r in rows.items():
        if PAIRS[v] is not None:
            r["vs"] = PAIRS[v]
            r["kl_vs_llama_cpp"] = r["kl"] / theirs[PAIRS[v]]["kl"]
    if args.json:
        print(json.dumps({"max_tokens": args.max_tokens, "context": args.context, "ours": rows, "llama.cpp": theirs}))
        return
    print(f"SmolLM2-135M on the shipped eval text, {args.max_tokens} tokens in windows of {args.context}; "
          f"references: our fp32 engine / llama.cpp's Q4_1 original")
    print(f"{'':<17} {'ppl ratio':>9} {'KL':>8} {'top-1':>7}   KL vs llama.cpp")
    for name, r in {**rows, **{f"llama.cpp {k}": v for k, v in theirs.items()}}.items():
        versus = f"   {r['kl_vs_llama_cpp']:.2f}x {r['vs']}" if "vs" in r else ""
        print(f"{name:<17} {r['ppl_ratio']:>9.3f} {r['kl']:>8.4f} {r['top1']:>7.3f}{versus}")


if __name__ == "__main__":
    main()

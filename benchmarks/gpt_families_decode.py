"""GPT-2 and GPT-NeoX at real sizes: `LLM.generate` on the onnxruntime twin vs Hugging Face `generate`.

    .venv/bin/python benchmarks/gpt_families_decode.py [--families gpt2 gpt_neox] [--runs 3] [--new-tokens 64]
                                                       [--threads N] [--work build/bench-gpt] [--json]

Random weights (nothing is downloaded) in the shapes of GPT-2 small (124M: 12 layers, hidden 768, 12
heads, vocab 50257, 1024 learned positions) and Pythia-160M (GPT-NeoX: 12 layers, hidden 768, 12 heads,
vocab 50304, a quarter of each head rotary, parallel residual), float32 on CPU, batch 1, greedy, the
same 32-token prompt for both, --new-tokens generated (EOS ignored by us, suppressed by HF's
min_new_tokens). tok/s = generated tokens / wall time of the whole generate call (prefill included);
the contenders alternate every run, the figures are medians. Also printed: whether our greedy tokens
equal HF's (they must) and the largest |logit difference| of the prefill.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(vocab_size=50257, n_embd=768, n_layer=12, n_head=12,
                                                   n_positions=1024)),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(
        vocab_size=50304, hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
        max_position_embeddings=2048, rotary_pct=0.25, use_parallel_residual=True)),
}
PROMPT_TOKENS = 32


def prepare(family: str, work: Path, new_tokens: int) -> Path:
    """HF dir (random weights, a word-level tokenizer over its vocab), then its float32 onnxruntime engine."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    from converters.convert import convert
    from engine_builder.build.pipeline import build
    from engine_builder.formats.build_config import BuildConfig, Limits

    hf_dir, engine = work / family / "hf", work / family / "engine"
    if not hf_dir.exists():
        config_cls, model_cls, kwargs = SHAPES[family]
        torch.manual_seed(0)
        model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**kwargs)).eval()
        model.save_pretrained(hf_dir)
        vocab = kwargs["vocab_size"]
        tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0").save_pretrained(hf_dir)
    if not engine.exists():
        convert(hf_dir, work / family / "ckpt", dtype="float32", force=True)
        build(work / family / "ckpt", engine, BuildConfig(
            targets=("onnxruntime",), dtype="float32",
            limits=Limits(max_batch=1, max_input_len=PROMPT_TOKENS, max_seq_len=PROMPT_TOKENS + new_tokens)))
    return engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=sorted(SHAPES), choices=sorted(SHAPES))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for both (default: physical cores)")
    parser.add_argument("--work", type=Path, default=Path("build/bench-gpt"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from engine_builder.util.cpu_cores import physical_cores

    threads = args.threads or physical_cores()
    result: dict = {"threads": threads, "new_tokens": args.new_tokens, "runs": args.runs}
    for family in args.families:
        result[family] = measure(family, args, threads)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for family in args.families:
        r = result[family]
        print(f"{family}: {r['tok_s']:.1f} tok/s vs HF {r['hf_tok_s']:.1f} tok/s = {r['ratio_vs_hf']:.2f}x "
              f"(batch 1, {threads} threads); greedy tokens equal HF: {r['tokens_equal_hf']}; "
              f"prefill max |logit diff| {r['prefill_max_abs_logit_diff']:.1e}")


def measure(family: str, args: argparse.Namespace, threads: int) -> dict:
    import numpy as np
    import torch
    import transformers

    from engine_builder import LLM, SamplingParams

    torch.set_num_threads(threads)  # the same cores for both
    engine = prepare(family, args.work, args.new_tokens)
    hf = transformers.AutoModelForCausalLM.from_pretrained(args.work / family / "hf", dtype=torch.float32,
                                                           attn_implementation="eager").eval()
    prompt = np.random.default_rng(0).integers(3, SHAPES[family][2]["vocab_size"], PROMPT_TOKENS).tolist()
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=0, ignore_eos=True)

    def reference() -> tuple[float, list[int]]:
        started = time.perf_counter()
        with torch.inference_mode():
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=args.new_tokens,
                              min_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0)
        return args.new_tokens / (time.perf_counter() - started), out[0, PROMPT_TOKENS:].tolist()

    samples: dict[str, list[float]] = {"ours": [], "hf": []}
    with LLM(engine, backend="onnxruntime", threads=threads) as llm:
        def ours() -> tuple[float, list[int]]:
            started = time.perf_counter()
            out = llm.generate(prompt_token_ids=[prompt], params=params)[0]
            return args.new_tokens / (time.perf_counter() - started), list(out.token_ids)

        ours(), reference()  # warm-up: first-run allocations out of the figures
        for run in range(args.runs):
            tok_s, tokens = ours()
            hf_tok_s, hf_tokens = reference()
            samples["ours"].append(tok_s)
            samples["hf"].append(hf_tok_s)
            print(f"{family} run {run + 1}/{args.runs}: ours {tok_s:.1f} tok/s, HF {hf_tok_s:.1f} tok/s",
                  file=sys.stderr, flush=True)
    with torch.inference_mode():
        want = hf(torch.tensor([prompt])).logits[0, -1].numpy()
    first = prefill_logits(engine, prompt, threads)
    ours_tok_s, hf_tok_s = statistics.median(samples["ours"]), statistics.median(samples["hf"])
    return {"tok_s": round(ours_tok_s, 2), "hf_tok_s": round(hf_tok_s, 2),
            "ratio_vs_hf": round(ours_tok_s / hf_tok_s, 2), "tokens_equal_hf": tokens == hf_tokens,
            "prefill_max_abs_logit_diff": float(np.abs(first - want).max())}


def prefill_logits(engine: Path, prompt: list[int], threads: int):
    """The engine's last-position logits after the prompt, straight from model.onnx in onnxruntime."""
    import numpy as np
    import onnxruntime as ort

    from engine_builder.formats import graph_io as io

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(engine / "model.onnx"), options, providers=["CPUExecutionProvider"])
    feeds = {io.INPUT_IDS: np.array([prompt], np.int64),
             io.POSITION_IDS: np.arange(len(prompt), dtype=np.int64)[None, :],
             io.PAST_LENGTHS: np.zeros([1], np.int64)}
    for i in session.get_inputs():
        if i.name not in feeds:
            feeds[i.name] = np.zeros([1, *i.shape[1:]], np.float32)
    return session.run([io.LOGITS], feeds)[0][0, -1]


if __name__ == "__main__":
    main()

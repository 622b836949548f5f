"""Speculative decoding (engine_builder/runner/speculative/) against plain decoding and HF transformers.

    .venv/bin/python benchmarks/speculative.py [--runs 3] [--max-new-tokens 96] [--work DIR] [--json]
                                               [--parts copy,draft,worst] [--threads N]

SmolLM2-135M-Instruct, float32 onnxruntime twin, batch 1, greedy; wall time of a whole generate call
(prefill + decode), medians over --runs after one warm-up each. Every speculative run's tokens are
checked identical to the plain greedy tokens (the script fails otherwise).

  copy   a copy/edit task (the answer repeats the prompt's paragraph): plain, `--speculative ngram`, and
         HF transformers' `generate(prompt_lookup_num_tokens=10)` on the same weights (the GGUF dequantized
         to float32, as our checkpoint) and the same number of threads. Targets: ngram <= 0.5x plain,
         HF prompt lookup >= 1.5x ngram's time. Measured twice: forced to --max-new-tokens (ignore_eos: the
         answer, then made-up text after the model's end of turn), and "answer": until the end of turn.
  draft  free text (a story) with an int4 build of the same checkpoint (`convert --quant int4_wo`, or with
         --draft-quant gguf the GGUF's own Q4_1 blocks; gguf_draft: those with an int8 lm_head at int8
         activations) drafting for the float32 target; --draft-quant a,b times both drafts interleaved.
         Target: >= 1.5x.
  costs  what bounds the draft target: one target step, a verify step of w tokens and one draft step (in
         target steps), the draft's acceptance, and the best speed-up they allow (see step_costs).
  breakdown  where a k=4 story's wall time goes, per engine call kind and per loop function, beside plain
         decoding's (benchmarks/spec_breakdown.py).
  worst  a proposer whose drafts are never accepted (random token ids), adaptive draft length vs plain
         (target: <= 10 % slower), and a fixed 4 drafts per step for contrast.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

# the repo root ahead of benchmarks/ (whose passes.py would shadow the passes package)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

COPY_TEXT = ("The old lighthouse stood on the northern cliff for two hundred years. Every night its keeper "
             "climbed the narrow stairs, polished the great lens and lit the lamp, so that ships passing "
             "through the dark and dangerous strait could find their way home. When the keeper grew old, his "
             "daughter took over the work, and she kept the light burning through every storm for forty years.")
COPY_TASK = f"Repeat the following paragraph exactly, word for word:\n\n{COPY_TEXT}"
STORY_TASK = "Write a short story about a fox who finds a lost key in the forest."


# --draft-quant -> (engine dir name, `trtbuild convert` options, `trtbuild build --twin-accuracy`); the names
# of earlier runs' dirs are kept so --work reuses them
DRAFTS = {"int4_wo": ("int4", {"quant": "int4_wo", "group_size": 64}, "auto"),
          "gguf": ("int4-gguf", {"quant": "gguf"}, "auto"),
          # the int8 head with one scale per 32 inputs (the Q8_0 table's own blocks) since 2026-11-26; before, per
          # output channel in dir int4-gguf-draft
          "gguf_draft": ("int4-gguf-draft32", {"quant": "gguf", "lm_head": "int8"}, "draft"),
          "int8_wo": ("int8", {"quant": "int8_wo"}, "auto")}


def build_engines(work: Path, draft_quants: tuple[str, ...] = ("int4_wo",)) -> dict:
    """{"float32": the target's engine dir, "drafts": {draft quant: its engine dir}}, built once in WORK."""
    from converters.convert import convert
    from engine_builder.build.pipeline import build
    from engine_builder.formats.build_config import DEFAULT_PASSES, BuildConfig, Limits, PassLists
    from engine_builder.formats.twin_accuracy import with_twin_accuracy
    from engine_builder.util.bundled import smollm2_gguf

    limits = Limits(max_batch=1, max_input_len=512, max_seq_len=1024)
    out: dict = {"drafts": {}}
    for quant in ("none", *draft_quants):
        name, options, accuracy = DRAFTS[quant] if quant != "none" else ("float32", {}, "auto")
        ckpt, engine = work / f"ckpt-{name}", work / f"engine-{name}"
        if not ckpt.exists():
            convert(smollm2_gguf(), ckpt, dtype="float32", **options)
        if not engine.exists():
            passes = PassLists(onnxruntime=with_twin_accuracy(DEFAULT_PASSES["onnxruntime"], accuracy))
            build(ckpt, engine, BuildConfig(targets=("onnxruntime",), dtype="float32", limits=limits, passes=passes))
        if quant == "none":
            out["float32"] = engine
        else:
            out["drafts"][quant] = engine
    return out


def timed(fns: dict, runs: int) -> dict[str, tuple[float, object]]:
    """Median seconds of each fn over RUNS runs after one warm-up each, and its last result. The runs
    interleave (a, b, c, a, b, c...) so a change in the machine's load hits every contender alike."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    results: dict[str, object] = {}
    for _ in range(runs):
        for name, fn in fns.items():
            started = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - started)
    return {name: (statistics.median(times[name]), results[name]) for name in fns}


def ours(llm, ids: list[int], max_new_tokens: int, ignore_eos: bool = True):
    from engine_builder import SamplingParams

    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0, ignore_eos=ignore_eos)
    return lambda: llm.generate(prompt_token_ids=[ids], params=params)[0]


def copy_task(engines, runs: int, max_new_tokens: int, threads: int) -> dict:
    import torch
    import transformers

    from engine_builder import LLM
    from engine_builder.util.bundled import smollm2_gguf

    plain = LLM(engines["float32"], threads=threads)
    spec = LLM(engines["float32"], threads=threads, speculative="ngram")
    ids = plain.encode_chat([{"role": "user", "content": COPY_TASK}])

    torch.set_num_threads(threads)
    gguf = smollm2_gguf()
    model = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                              dtype=torch.float32).eval()
    inputs = torch.tensor([ids])

    def hf(forced: bool = True, **kw):
        def run():
            with torch.no_grad():
                return model.generate(inputs, attention_mask=torch.ones_like(inputs), do_sample=False,
                                      max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens if forced else 0,
                                      pad_token_id=0, **kw)[0, len(ids):].tolist()
        return run

    # forced: exactly max_new_tokens (ignore_eos): the model's answer, then whatever it makes up after its
    # end-of-turn token; answer: until that token, i.e. the copy itself (the task a user runs)
    r = timed({"plain": ours(plain, ids, max_new_tokens), "ngram": ours(spec, ids, max_new_tokens),
               "hf_lookup": hf(prompt_lookup_num_tokens=10), "hf": hf()}, runs)
    (t_plain, want), (t_spec, got) = r["plain"], r["ngram"]
    assert got.token_ids == want.token_ids, "ngram speculation changed the greedy tokens"
    t_hf_lookup, hf_tokens = r["hf_lookup"]
    out = {"prompt_tokens": len(ids), "new_tokens": len(want.token_ids), "plain_s": t_plain, "ngram_s": t_spec,
           "hf_prompt_lookup_s": t_hf_lookup, "hf_greedy_s": r["hf"][0], "ngram_vs_plain": t_spec / t_plain,
           "hf_prompt_lookup_vs_ngram": t_hf_lookup / t_spec,
           "hf_tokens_equal_ours": hf_tokens == list(want.token_ids),
           "speculative": spec.speculation.stats.to_json(), "text": want.text[:120]}
    a = timed({"plain": ours(plain, ids, max_new_tokens, ignore_eos=False),
               "ngram": ours(spec, ids, max_new_tokens, ignore_eos=False),
               "hf_lookup": hf(False, prompt_lookup_num_tokens=10)}, runs)
    (t_plain, want), (t_spec, got) = a["plain"], a["ngram"]
    assert got.token_ids == want.token_ids, "ngram speculation changed the greedy tokens"
    out["answer"] = {"new_tokens": len(want.token_ids), "plain_s": t_plain, "ngram_s": t_spec,
                     "hf_prompt_lookup_s": a["hf_lookup"][0], "ngram_vs_plain": t_spec / t_plain,
                     "hf_prompt_lookup_vs_ngram": a["hf_lookup"][0] / t_spec,
                     "speculative": spec.speculation.stats.to_json()}
    return out


def draft_task(engines, runs: int, max_new_tokens: int, threads: int) -> dict:
    from engine_builder import LLM
    from engine_builder.runner.speculative import SpeculativeConfig

    plain = LLM(engines["float32"], threads=threads)
    ids = plain.encode_chat([{"role": "user", "content": STORY_TASK}])
    specs, fns = {}, {"plain": ours(plain, ids, max_new_tokens)}
    for quant, engine in engines["drafts"].items():  # every draft interleaved with plain and the others
        fns[f"{quant}/draft_alone"] = ours(LLM(engine, threads=threads), ids, max_new_tokens)
        for label, k in (("adaptive", None), ("k4", 4), ("k11", 11)):
            specs[quant, label] = llm = LLM(engines["float32"], threads=threads, speculative=SpeculativeConfig(
                "draft", draft_engine=str(engine), num_draft_tokens=k))
            fns[f"{quant}/{label}"] = ours(llm, ids, max_new_tokens)
    r = timed(fns, runs)
    t_plain, want = r["plain"]
    out = {"prompt_tokens": len(ids), "new_tokens": len(want.token_ids), "plain_s": t_plain, "text": want.text[:120]}
    for quant in engines["drafts"]:
        row = out[quant] = {"draft_alone_s": r[f"{quant}/draft_alone"][0]}
        for label in ("adaptive", "k4", "k11"):
            t_spec, got = r[f"{quant}/{label}"]
            assert got.token_ids == want.token_ids, f"{quant} draft speculation changed the greedy tokens"
            row[f"draft_{label}_s"] = t_spec
            row[f"speedup_{label}"] = t_plain / t_spec
            row[f"speculative_{label}"] = specs[quant, label].speculation.stats.to_json()
    return out


def step_costs(engines, runs: int, max_new_tokens: int, threads: int) -> dict:
    """What bounds the draft speed-up: the seconds of one target step (t1), of a target verify step of w
    tokens, and of one draft step, measured interleaved at the story's context length; the draft's
    acceptance on the story (k=4); and the best decode speed-up those allow, max over k of
    E[tokens | alpha, k] / (k * draft + verify(k + 1)) in plain steps, with E = (1 - alpha^(k+1)) / (1 - alpha)
    (the geometric model; drafting and verifying share the machine's cores, so they cannot overlap)."""
    import numpy as np

    from engine_builder import LLM
    from engine_builder.runner.ort_spinning import sessions_take_turns
    from engine_builder.runner.speculative import SpeculativeConfig

    with sessions_take_turns():  # as a speculative LLM opens them: their calls interleave here too
        llms = {"target": LLM(engines["float32"], threads=threads),
                **{quant: LLM(engine, threads=threads) for quant, engine in engines["drafts"].items()}}
    ids = llms["target"].encode_chat([{"role": "user", "content": STORY_TASK}])
    slots = {}
    for name, llm in llms.items():
        slots[name] = slot = llm.backend.kv.allocate(0, len(ids), max_new_tokens + 16)
        llm.backend.step(slot, np.asarray([ids], np.int64))
        llm.backend.kv.advance(slot, len(ids))
    shapes = [("target", w) for w in (1, 2, 3, 5, 8, 12, 16)] + [(quant, 1) for quant in engines["drafts"]]
    times: dict[tuple[str, int], list[float]] = {shape: [] for shape in shapes}
    for _ in range(max(5, 4 * runs)):
        for name, w in shapes:
            backend = llms[name].backend
            backend.bind(slots[name], np.full((1, w), 500, np.int64))  # written past the length: never kept
            started = time.perf_counter()
            backend.execute()
            times[name, w].append(time.perf_counter() - started)
    med = {shape: statistics.median(t) for shape, t in times.items()}
    t1 = med["target", 1]
    verify = {w: med["target", w] / t1 for (name, w) in shapes if name == "target"}
    out: dict = {"t1_ms": round(t1 * 1e3, 1), "verify_in_t1": {w: round(v, 2) for w, v in verify.items()}}
    for quant, engine in engines["drafts"].items():
        c = med[quant, 1] / t1
        spec = LLM(engines["float32"], threads=threads,
                   speculative=SpeculativeConfig("draft", draft_engine=str(engine), num_draft_tokens=4))
        ours(spec, ids, max_new_tokens)()
        alpha = spec.speculation.stats.to_json()["acceptance_rate"]

        def best(a: float, c: float = c) -> tuple[int, float]:
            rates = {k: (k + 1 if a >= 1 else (1 - a ** (k + 1)) / (1 - a)) / (k * c + verify[k + 1])
                     for k in (1, 2, 4, 7, 11, 15) if k + 1 in verify}
            k = max(rates, key=rates.get)
            return k, rates[k]

        k, speedup = best(alpha)
        out[quant] = {"draft_step_in_t1": round(c, 3), "draft_acceptance_k4": alpha, "best_k": k,
                      "best_decode_speedup": round(speedup, 2),
                      "best_speedup_if_every_draft_accepted": round(best(1.0)[1], 2)}
    out["draft_step_in_t1_needed_for_1.5x_at_full_acceptance"] = round(
        max(((k + 1) / 1.5 - verify[k + 1]) / k for k in (4, 7, 11, 15)), 3)
    return out


class NeverAccepted:
    """Drafts random token ids: with 49152 of them, practically never the target's token."""

    name = "never"

    def __init__(self) -> None:
        import numpy as np

        self._rng = np.random.default_rng(0)

    def propose(self, request, k: int):
        from engine_builder.runner.speculative import Proposal

        return Proposal(tuple(int(t) for t in self._rng.integers(1000, 40000, k)))

    def release(self, request) -> None:
        pass

    def close(self) -> None:
        pass


def worst_case(engines, runs: int, max_new_tokens: int, threads: int) -> dict:
    from engine_builder import LLM
    from engine_builder.runner.speculative import SpeculativeConfig, SpeculativeDecode

    plain = LLM(engines["float32"], threads=threads)
    ids = plain.encode_chat([{"role": "user", "content": STORY_TASK}])
    never = {}
    for label, k in (("adaptive", None), ("k4", 4)):
        llm = never[label] = LLM(engines["float32"], threads=threads)
        llm.generator.decoding = SpeculativeDecode(llm.backend, config=SpeculativeConfig("ngram", num_draft_tokens=k),
                                                   proposer=NeverAccepted())
    r = timed({"plain": ours(plain, ids, max_new_tokens),
               **{label: ours(llm, ids, max_new_tokens) for label, llm in never.items()}}, runs)
    t_plain, want = r["plain"]
    out = {"plain_s": t_plain}
    for label, llm in never.items():
        t_spec, got = r[label]
        assert got.token_ids == want.token_ids, "rejected drafts changed the greedy tokens"
        out[f"{label}_s"] = t_spec
        out[f"{label}_vs_plain"] = t_spec / t_plain
        out[f"speculative_{label}"] = llm.speculation.stats.to_json()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--work", type=Path, default=Path("/tmp/trtbuild-bench-speculative"))
    parser.add_argument("--parts", default="copy,draft,worst")
    parser.add_argument("--threads", type=int, default=None, help="onnxruntime and torch threads (default: cores)")
    parser.add_argument("--draft-quant", default="int4_wo",
                        help="the drafts, comma-separated (each timed interleaved with the others): int4_wo "
                             "(re-quantized, RTN, group 64), gguf (the GGUF's own Q4_1 blocks: the float32 target's "
                             "exact weights, in int4; onnxruntime computes them with float activations), gguf_draft "
                             "(the same blocks with an int8 lm_head, `convert --quant gguf --lm-head int8`, built "
                             "with `--twin-accuracy draft`: int8 activations) or int8_wo (per channel, int8 "
                             "activations)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from engine_builder.util.cpu_cores import physical_cores

    threads = args.threads or physical_cores()
    args.work.mkdir(parents=True, exist_ok=True)
    drafts = tuple(args.draft_quant.split(","))
    if bad := [q for q in drafts if q not in DRAFTS]:
        parser.error(f"--draft-quant {','.join(bad)}: choose from {', '.join(DRAFTS)}")
    engines = build_engines(args.work, drafts)
    from spec_breakdown import breakdown, print_table
    from spin_policy import same_spinning

    parts = {"copy": copy_task, "draft": draft_task, "worst": worst_case, "costs": step_costs, "breakdown": breakdown}
    results = {"threads": threads, "runs": args.runs, "max_new_tokens": args.max_new_tokens}
    for name in args.parts.split(","):
        # timed() interleaves the systems: each session gets one spinning decision and stops spinning when its Run
        # returns, as a speculative target's and draft's do, so a system that just ran does not spin on the next
        # one's cores. Plain decoding loses nothing by it: float32 step 17.6-17.8 ms either way (2-core machine,
        # blocks of 40 steps of two sessions of one engine alternating)
        with same_spinning(threads):
            results[name] = parts[name](engines, args.runs, args.max_new_tokens, threads)
        if not args.json and name == "breakdown":
            print_table(results[name])
        elif not args.json:
            print(name, json.dumps(results[name], indent=1), flush=True)
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()

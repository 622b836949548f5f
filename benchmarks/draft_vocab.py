"""Would a draft head over the first N token ids pay? (FR-Spec / EAGLE-3's reduced draft vocabulary.)

    .venv/bin/python benchmarks/draft_vocab.py [--work DIR] [--sizes 8192,16384,32768] [--threads 2] [--json]

A draft whose lm_head keeps only rows [0, N) reads N / vocab of the head's bytes per token, but can never
propose an id >= N. BPE ids roughly follow merge order, so the first N should be the frequent ones; this
script measures, on SmolLM2-135M-Instruct (benchmarks/speculative.py's engines, built in --work):

  share    of the float32 target's greedy story tokens (benchmarks/speculative.py's story, 96 and 200 tokens)
           and of the shipped eval text's tokens that are >= N: tokens such a draft always gets wrong;
  accept   the acceptance of the gguf_draft at k=4 on the story with its logits cut to the first N: exactly
           what a head of N rows would propose (each row of the int8 head is its own dot product), so no
           reduced engine is needed to know it;
  head     the share of one draft step's kernel time in the lm_head's MatMulNBits (onnxruntime profiler):
           the most any N can save (a head of N rows saves about head * (1 - N / vocab)).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.append(str(Path(__file__).resolve().parent))  # speculative.py; after the root (benchmarks/passes.py)


def head_share(engine: Path, threads: int, tokens: int = 48) -> float:
    """The lm_head MatMulNBits node's share of the kernel time of ENGINE's decode steps."""
    import onnx
    from ort_op_profile import profiled_llm

    from engine_builder import SamplingParams

    graph = onnx.load(str(engine / "model.onnx"), load_external_data=False).graph
    head = next(n.name for n in graph.node if n.op_type == "MatMulNBits" and n.input[1].startswith("lm_head"))
    llm = profiled_llm(engine, threads)
    llm.generate(prompt_token_ids=[llm.encode("The capital of France is")],
                 params=SamplingParams(max_new_tokens=tokens, temperature=0.0, ignore_eos=True))
    path = Path(llm.backend.session.end_profiling())
    events = json.loads(path.read_text())
    path.unlink()
    first = [e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"][1]["ts"]
    times: dict[bool, float] = collections.defaultdict(float)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= first:
            times[e["name"].removesuffix("_kernel_time") == head] += e["dur"]
    return times[True] / (times[True] + times[False])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/trtbuild-bench-speculative"))
    parser.add_argument("--sizes", default="8192,16384,32768")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import numpy as np
    from speculative import STORY_TASK, build_engines

    from engine_builder import LLM, SamplingParams
    from engine_builder.eval.text import load_text
    from engine_builder.runner.speculative import SpeculativeConfig

    args.work.mkdir(parents=True, exist_ok=True)
    engines = build_engines(args.work, ("gguf_draft",))
    target, draft = engines["float32"], engines["drafts"]["gguf_draft"]
    plain = LLM(target, threads=args.threads)
    ids = plain.encode_chat([{"role": "user", "content": STORY_TASK}])
    story = plain.generate(prompt_token_ids=[ids], params=SamplingParams(max_new_tokens=200, temperature=0,
                                                                         ignore_eos=True))[0].token_ids
    text = np.asarray(plain.tokenizer(load_text(None).text).input_ids)
    vocab = plain.backend.vocab_size
    out: dict = {"vocab": vocab, "story_tokens": len(story), "eval_text_tokens": int(text.size), "sizes": {}}
    for n in [vocab, *map(int, args.sizes.split(","))]:
        spec = LLM(target, threads=args.threads, speculative=SpeculativeConfig("draft", draft_engine=str(draft),
                                                                              num_draft_tokens=4))
        if n < vocab:  # the draft's logits cut to ids [0, N): what a head of N rows computes
            backend = spec.generator.proposer.backend
            step = backend.step
            backend.step = lambda *a, _step=step, _n=n, **kw: _step(*a, **kw)[..., :_n]
        spec.generate(prompt_token_ids=[ids], params=SamplingParams(max_new_tokens=96, temperature=0,
                                                                    ignore_eos=True))
        out["sizes"][n] = {"story_96_share_ge_n": round(float(np.mean(np.asarray(story[:96]) >= n)), 3),
                           "story_200_share_ge_n": round(float(np.mean(np.asarray(story) >= n)), 3),
                           "eval_text_share_ge_n": round(float(np.mean(text >= n)), 3),
                           "acceptance_k4": spec.generator.stats.to_json()["acceptance_rate"]}
    out["head_share_of_draft_step"] = round(head_share(draft, args.threads), 3)
    print(json.dumps(out) if args.json else json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

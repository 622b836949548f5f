"""The Python API: LLM(engine_dir).generate and .chat with SamplingParams.

Shows a batch of raw-text prompts (greedy and seeded sampling side by side, a stop string) and a chat turn,
printing each answer's text and why it ended (finish_reason "stop": EOS or a stop string; "length":
max_new_tokens reached).

    make demo                                          # builds build/demo/smollm2-engine
    .venv/bin/python examples/python_api.py build/demo/smollm2-engine
    .venv/bin/python examples/python_api.py ENGINE_DIR --max-new-tokens 64 --backend onnxruntime
"""

import argparse

from engine_builder import LLM, SamplingParams

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("engine_dir", help="an engine dir from `trtbuild build`")
parser.add_argument("--max-new-tokens", type=int, default=32)
parser.add_argument("--backend", default="auto", help="auto | tensorrt | torch | onnxruntime")
args = parser.parse_args()

with LLM(args.engine_dir, backend=args.backend) as llm:
    print(f"# {llm.engine.path.name}")
    # generate: raw text (completion), one SamplingParams per prompt, or one for all of them
    prompts = ["The capital of France is", "Once upon a time", "1, 2, 3, 4,"]
    params = [SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0),            # greedy
              SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.8, top_p=0.95, seed=7),
              SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0, stop=("10",))]
    for out in llm.generate(prompts, params):
        print(f"generate {out.prompt!r} -> {out.text!r}")
        print(f"  finish_reason={out.finish_reason} stop_reason={out.stop_reason!r} tokens={len(out.token_ids)}")

    # chat: the model's chat template over the messages; default_params starts from generation_config.json
    messages = [{"role": "system", "content": "You answer in one short sentence."},
                {"role": "user", "content": "What is the capital of France?"}]
    out = llm.chat(messages, llm.default_params(max_new_tokens=args.max_new_tokens, temperature=0))[0]
    print(f"chat -> {out.text!r}")
    print(f"  finish_reason={out.finish_reason} tokens={len(out.token_ids)}")

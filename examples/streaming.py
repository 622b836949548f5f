"""Streaming: LLM.stream (raw text) and LLM.stream_chat (a chat turn) yield text deltas as they are decoded.

Each delta is printed the moment it arrives: the text of the tokens decoded since the last one (a multi-byte
character split over tokens is held back until it is whole, never printed broken). After the loop the stream holds
the whole RequestOutput (`.output`) and its timings; leaving the loop early (break) stops generation and
frees the KV slot.

    .venv/bin/python examples/streaming.py build/demo/smollm2-engine
    .venv/bin/python examples/streaming.py ENGINE_DIR --prompt "Write a haiku about GPUs." --max-new-tokens 64
"""

import argparse
import sys
import time

from engine_builder import LLM, SamplingParams

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("engine_dir", help="an engine dir from `trtbuild build`")
parser.add_argument("--prompt", default="What is the capital of France?")
parser.add_argument("--max-new-tokens", type=int, default=48)
parser.add_argument("--no-chat", action="store_true", help="feed the prompt as raw text (LLM.stream)")
args = parser.parse_args()

with LLM(args.engine_dir) as llm:
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0)
    if args.no_chat:
        stream = llm.stream(args.prompt, params)
    else:
        stream = llm.stream_chat([{"role": "user", "content": args.prompt}], params)
    start, deltas = time.perf_counter(), 0
    with stream:
        for delta in stream:
            deltas += 1
            print(delta, end="", flush=True)
    elapsed = time.perf_counter() - start
    out = stream.output
    print()
    print(f"[{deltas} deltas, {len(out.token_ids)} tokens in {elapsed:.2f} s, finish_reason={out.finish_reason}]",
          file=sys.stderr)

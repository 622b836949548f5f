"""One rank of a tp/pp engine under torchrun, for test_parallel_ranks.py: rank 0 generates a batch of prompts
with LLM.generate (several rows per step: pipeline micro-batches) and prints their token ids as JSON; the
other ranks follow it.

    torchrun --nproc-per-node N tests/runner/tp_generate_script.py ENGINE_DIR MAX_NEW_TOKENS PROMPT...
"""

from __future__ import annotations

import json
import os
import sys

from engine_builder.runner.llm import LLM
from engine_builder.runner.parallel.worker import follow
from engine_builder.runner.sampling_params import SamplingParams


def main(engine_dir: str, max_new_tokens: str, *prompts: str) -> None:
    if os.environ["RANK"] != "0":
        follow(engine_dir)
        return
    llm = LLM(engine_dir)
    try:
        outs = llm.generate(list(prompts), SamplingParams(max_new_tokens=int(max_new_tokens), ignore_eos=True))
        print(json.dumps({"token_ids": [o.token_ids for o in outs], "backend_reason": llm.backend_reason}))
    finally:
        llm.close()


if __name__ == "__main__":
    main(*sys.argv[1:])

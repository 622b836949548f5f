"""`trtbuild serve` of a tp=2 engine: one command spawns both ranks, rank 0 serves the OpenAI and TGI routes
with transformers' greedy tokens, and SIGTERM stops every rank cleanly."""

from __future__ import annotations

import shutil

import httpx
import torch
import transformers
from live_server import live_server
from runner_engines import add_word_tokenizer

from converters.convert import convert
from engine_builder.build.parallel_build import build_parallel
from engine_builder.formats.build_config import BuildConfig, Limits

PROMPT = "w5 w9 w7 w3"


def test_tp2_serve_matches_hf(tiny_model_dir, tmp_path):
    hf = tmp_path / "hf"
    shutil.copytree(tiny_model_dir("llama"), hf)
    add_word_tokenizer(hf, 320)
    convert(hf, tmp_path / "ckpt", dtype="float32", tp=2)
    build_parallel(tmp_path / "ckpt", tmp_path / "engine",
                   BuildConfig(targets=("onnxruntime",), dtype="float32",
                               limits=Limits(max_batch=2, max_input_len=16, max_seq_len=32)))
    model = transformers.AutoModelForCausalLM.from_pretrained(hf).eval()
    tok = transformers.AutoTokenizer.from_pretrained(hf)
    ids = tok(PROMPT, return_tensors="pt").input_ids
    start = ids.shape[1]
    with torch.no_grad():
        for _ in range(6):
            ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert 2 not in ids[0, start:].tolist()  # no EOS: the server returns all 6 tokens
    expected = tok.decode(ids[0, start:]).strip()

    with live_server(tmp_path / "engine") as server:
        openai = httpx.post(f"{server.url}/v1/completions", timeout=60,
                            json={"prompt": PROMPT, "max_tokens": 6, "temperature": 0}).json()
        tgi = httpx.post(f"{server.url}/generate", timeout=60,
                         json={"inputs": PROMPT, "parameters": {"max_new_tokens": 6}}).json()
    assert openai["choices"][0]["text"].strip() == expected
    assert tgi["generated_text"].strip() == expected

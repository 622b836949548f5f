"""An int8 KV cache (`convert --kv-cache int8`) through the graph, the onnxruntime lowering and the runner.

The reference is Hugging Face transformers with the same cache: keys (after rotary) and values rounded
to their layer's per-channel int8 grid as they are cached (tests/engine_builder/kv_int8.py). Scales
come from another prompt than the one scored, so some values saturate, as at inference.
"""

from __future__ import annotations

import json

import numpy as np
import onnx_ir as ir
import pytest
from cli_process import trtbuild
from hf_reference import hf_greedy, prompt_of
from kv_int8 import hf_cache_absmax, hf_greedy_int8_cache, with_int8_kv_cache
from ort_helpers import OrtDecoder
from runner_engines import add_word_tokenizer

from engine_builder import LLM, SamplingParams
from engine_builder.build.pipeline import build
from engine_builder.formats.build_config import BuildConfig, Limits
from engine_builder.formats.checkpoint import CheckpointConfig
from engine_builder.network import NetworkOptions, write_onnx

TOL = 1e-4
STEPS = 17
ARCHS = ["llama", "qwen3", "gemma2"]  # GQA heads; q/k norms; sliding windows and soft-capping


@pytest.fixture(scope="module")
def int8_ckpt(model_dir, checkpoint_dir, module_tmp_factory):
    made = {}

    def get(name: str):
        if name not in made:
            scales = {k: v / 127 for k, v in hf_cache_absmax(model_dir(name), prompt_of(40, seed=1)).items()}
            made[name] = with_int8_kv_cache(checkpoint_dir(name), module_tmp_factory.mktemp(name) / "ckpt", scales), \
                scales
        return made[name]

    return get


@pytest.mark.parametrize("name", ARCHS)
def test_unfused_graph_matches_hf_with_an_int8_cache(int8_ckpt, model_dir, tmp_path, name):
    ckpt, scales = int8_ckpt(name)
    path = write_onnx(ckpt, tmp_path / "onnx", NetworkOptions(max_seq_len=64))
    model = ir.load(path)
    assert {v.dtype for v in model.graph.inputs if v.name.startswith(("past_key", "past_value"))} == {ir.DataType.INT8}
    prompt = prompt_of(20)
    want_tokens, want_logits = hf_greedy_int8_cache(model_dir(name), prompt, STEPS, scales)
    tokens, logits = OrtDecoder(path).greedy(prompt, STEPS)
    errors = [float(np.abs(got - want).max()) for got, want in zip(logits, want_logits)]
    assert max(errors) <= TOL, errors
    assert tokens == want_tokens
    # the cache's rounding is visible: the float cache's logits are far outside the tolerance
    float_logits = hf_greedy(model_dir(name), prompt, STEPS)[1]
    assert max(float(np.abs(a - b).max()) for a, b in zip(float_logits, want_logits)) > 10 * TOL


def test_runner_generates_on_an_int8_cache_as_hf_does(int8_ckpt, model_dir, tmp_path):
    """`trtbuild build --target onnxruntime --dtype float32` with the default passes (GroupQueryAttention
    over the int8 buffers) and LLM.generate: a ragged batch of two, each equal to HF's greedy tokens."""
    ckpt, scales = int8_ckpt("llama")
    add_word_tokenizer(ckpt, CheckpointConfig.load(ckpt).model.vocab_size)  # LLM wants one; ids are fed here
    out = tmp_path / "engine"
    build(ckpt, out, BuildConfig(targets=("onnxruntime",), dtype="float32",
                                 limits=Limits(max_batch=2, max_input_len=32, max_seq_len=64)))
    manifest = json.loads((out / "config.json").read_text())
    assert manifest["quantization"]["kv_cache"] == "int8"
    assert {r["name"]: r["matches"] for r in manifest["passes"]["onnxruntime"]}["lower_ort_attention"] == 2
    prompts = [prompt_of(20), prompt_of(9, seed=3)]
    llm = LLM(out, backend="onnxruntime")
    outputs = llm.generate(params=SamplingParams(max_new_tokens=12, temperature=0, ignore_eos=True),
                           prompt_token_ids=prompts)
    for prompt, output in zip(prompts, outputs):
        assert list(output.token_ids) == hf_greedy_int8_cache(model_dir("llama"), prompt, 12, scales)[0]
    assert llm.backend.kv.keys[0].dtype == np.int8  # a quarter of the float32 cache's bytes
    info = trtbuild("inspect", out, "--json")
    assert info.returncode == 0, info.stderr
    quant = json.loads(info.stdout)["quantization"]
    assert (quant["scheme"], quant["kv_cache"], quant["onnxruntime_accuracy_level"]) == ("none", "int8", None)
    assert "KV cache int8" in trtbuild("inspect", out).stdout

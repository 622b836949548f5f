"""fused_decode.py: the llama-shaped layer as six launches, against the model's own layer.

Tiny random models of the families it takes (llama with llama3 rope, tied llama with head_dim 32, mistral's
window, qwen2's qkv bias and window, phi3's partial longrope rotary, qwen3's q/k norms), converted as
`trtbuild convert` does, run on the CPU under Triton's interpreter (a child process: tests/triton_interpreter.py
says why): a 12-token prefill, a ragged step of a second prompt beside the first one's decode, then decode steps,
each through FusedDecode and through the model's layer on pools of their own. The logits agree to float rounding
(in bfloat16 they were equal) and the greedy tokens are the same. Through LLM the runtime sends its steps of few
tokens there, with the same tokens and logprobs. The families it refuses say why. Runtime on 2 shared cores:
about 70 s.
"""

from __future__ import annotations

import types

import pytest
import transformers
from triton_interpreter import report_cases, run_interpreted

triton = pytest.importorskip("triton", reason="triton is not installed (the `test` extra brings it)")

CASES: dict[str, dict] = {
    "llama_f32": dict(family="llama", dtype="float32"),
    "llama_tied_bf16": dict(family="llama_tied", dtype="bfloat16"),
    "mistral_bf16": dict(family="mistral", dtype="bfloat16"),
    "qwen2_f32": dict(family="qwen2", dtype="float32"),
    "qwen2_bf16": dict(family="qwen2", dtype="bfloat16"),
    "phi3_f32": dict(family="phi3", dtype="float32"),
    "qwen3_bf16": dict(family="qwen3", dtype="bfloat16"),
}
PROMPT, SECOND, STEPS = 12, 5, 6
TOL = 1e-4  # float32, relative to the logits' scale: test_torch_model.py's agreement with transformers


def run_case(spec: dict, seed: int, device: str = "cpu") -> dict:
    import tempfile
    from pathlib import Path

    import numpy as np
    import torch
    from paged_run import PagedRun
    from tiny_models import make_tiny_model

    from converters.convert import convert
    from engine_builder.runner.torch_backend.fused_decode import FusedDecode, unsupported
    from engine_builder.runner.torch_backend.model import TorchDecoder

    with tempfile.TemporaryDirectory() as tmp:
        convert(make_tiny_model(spec["family"], Path(tmp) / "hf"), Path(tmp) / "ckpt")
        model = TorchDecoder.from_dir(Path(tmp) / "ckpt", device=device, dtype=getattr(torch, spec["dtype"]))
    assert unsupported(model) is None, unsupported(model)
    runs = {"eager": PagedRun(model, seed=seed), "fused": PagedRun(model, seed=seed, forward=FusedDecode(model))}
    rng = np.random.default_rng(seed)
    first, second = (rng.integers(3, 317, n).tolist() for n in (PROMPT, SECOND))
    steps = [{"a": first}, {"a": None, "b": second}] + [{"a": None, "b": None}] * STEPS
    tokens = {"eager": {}, "fused": {}}
    worst = 0.0
    for chunks in steps:
        got = {}
        for way, run in runs.items():
            feed = {name: ids if ids is not None else tokens[way][name][-1:] for name, ids in chunks.items()}
            got[way] = run.step(feed)
            for name, logits in got[way].items():
                tokens[way].setdefault(name, []).append(int(logits[-1].argmax()))
        for name in chunks:
            want = got["eager"][name].float()
            err = float((got["fused"][name].float() - want).abs().max()) / max(1.0, float(want.abs().max()))
            worst = max(worst, err)
    return {"worst_rel": worst, "tokens_equal": tokens["eager"] == tokens["fused"], "tokens": tokens["fused"]}


# through LLM: a batch of ragged prompts (a 26-token prefill, then steps of 3 tokens), seeded sampling with
# logprobs, and ngram speculation (verify steps of k + 1 tokens) on a repetitive prompt
LLM_PROMPTS = [[1, 5, 9, 33, 7], [1, 8, 100, *range(3, 19)], [1, 2]]
REPEATS = [1, *[5, 6, 7, 8] * 4]


def llm_case(engine: str) -> dict:
    """The tiny engine through LLM(backend="torch") with TRTBUILD_FUSED_DECODE off, then on: what each generated,
    and how many steps the fused model ran."""
    import os

    from engine_builder import LLM, SamplingParams

    class Counting:
        def __init__(self, model):
            self.model, self.steps = model, 0

        def __call__(self, *args, **kwargs):
            self.steps += 1
            return self.model(*args, **kwargs)

    greedy = SamplingParams(max_new_tokens=8, ignore_eos=True, temperature=0.0)
    sampled = SamplingParams(max_new_tokens=8, ignore_eos=True, temperature=1.0, seed=3, logprobs=2)
    got = {}
    for mode in ("off", "on"):
        os.environ["TRTBUILD_FUSED_DECODE"] = mode
        out, steps = {}, 0
        for speculative in (None, "ngram"):
            llm = LLM(engine, backend="torch", speculative=speculative)
            fused = llm.backend.fused.model
            assert (fused is not None) == (mode == "on"), mode
            if fused is not None:
                llm.backend.fused.model = Counting(fused)
            if speculative is None:
                out["greedy"] = [list(o.token_ids) for o in llm.generate(prompt_token_ids=LLM_PROMPTS, params=greedy)]
                one = llm.generate(prompt_token_ids=LLM_PROMPTS[:1], params=sampled)[0]
                out["sampled"] = [list(one.token_ids), [round(lp.logprob, 4) for lp in one.logprobs]]
            else:
                out["ngram"] = list(llm.generate(prompt_token_ids=[REPEATS], params=greedy)[0].token_ids)
            steps += llm.backend.fused.model.steps if fused is not None else 0
            llm.close()
        got[mode] = {**out, "fused_steps": steps}
    return got


def child_main() -> None:
    import json
    import sys

    from engine_builder.runner.torch_backend import decode_linear_triton as dl
    from engine_builder.runner.torch_backend.paged_attention_triton import patch_triton_interpreter

    if len(sys.argv) > 1:  # an engine dir: the LLM case
        patch_triton_interpreter()
        print(json.dumps(llm_case(sys.argv[1])))
        return
    report_cases(dl._decode_linear_kernel, CASES, run_case)


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_interpreted(__file__)


def test_llm_steps_through_the_fused_layers_with_the_same_tokens_in_interpreter(tiny_engine):
    """The runtime's dispatch (run_model): steps of at most 16 tokens through the fused model, the rest through the
    model; greedy, seeded sampling and ngram speculation give what they give without it."""
    engine, _ = tiny_engine("llama")
    got = run_interpreted(__file__, str(engine))
    # every step: the batch's 26-token prefill and 7 decode steps, the sampled prompt's prefill and 7 decode steps,
    # the ngram prompt's prefill and its verify steps (as many as the drafts make)
    assert got["off"]["fused_steps"] == 0 and got["on"]["fused_steps"] >= 1 + 7 + 1 + 7 + 1, got
    for key in ("greedy", "sampled", "ngram"):
        assert got["on"][key] == got["off"][key], key


def test_auto_keeps_the_faster_way_on_cuda(tiny_engine, monkeypatch):
    """The warm-up's trial: decode steps of 1 and 64 rows replayed with the fused layers and with the model's; the
    fused ones run steps up to the largest size where they were the faster."""
    import torch

    from engine_builder import LLM

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (the trial replays CUDA graphs)")
    monkeypatch.setenv("TRTBUILD_FUSED_DECODE", "auto")
    llm = LLM(tiny_engine("llama")[0], backend="torch")
    try:
        llm.warm_up()
        trial = llm.backend.fused.trial
        assert set(trial["steps"]) == {1, 64} and all(v > 0 for t in trial["steps"].values() for v in t.values())
        wins = [rows for rows, t in trial["steps"].items() if t["fused_ms"] <= t["compiled_ms"]]
        assert trial["max_tokens"] == llm.backend.fused.max_tokens == (0 if 1 not in wins else max(wins) if
                                                                       len(wins) == 2 else 16), trial
    finally:
        llm.close()


def test_on_refuses_a_layer_it_cannot_run(tiny_engine, monkeypatch):
    from engine_builder import LLM
    from engine_builder.util.errors import InputError

    monkeypatch.setenv("TRTBUILD_FUSED_DECODE", "on")
    with pytest.raises(InputError, match=r"TRTBUILD_FUSED_DECODE=on: this gemma2 model's layer has a norm weight "
                                         r"offset \(gemma\), sandwich norms, .*; unset it"):
        LLM(tiny_engine("gemma2")[0], backend="torch")


def test_on_needs_a_gpu_or_the_interpreter(tiny_engine, monkeypatch):
    from engine_builder import LLM
    from engine_builder.util.errors import InputError

    monkeypatch.setenv("TRTBUILD_FUSED_DECODE", "on")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(InputError, match="TRTBUILD_FUSED_DECODE=on runs Triton kernels, which need a CUDA GPU"):
        LLM(tiny_engine("llama")[0], backend="torch")


@pytest.mark.parametrize("name", list(CASES))
def test_fused_layers_give_the_models_logits_and_tokens_in_interpreter(interpreted, name):
    got = interpreted[name]
    assert got["tokens_equal"], got
    assert got["worst_rel"] <= TOL, got  # bfloat16 too: its roundings are the eager ops' (measured: equal)


@pytest.mark.parametrize("name", list(CASES))
def test_fused_layers_give_the_models_logits_and_tokens_on_cuda(name):
    """Compiled for the GPU, against the eager layer's cuBLAS products: float32 (no TF32 either side) to float
    rounding; a 16-bit sum whose order differs rounds apart in the rare last bit, which the next layers carry: a
    bfloat16 step's logits within a few of its units (2^-8 of the logits' scale each), and the same tokens."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (the interpreter cases above run the same checks on the CPU)")
    got = run_case(CASES[name], list(CASES).index(name), "cuda")
    assert got["tokens_equal"], got
    assert got["worst_rel"] <= (TOL if CASES[name]["dtype"] == "float32" else 4 * 2 ** -8), got


@pytest.mark.parametrize("family, reasons", [
    ("qwen3", None),
    ("gemma2", "a norm weight offset (gemma), sandwich norms, the gated gelu_tanh MLP, a final logit softcap"),
    ("phi3", None),
    ("gpt2", "layer_norm, the plain gelu_tanh MLP"),
    ("gpt_neox", "layer_norm, the parallel residual, the plain gelu MLP"),
])
def test_the_layers_it_refuses_say_why(family, reasons):
    from tiny_models import COMMON, FAMILY_MODELS, TINY_MODELS

    from converters.registry import get_converter
    from engine_builder.runner.torch_backend.fused_decode import unsupported

    config_cls, _, overrides = FAMILY_MODELS[family] if family in FAMILY_MODELS else TINY_MODELS[family]
    hf = getattr(transformers, config_cls)(**(overrides if family in FAMILY_MODELS else {**COMMON, **overrides}))
    cfg = get_converter(hf.model_type).config_from_hf(hf.to_dict())
    assert unsupported(types.SimpleNamespace(cfg=cfg, tp=None)) == reasons
    assert unsupported(types.SimpleNamespace(cfg=cfg, tp=object())).startswith("tensor parallel")


if __name__ == "__main__":
    child_main()

"""Mixture-of-experts decoders (mixtral, qwen2_moe, qwen3_moe): tiny random HF model -> convert -> one
float32 build of both targets (a real TensorRT-RTX engine and the twin) -> greedy tokens and logits equal
to transformers' `generate`, through both the twin (model.onnx) and the graph TensorRT parsed (model.trt.onnx).

The twin runs lower_ort_moe's per-expert form; model.trt.onnx keeps the portable If, whose dense branch
the 20-token prefill takes (20 * top_k >= num_experts) and whose gathered branch every decode step takes
(1 * top_k < num_experts): all three expert forms are held to transformers.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import transformers
from cli_process import assert_user_error, trtbuild
from hf_reference import hf_greedy, load_hf, prompt_of
from ort_helpers import OrtDecoder
from runner_engines import add_word_tokenizer
from tiny_models import COMMON, MOE_MODELS, spread_routers

from converters.convert import convert
from engine_builder.build.pipeline import build
from engine_builder.formats.build_config import BuildConfig, Limits
from engine_builder.formats.checkpoint import CheckpointConfig, expected_shapes
from engine_builder.formats.manifest import ORT_MODEL, TRT_MODEL
from engine_builder.formats.memory_plan import parameter_counts
from engine_builder.formats.model_config import MlpSpec
from engine_builder.util.errors import TrtbuildError

TOL = 1e-4
STEPS = 17  # the prefill's token + 16 decode steps
FAMILIES = MOE_MODELS


def tiny_moe(family: str, out: Path, **extra: object) -> Path:
    """A 2-layer random MoE; router weights spread (qwen's init is zeros: every expert tied, TopK's
    tie-break would decide) and norms moved off 1 so a wrong router or norm changes the tokens."""
    config_cls, model_cls, overrides = FAMILIES[family]
    config = getattr(transformers, config_cls)(**{**COMMON, **overrides, **extra})
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).eval()
    spread_routers(model)
    model.save_pretrained(out)
    add_word_tokenizer(out, COMMON["vocab_size"])  # the engine dir's LLM wants a tokenizer
    return out


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def moe_engine(request, module_tmp_factory) -> tuple[str, Path, Path]:
    """(family, hf dir, engine dir): one float32 build of both targets per family."""
    base = module_tmp_factory.mktemp(request.param)
    hf_dir = tiny_moe(request.param, base / "hf")
    convert(hf_dir, base / "ckpt", dtype="float32")
    build(base / "ckpt", base / "engine", BuildConfig(
        targets=("tensorrt", "onnxruntime"), dtype="float32",
        limits=Limits(max_batch=2, max_input_len=64, max_seq_len=128), compute_capabilities=("sm86",)))
    return request.param, hf_dir, base / "engine"


def test_routing_spec_matches_transformers(moe_engine):
    family, hf_dir, engine = moe_engine
    hf = transformers.AutoConfig.from_pretrained(hf_dir)
    mlp = CheckpointConfig.load(engine.parent / "ckpt").model.block.mlp
    shared = getattr(hf, "shared_expert_intermediate_size", 0)
    assert mlp == MlpSpec(kind="moe", num_experts=8, top_k=2,
                          norm_topk=True if family == "mixtral" else hf.norm_topk_prob,
                          shared_expert_size=shared, shared_expert_gate=bool(shared))
    manifest = json.loads((engine / "config.json").read_text())
    assert manifest["model"]["block"]["mlp"]["num_experts"] == 8
    # the memory plan weighs every expert: its parameter count is the checkpoint's
    model = CheckpointConfig.load(engine.parent / "ckpt").model
    assert sum(parameter_counts(model)) == sum(math.prod(shape) for shape, _ in expected_shapes(model).values())
    # the TensorRT-RTX engine holds both expert forms: an If (CONDITION) per layer, its gathers
    layers = manifest["tensorrt"]["network_layer_types"]
    assert layers["CONDITION"] == 2 and layers["TOPK"] == 2 and layers["GATHER"] >= 4
    assert (engine / "rank0.engine").stat().st_size > 0
    proc = trtbuild("inspect", engine)  # the experts row, whatever the table's wrapping
    assert proc.returncode == 0, proc.stderr
    routing = "renormalized to sum 1" if mlp.norm_topk else "not renormalized"
    shared = f"; shared expert of width {shared} under a sigmoid gate" if shared else ""
    assert (f"experts 8 experts of width {CheckpointConfig.load(engine.parent / 'ckpt').model.intermediate_size}, "
            f"silu; router: softmax, top-2, {routing}{shared}") in " ".join(proc.stdout.replace("│", " ").split())
    # the twin: lower_ort_moe replaced each If by one NonZero-selected GEMM pair per expert
    assert {r["name"]: r["matches"] for r in manifest["passes"]["onnxruntime"]}["lower_ort_moe"] == 2
    assert "lower_ort_moe" not in {r["name"] for r in manifest["passes"]["tensorrt"]}
    twin = onnx.load(engine / ORT_MODEL, load_external_data=False).graph.node
    trt = onnx.load(engine / TRT_MODEL, load_external_data=False).graph.node
    assert [n.op_type for n in twin].count("NonZero") == 2 * 8
    assert not [n for n in twin if n.name.endswith("mlp/experts")]
    assert [n.op_type for n in trt if n.name.endswith("mlp/experts")] == ["If", "If"]
    assert "NonZero" not in [n.op_type for n in trt]


@pytest.mark.parametrize("graph", [ORT_MODEL, TRT_MODEL])
def test_greedy_tokens_and_logits_match_transformers(moe_engine, graph):
    family, hf_dir, engine = moe_engine
    prompt = prompt_of(20, seed=7)
    want_tokens, want_logits = hf_greedy(hf_dir, prompt, STEPS)
    tokens, logits = OrtDecoder(engine / graph).greedy(prompt, STEPS)
    errors = [float(np.abs(got - want).max()) for got, want in zip(logits, want_logits, strict=True)]
    assert max(errors) <= TOL, f"max |logits - HF| per step: {[f'{e:.1e}' for e in errors]}"
    assert tokens == want_tokens
    assert len(set(tokens)) > STEPS // 2  # a varied continuation, not one token repeated


def test_tokens_route_to_many_experts(moe_engine):
    """The test above can only fail on routing if tokens really pick different experts."""
    family, hf_dir, _ = moe_engine
    model = load_hf(hf_dir)
    with torch.no_grad():
        out = model(torch.tensor([prompt_of(20, seed=7)]), output_router_logits=True)
    chosen = torch.topk(out.router_logits[0], 2, dim=-1).indices
    assert len(set(chosen.flatten().tolist())) >= 6


@pytest.mark.parametrize(("extra", "needle"), [
    (dict(num_experts_per_tok=9), "top_k must be in 1..num_experts (8)"),
    (dict(mlp_only_layers=[1]), "dense MLP"),
])
def test_bad_moe_config_is_one_line_error(tmp_path, extra, needle):
    family = "qwen3_moe"
    hf_dir = tiny_moe(family, tmp_path / "hf")
    config = json.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps({**config, **extra}))
    with pytest.raises(TrtbuildError) as err:
        convert(hf_dir, tmp_path / "ckpt")
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "ckpt").exists()


def test_missing_expert_through_the_cli(tmp_path):
    """An expert tensor gone from the checkpoint: exit 2, one line, nothing written."""
    from safetensors.torch import load_file, save_file

    hf_dir = tiny_moe("mixtral", tmp_path / "hf")
    state = load_file(hf_dir / "model.safetensors")
    del state["model.layers.1.block_sparse_moe.experts.5.w3.weight"]
    save_file(state, hf_dir / "model.safetensors", metadata={"format": "pt"})
    assert_user_error(trtbuild("convert", hf_dir, tmp_path / "ckpt"), "layers.1.mlp.experts.gate_up.weight")
    assert not (tmp_path / "ckpt").exists()


def test_lower_ort_moe_is_idempotent_and_explains_itself(moe_engine):
    import onnx_ir as ir

    from passes import get_pass

    _, _, engine = moe_engine
    model = ir.load(engine / TRT_MODEL)  # the portable If, as TensorRT got it
    moe_pass = get_pass("lower_ort_moe")
    assert moe_pass.apply(model) == 2
    assert moe_pass.apply(model) == 0
    assert moe_pass.why_not(model) == "no MoE If (network/moe.py) in the graph"


@pytest.fixture(scope="module")
def qwen2_moe_hf(module_tmp_factory) -> Path:
    return tiny_moe("qwen2_moe", module_tmp_factory.mktemp("qwen2_moe_q") / "hf")


@pytest.mark.parametrize(("quant", "group"), [("int8_wo", None), ("int4_wo", 32)])
def test_weight_only_quantized_experts_equal_their_dequantized_model(qwen2_moe_hf, tmp_path, quant, group):
    """`convert --quant` quantizes every expert (and the shared one) with its own scales; the graph's
    dequantized expert stacks compute exactly what the same model with W = dequantize(W_q) computes."""
    from quantized_ckpt import dequantized_checkpoint

    from engine_builder.network import NetworkOptions, write_onnx

    convert(qwen2_moe_hf, tmp_path / "q", quant=quant, group_size=group)
    q = CheckpointConfig.load(tmp_path / "q").quantization
    assert {"layers.1.mlp.experts.gate_up", "layers.1.mlp.experts.down", "layers.1.mlp.shared.down"} <= set(
        q.quantized)
    float_twin = dequantized_checkpoint(tmp_path / "q", tmp_path / "f")
    options, prompt = NetworkOptions(max_seq_len=64, dtype="float32"), prompt_of(20, seed=3)
    tokens, logits = OrtDecoder(write_onnx(tmp_path / "q", tmp_path / "qg", options), level="disable_all").greedy(
        prompt, STEPS)
    want_tokens, want_logits = OrtDecoder(write_onnx(float_twin, tmp_path / "fg", options),
                                          level="disable_all").greedy(prompt, STEPS)
    assert max(float(np.abs(g - w).max()) for g, w in zip(logits, want_logits, strict=True)) <= 1e-5
    assert tokens == want_tokens


def test_quantization_limits_are_one_line_errors(qwen2_moe_hf, tmp_path):
    with pytest.raises(TrtbuildError, match="cannot calibrate an MoE model; use --quant int8_wo or int4_wo"):
        convert(qwen2_moe_hf, tmp_path / "awq", quant="int4_awq")
    convert(qwen2_moe_hf, tmp_path / "q4", quant="int4_wo", group_size=32)
    with pytest.raises(TrtbuildError, match="int4 MoE experts cannot build for --target tensorrt"):
        build(tmp_path / "q4", tmp_path / "engine", BuildConfig(targets=("tensorrt", "onnxruntime")))
    assert not (tmp_path / "engine").exists()



def test_fp16_twin_is_as_accurate_as_hf_fp16(qwen2_moe_hf, tmp_path):
    """fp16 differs by design: the twin's per-expert form is held to transformers' own fp16 error."""
    convert(qwen2_moe_hf, tmp_path / "ckpt", dtype="float16")
    build(tmp_path / "ckpt", tmp_path / "engine", BuildConfig(
        targets=("onnxruntime",), dtype="float16", limits=Limits(max_batch=1, max_input_len=32, max_seq_len=64)))
    prompt = prompt_of(20, seed=8)
    with torch.no_grad():
        ref = load_hf(qwen2_moe_hf)(torch.tensor([prompt])).logits[0, -1].numpy()
        hf16 = load_hf(qwen2_moe_hf, torch.float16)(torch.tensor([prompt])).logits[0, -1].float().numpy()
    dec = OrtDecoder(tmp_path / "engine" / ORT_MODEL)
    got = dec.run(dec.empty(1), np.array([prompt]))[0, -1]
    assert np.abs(got - ref).max() <= 1.5 * np.abs(hf16 - ref).max()


def test_llm_generates_a_batch_of_two_like_transformers(moe_engine):
    """Two prompts of different lengths in one batch through LLM.generate (runner, KV cache, sampler):
    each sequence's greedy tokens are what transformers generates for it alone."""
    from engine_builder import LLM, SamplingParams

    _, hf_dir, engine = moe_engine
    prompts = [prompt_of(20, seed=11), prompt_of(13, seed=12)]
    with LLM(engine, backend="onnxruntime") as llm:
        got = llm.generate(prompt_token_ids=prompts, params=SamplingParams(
            temperature=0, max_new_tokens=8, ignore_eos=True))
    assert [list(g.token_ids) for g in got] == [hf_greedy(hf_dir, p, 8)[0] for p in prompts]

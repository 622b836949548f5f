"""Fidelity of each quantization scheme on the real model, through the whole pipeline.

SmolLM2-135M fp32 checkpoint -> quantize_checkpoint (what `convert --quant` runs) -> `build` of the
onnxruntime float32 twin (MatMulNBits at the manifest's accuracy level) -> `evaluate` against the
fp32 engine on the shipped eval text. Groups of 32 or 64: SmolLM2's hidden size 576 is not a
multiple of 128. lm_head stays float (`--exclude lm_head`): it is the tied embedding, and
quantizing it costs more fidelity than any other linear on this model.

The bounds below are the measured figures (README, "Quantization") with a small margin: they
guard against regressions, they are NOT issue 6's targets, which int8_wo (top-1 >= 0.99) and
int4_awq (ppl within 5% of fp32) do not meet on this model; the README says by how much and how
llama.cpp's own requantization of the same model compares (benchmarks/quant_fidelity.py). Why they
are out of reach here: the "fp32" SmolLM2 is the dequantized Q4_1 GGUF, so every int4 scheme
re-quantizes weights that already sit on another 4-bit grid, and on this text 5% of positions have
their top two logits within 0.05 of each other, so any perturbation flips some argmaxes.
"""

from __future__ import annotations

import json
import shutil

import pytest
from runner_engines import build_engine

from converters.convert import convert
from converters.quantize.quant_options import QuantOptions
from converters.quantize.quantized_checkpoint import quantize_checkpoint
from engine_builder import LLM, SamplingParams
from engine_builder.build.pipeline import build
from engine_builder.eval import evaluate
from engine_builder.formats.build_config import BuildConfig, Limits

EVAL_TOKENS = 512
CONTEXT = 128  # 4 windows side by side in the 4 KV slots of the test engines
# measured at EVAL_TOKENS / CONTEXT (top-1, KL, ppl / fp32 ppl):
#   int8_wo per channel 0.949 0.0085 1.012; int8_wo g32 0.951 0.0057 1.001
#   int4_wo g32 0.569 0.550 1.462; int4_awq g32 0.756 0.250 1.221; int4_awq g64 0.703 0.320 1.289
#   w8a8_sq 1.470; fp8 (float16 twin) 1.052; int8 KV cache (float weights) 0.976 0.0015 1.003
#   gguf (the file's own blocks): 1.0 2.5e-11 1.000000
INT8_MIN_TOP1 = 0.94
INT8_MAX_PPL_RATIO = 1.03
INT4_AWQ_MAX_PPL_RATIO = {32: 1.26, 64: 1.33}
W8A8_MAX_PPL_RATIO = 1.55
FP8_MAX_PPL_RATIO = 1.08
KV8_MIN_TOP1 = 0.96
KV8_MAX_KL = 0.003
# --quant gguf keeps the GGUF's own Q4_1 blocks and its twin computes them with float activations
# (accuracy level 0), so it is the fp32 model up to float rounding (measured KL 2e-11, top-1 1.0)
GGUF_MAX_KL = 1e-8


@pytest.fixture(scope="module")
def quantized(smollm2_ckpt, module_tmp_factory):
    """(scheme, group, kv_cache) -> the quantized checkpoint dir, made once each."""
    made = {}

    def get(scheme: str, group: int | None = None, kv_cache: str = "none"):
        if (scheme, group, kv_cache) not in made:
            ckpt = module_tmp_factory.mktemp(f"smollm2-{scheme}-{group}-{kv_cache}") / "ckpt"
            ckpt.mkdir()
            exclude = ("lm_head",) if scheme != "none" else ()
            quantize_checkpoint(smollm2_ckpt, ckpt, QuantOptions(scheme, group, kv_cache, exclude=exclude))
            made[scheme, group, kv_cache] = ckpt
        return made[scheme, group, kv_cache]

    return get


@pytest.fixture(scope="module")
def fidelity(quantized, smollm2_engine):
    """(scheme, group, kv_cache) -> its EvalResult against the fp32 engine, each engine built, scored and deleted
    (seven engines of 0.4-2 GB kept side by side were most of the suite's disk peak)."""
    scores = {}

    def get(scheme: str, group: int | None = None, kv_cache: str = "none"):
        key = scheme, group, kv_cache
        if key not in scores:
            ckpt = quantized(*key)
            # fp8 needs a float16 twin: onnxruntime's float32 kernels refuse FP8 Q/DQ
            engine = build_engine(ckpt, ckpt.parent / "engine", dtype="float16" if scheme == "fp8" else "float32")
            scores[key] = evaluate(engine, reference=smollm2_engine, max_tokens=EVAL_TOKENS, context=CONTEXT,
                                   backend="onnxruntime")
            shutil.rmtree(engine)
        return scores[key]

    return get


@pytest.mark.parametrize("group", [None, 32])
def test_int8_weight_only_agrees_with_fp32(fidelity, group):
    result = fidelity("int8_wo", group)
    print(json.dumps(result.to_json()))
    assert result.top1_agreement >= INT8_MIN_TOP1, result
    assert result.ppl <= result.reference_ppl * INT8_MAX_PPL_RATIO, result


def test_int8_groups_beat_one_scale_per_channel(fidelity):
    grouped, per_channel = fidelity("int8_wo", 32), fidelity("int8_wo")
    assert grouped.kl < per_channel.kl and grouped.ppl < per_channel.ppl, (grouped, per_channel)


@pytest.mark.parametrize("group", [32, 64])
def test_int4_awq_beats_round_to_nearest(fidelity, group):
    awq, rtn = fidelity("int4_awq", group), fidelity("int4_wo", group)
    print(json.dumps({"int4_awq": awq.to_json(), "int4_wo": rtn.to_json()}))
    assert awq.ppl < rtn.ppl and awq.kl < rtn.kl, (awq, rtn)
    assert awq.ppl <= awq.reference_ppl * INT4_AWQ_MAX_PPL_RATIO[group], awq


def test_smaller_int4_groups_are_closer(fidelity):
    assert fidelity("int4_awq", 32).kl < fidelity("int4_awq", 64).kl


def test_int8_kv_cache_stays_close_to_fp32(fidelity):
    """Float weights, the int8 KV cache (per-channel scales calibrated on the shipped text) read by
    onnxruntime's GroupQueryAttention."""
    result = fidelity("none", None, "int8")
    print(json.dumps({"kv_cache_int8": result.to_json()}))
    assert result.top1_agreement >= KV8_MIN_TOP1 and result.kl <= KV8_MAX_KL, result


@pytest.mark.parametrize(("scheme", "max_ratio"), [("w8a8_sq", W8A8_MAX_PPL_RATIO), ("fp8", FP8_MAX_PPL_RATIO)])
def test_activation_quantized_schemes_stay_within_their_bounds(fidelity, scheme, max_ratio):
    result = fidelity(scheme)
    print(json.dumps({scheme: result.to_json()}))
    assert result.ppl <= result.reference_ppl * max_ratio, result


@pytest.fixture(scope="module")
def gguf_engine(smollm2_gguf, module_tmp_factory):
    """`convert --quant gguf` of the bundled GGUF, built as the default onnxruntime float32 twin."""
    root = module_tmp_factory.mktemp("smollm2-gguf")
    convert(smollm2_gguf, root / "ckpt", quant="gguf")
    return build_engine(root / "ckpt", root / "engine")


def test_gguf_blocks_are_the_fp32_model(gguf_engine, smollm2_engine):
    result = evaluate(gguf_engine, reference=smollm2_engine, max_tokens=EVAL_TOKENS, context=CONTEXT,
                      backend="onnxruntime")
    print(json.dumps({"gguf": result.to_json()}))
    manifest = json.loads((gguf_engine / "config.json").read_text())
    assert manifest["quantization"]["onnxruntime_accuracy_level"] == 0
    assert result.kl <= GGUF_MAX_KL and result.top1_agreement == 1.0, result
    assert abs(result.ppl / result.reference_ppl - 1) < 1e-5, result


def test_gguf_with_its_own_int8_head_is_the_fp32_model(smollm2_gguf, smollm2_engine, tmp_path):
    """`convert --quant gguf --lm-head int8` + `build --twin-accuracy exact`: the Q8_0 head in its own blocks at
    float activations, as two 4-bit MatMulNBits (passes/lower_ort_matmulnbits.py), still the fp32 model, and no
    8-bit MatMulNBits left (at level 0 onnxruntime dequantizes those every call: 120-208 ms for this head)."""
    import onnx

    from engine_builder.formats.build_config import DEFAULT_PASSES
    from engine_builder.formats.twin_accuracy import with_twin_accuracy

    convert(smollm2_gguf, tmp_path / "ckpt", quant="gguf", lm_head="int8")
    engine = build_engine(tmp_path / "ckpt", tmp_path / "engine",
                          ort_passes=with_twin_accuracy(DEFAULT_PASSES["onnxruntime"], "exact"))
    graph = onnx.load(engine / "model.onnx", load_external_data=False).graph
    nbits = [n for n in graph.node if n.op_type == "MatMulNBits"]
    bits = [next(a.i for a in n.attribute if a.name == "bits") for n in nbits]
    levels = {next(a.i for a in n.attribute if a.name == "accuracy_level") for n in nbits}
    assert bits.count(8) == 0 and bits.count(4) == 30 * 4 + 2 and levels == {0}, (bits, levels)
    result = evaluate(engine, reference=smollm2_engine, max_tokens=EVAL_TOKENS, context=CONTEXT, backend="onnxruntime")
    print(json.dumps({"gguf_int8_head_exact": result.to_json()}))
    assert result.kl <= GGUF_MAX_KL and result.top1_agreement == 1.0, result
    assert abs(result.ppl / result.reference_ppl - 1) < 1e-5, result


def test_gguf_blocks_answer_the_chat_question(gguf_engine):
    """What eval's windows of plain text did not show at accuracy level 4: the chat prompt went wrong."""
    with LLM(gguf_engine, backend="onnxruntime") as llm:
        out = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                       SamplingParams(max_new_tokens=16, temperature=0))
    assert "Paris" in out[0].text, out[0].text


def test_int4_awq_builds_a_tensorrt_engine(quantized, tmp_path):
    ckpt = quantized("int4_awq", 64)
    out = tmp_path / "trt"
    result = build(ckpt, out, BuildConfig(targets=("tensorrt",), dtype="float16", compute_capabilities=("sm86",),
                                          limits=Limits(max_batch=1, max_input_len=64, max_seq_len=128)))
    manifest = json.loads((out / "config.json").read_text())
    assert (out / "rank0.engine").stat().st_size > 50e6, result
    assert manifest["checkpoint"]["quantization"]["scheme"] == "int4_awq"

"""An int4 draft of a GGUF's float32 build: `convert --quant gguf --lm-head int8`, `build --twin-accuracy draft`.

The draft keeps the GGUF's own 4-bit blocks (the target's weights) with lm_head int8 per 32 inputs (a Q8_0
table's own blocks), and its onnxruntime twin runs every quantized linear at MatMulNBits accuracy level 4 (int8
activations), block offsets included: not exact, which a speculative draft need not be (the target verifies
every token), so the tests bound it against the exact lowering and check that speculative greedy tokens stay the
target's.
TensorRT's graph is the same as without the option.
"""

from __future__ import annotations

import json

import numpy as np
import onnx_ir as ir
import pytest
from cli_process import assert_user_error, trtbuild
from gguf import GGMLQuantizationType as Q
from ort_helpers import OrtDecoder
from safetensors.numpy import load_file
from tiny_gguf import tiny_gguf

from converters.convert import convert
from engine_builder import LLM, SamplingParams
from engine_builder.build.pipeline import build
from engine_builder.formats.build_config import DEFAULT_PASSES, BuildConfig, Limits, PassLists
from engine_builder.formats.checkpoint import CheckpointConfig
from engine_builder.formats.manifest import ORT_MODEL, TRT_MODEL
from engine_builder.formats.twin_accuracy import with_twin_accuracy
from engine_builder.runner.speculative import SpeculativeConfig
from engine_builder.util.errors import ConfigError

LIMITS = Limits(max_batch=2, max_input_len=32, max_seq_len=96)
# token_embd (and output) Q8_0, the body Q4_1: SmolLM2-135M-Instruct.Q4_1.gguf's types
TYPES = {"token_embd.weight": Q.Q8_0, "output.weight": Q.Q8_0}


def twin(ckpt, out, accuracy: str):
    passes = PassLists(onnxruntime=with_twin_accuracy(DEFAULT_PASSES["onnxruntime"], accuracy))
    return build(ckpt, out, BuildConfig(targets=("onnxruntime",), dtype="float32", limits=LIMITS, passes=passes))


@pytest.fixture(scope="module")
def pairs(module_tmp_factory):
    """pairs(tied) -> a dir with a tiny Q4_1 GGUF converted three ways: float (float32: the target), blocks
    (--quant gguf) and draft (--quant gguf --lm-head int8); tied: the head is token_embd, as SmolLM2's."""
    made = {}

    def get(tied: bool):
        if tied not in made:
            made[tied] = root = module_tmp_factory.mktemp("gguf-draft-tied" if tied else "gguf-draft")
            src = tiny_gguf(root / "tiny.gguf", TYPES, tied=tied)
            convert(src, root / "float", dtype="float32")
            convert(src, root / "blocks", quant="gguf")
            convert(src, root / "draft", quant="gguf", lm_head="int8")
        return made[tied]

    return get


@pytest.fixture
def pair(pairs):
    return pairs(True)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_int8_lm_head_beside_the_blocks(pairs, tied):
    pair = pairs(tied)
    q = CheckpointConfig.load(pair / "draft").quantization
    assert (q.scheme, q.lm_head, q.excluded) == ("gguf", "int8", ())
    # the Q8_0 head is float beside the blocks without --lm-head int8 (listed as kept float when untied)
    blocks_q = CheckpointConfig.load(pair / "blocks").quantization
    assert q.quantized == (*blocks_q.quantized, "lm_head") and blocks_q.excluded == (() if tied else ("lm_head",))
    draft, blocks, floats = (load_file(pair / d / "rank0.safetensors") for d in ("draft", "blocks", "float"))
    codes, scale = draft["lm_head.weight"], draft["lm_head.weight_scale"]
    assert codes.dtype == np.int8 and scale.shape == (codes.shape[0], codes.shape[1] // 32)
    assert (q.lm_head_group_size, q.for_linear("lm_head").group_size) == (32, 32)
    # one scale per 32 inputs holds the Q8_0 table's own blocks: the float conversion's head to float rounding
    # (per output channel, as before, each weight moved by up to half a step of its row's scale)
    want = floats["lm_head.weight" if "lm_head.weight" in floats else "embed.weight"]
    got = codes * np.repeat(scale, 32, axis=1)
    assert np.abs(got - want).max() <= 1e-6 * np.abs(want).max()
    assert np.array_equal(np.abs(codes).reshape(len(codes), -1, 32).max(-1) == 127, np.abs(want).reshape(
        len(want), -1, 32).max(-1) > 0)  # each block's largest weight at code +-127: Q8_0's d = amax / 127
    # every other tensor is the --quant gguf checkpoint's (the blocks, the float embedding for the gather)
    for name in set(blocks) - {"lm_head.weight", "lm_head.weight_scale", "lm_head.weight_offset"}:
        assert np.array_equal(draft[name], blocks[name]), name


def _levels(engine) -> dict[str, int]:
    """MatMulNBits node -> accuracy_level in ENGINE's twin; lm_head's named by its B initializer."""
    model = ir.load(engine / ORT_MODEL)
    return {node.inputs[1].name: node.attributes.get_int("accuracy_level") for node in model.graph
            if node.op_type == "MatMulNBits"}


def test_draft_accuracy_runs_every_linear_at_level_4_within_bound(pair, tmp_path):
    n = len(CheckpointConfig.load(pair / "draft").quantization.quantized)
    auto, draft, exact = (twin(pair / "draft", tmp_path / a, a) for a in ("auto", "draft", "exact"))
    assert {r["name"]: r["matches"] for r in draft.passes["onnxruntime"]}["lower_ort_matmulnbits_draft"] == n
    levels = {a: _levels(tmp_path / a) for a in ("auto", "draft", "exact")}
    head = "lm_head.nbits.B"
    assert len(levels["draft"]) == n and set(levels["draft"].values()) == {4}
    # auto: the blocks with offsets exact (level 0), the int8 head at 4 (int8 at level 0 is 10x slower than fp32)
    assert levels["auto"][head] == 4 and {v for k, v in levels["auto"].items() if k != head} == {0}
    assert set(levels["exact"].values()) == {0}
    config = json.loads((tmp_path / "auto" / "config.json").read_text())
    assert config["quantization"]["onnxruntime_accuracy_level"] == 4  # mixed levels: the highest
    del auto, exact

    # int8 activations per block of 32 against the exact lowering, over 8 greedy steps: with the block offsets
    # at level 4 the logits stay within 5% of their range (measured: up to 3.2%; the error adds up as
    # lower_ort_matmulnbits says), the int8 head alone (auto) within 2% (measured: 0.8%); the tokens are the same
    prompt = [5 + (7 * i) % 120 for i in range(20)]
    want_tokens, want = OrtDecoder(tmp_path / "exact" / ORT_MODEL).greedy(prompt, 8)
    for accuracy, bound in (("draft", 0.05), ("auto", 0.02)):
        tokens, logits = OrtDecoder(tmp_path / accuracy / ORT_MODEL).greedy(prompt, 8)
        for got, ref in zip(logits, want):
            assert np.abs(got - ref).max() <= bound * np.abs(ref).max(), accuracy
        assert tokens == want_tokens, accuracy


def test_speculative_greedy_with_the_draft_is_the_targets(pair, tmp_path):
    twin(pair / "float", tmp_path / "target", "auto")
    twin(pair / "draft", tmp_path / "draft", "draft")
    passes = PassLists(onnxruntime=with_twin_accuracy(DEFAULT_PASSES["onnxruntime"], "draft"))
    one = Limits(max_batch=1, max_input_len=32, max_seq_len=96)
    build(pair / "draft", tmp_path / "draft1", BuildConfig(targets=("onnxruntime",), dtype="float32", passes=passes,
                                                           limits=one))
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    prompts = [[5 + (7 * i) % 120 for i in range(20)], [3 + (11 * i) % 100 for i in range(9)]]
    want = [o.token_ids for o in LLM(tmp_path / "target").generate(prompt_token_ids=prompts, params=params)]
    # fixed and adaptive draft length; draft1 (max_batch 1) drafts for one of the two requests at a time
    for k, draft in ((4, "draft"), (None, "draft"), (4, "draft1")):
        spec = LLM(tmp_path / "target", speculative=SpeculativeConfig("draft", draft_engine=str(tmp_path / draft),
                                                                     num_draft_tokens=k))
        assert [o.token_ids for o in spec.generate(prompt_token_ids=prompts, params=params)] == want
        stats = spec.speculation.stats
        assert stats.draft_tokens > 0 and stats.acceptance_rate > 0.5  # the target's own weights: mostly agrees


def test_cli_builds_tensorrt_unchanged_beside_the_draft_twin(pair, tmp_path):
    # the twin in float32 whatever this CPU's float16 support (--dtype auto would make it float16 on a CPU with
    # native float16 arithmetic, where MatMulNBits keeps level 0: the draft lowering is a float32 activations' choice)
    proc = trtbuild("build", pair / "draft", tmp_path / "engine", "--twin-accuracy", "draft", "--cc", "sm86",
                    "--max-batch", "2", "--max-input-len", "16", "--max-seq-len", "32", "--set", "twin_dtype=float32",
                    "--json")
    assert proc.returncode == 0, proc.stderr
    n = len(CheckpointConfig.load(pair / "draft").quantization.quantized)
    result = json.loads(proc.stdout)
    assert (tmp_path / "engine" / "rank0.engine").stat().st_size > 0
    trt = ir.load(tmp_path / "engine" / TRT_MODEL)
    assert sum(node.op_type == "DequantizeLinear" for node in trt.graph) == n  # each linear's DQ -> MatMul
    assert not any(node.op_type == "MatMulNBits" for node in trt.graph)
    assert "lower_ort_matmulnbits_draft 9" in result["passes"]["onnxruntime"]
    assert "lower_ort_matmulnbits" not in result["passes"]["tensorrt"]
    assert set(_levels(tmp_path / "engine").values()) == {4}


def test_bad_twin_accuracy_is_refused(pair, tmp_path):
    assert_user_error(trtbuild("build", pair / "draft", tmp_path / "engine", "--twin-accuracy", "fast"),
                      "--twin-accuracy 'fast'", "auto, exact, draft")
    assert not (tmp_path / "engine").exists()
    with pytest.raises(ConfigError, match="has none"):
        with_twin_accuracy(("fold_constants",), "draft")

"""GPT-2 and GPT-NeoX end to end: tiny random HF model -> convert -> one build (a real TensorRT-RTX engine
and the onnxruntime twin, float32) -> greedy tokens identical to transformers' `generate`, on the twin
through LLM and on the graph TensorRT parsed; plus their bad configs and shapes (exit 2, one line).

What makes each family different is switched on in tests/tiny_models.py's FAMILY_MODELS: LayerNorm with
biases, Conv1D weights (gpt2), learned positions (gpt2), per-head fused q/k/v (gpt_neox), half-head
rotary and the parallel residual (gpt_neox); norms and biases moved off their init so a wrong one shows.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_process import assert_user_error, trtbuild
from hf_reference import hf_greedy, load_hf, prompt_of
from ort_helpers import OrtDecoder
from runner_engines import add_word_tokenizer
from safetensors.numpy import save_file as save_numpy
from safetensors.torch import load_file, save_file
from tiny_models import FAMILY_MODELS, make_tiny_model

from converters.archs.gpt_neox import GPTNeoXConverter
from converters.convert import convert
from converters.quantize.folding import Folding, foldable
from engine_builder import LLM, SamplingParams
from engine_builder.build.pipeline import build
from engine_builder.formats.build_config import BuildConfig, Limits
from engine_builder.formats.checkpoint import CheckpointConfig
from engine_builder.formats.manifest import TRT_MODEL
from engine_builder.formats.memory_plan import plan_engine
from engine_builder.util.errors import ConfigError, InputError, UnsupportedError

STEPS = 17  # the prefill's token + 16 decode steps
TOL = 1e-4
LIMITS = Limits(max_batch=2, max_input_len=64, max_seq_len=128)

# what each family's spec must say, and which pattern-matching passes must (and must not) find their pattern
SPECS = {
    "gpt2": dict(position_embedding="learned", rope_dim=0, layout="sequential", activation="gelu_tanh",
                 tied=True, rotary_layers=0),
    "gpt_neox": dict(position_embedding="rotary", rope_dim=8, layout="parallel", activation="gelu",
                     tied=False, rotary_layers=2),
}


@pytest.fixture(scope="module")
def family(module_tmp_factory):
    """family(name) -> (HF dir, checkpoint dir, engine dir), made once: one TensorRT-RTX build per family."""
    made: dict[str, tuple[Path, Path, Path]] = {}

    def get(name: str) -> tuple[Path, Path, Path]:
        if name not in made:
            root = module_tmp_factory.mktemp(name)
            hf = make_tiny_model(name, root / "hf")
            add_word_tokenizer(hf, FAMILY_MODELS[name][2]["vocab_size"])  # LLM wants a tokenizer
            convert(hf, root / "ckpt", dtype="float32")
            build(root / "ckpt", root / "engine", BuildConfig(targets=("tensorrt", "onnxruntime"), dtype="float32",
                                                              limits=LIMITS, compute_capabilities=("sm86",)))
            made[name] = hf, root / "ckpt", root / "engine"
        return made[name]

    return get


@pytest.mark.parametrize("name", sorted(FAMILY_MODELS))
def test_spec_engine_and_passes(family, name):
    _, ckpt, engine = family(name)
    want = SPECS[name]
    model = CheckpointConfig.load(ckpt).model
    block = model.block
    assert (model.position_embedding, model.rope.dim, block.residual.layout, block.mlp.activation,
            model.tie_word_embeddings) == (want["position_embedding"], want["rope_dim"], want["layout"],
                                           want["activation"], want["tied"])
    assert (block.norm.kind, block.norm.bias, block.mlp.kind, block.mlp.bias) == ("layer_norm", True, "plain", True)
    # the memory plan counts exactly the checkpoint's tensors: norm biases, a plain MLP, position embeddings
    weights = ckpt / "rank0.safetensors"
    header = 8 + int.from_bytes(weights.read_bytes()[:8], "little")
    assert plan_engine(model, LIMITS, "float32").weights == weights.stat().st_size - header

    manifest = json.loads((engine / "config.json").read_text())
    assert (engine / "rank0.engine").stat().st_size > 0
    layers = manifest["tensorrt"]["network_layer_types"]
    # TensorRT made native layers: LayerNorm (2 per layer + final), attention, cache update, rotary where it is
    assert layers["NORMALIZATION"] == 2 * model.num_layers + 1
    assert layers["ATTENTION_INPUT"] == layers["ATTENTION_OUTPUT"] == model.num_layers
    assert layers["KV_CACHE_UPDATE"] == 2 * model.num_layers
    assert layers.get("ROTARY_EMBEDDING", 0) == 2 * want["rotary_layers"]
    for target in ("tensorrt", "onnxruntime"):
        matches = {p["name"]: p["matches"] for p in manifest["passes"][target]}
        # fused q/k/v and a plain MLP leave nothing to fuse; LayerNorm is no RMSNorm
        assert matches["fuse_qkv"] == matches["fuse_gate_up"] == matches["fuse_rms_norm"] == 0
        assert matches["fuse_rotary"] == 2 * want["rotary_layers"]
        assert matches["fuse_attention"] == model.num_layers and matches["fuse_kv_cache_update"] == 2 * model.num_layers
    ort = {p["name"]: p["matches"] for p in manifest["passes"]["onnxruntime"]}
    assert ort["lower_ort_attention"] == model.num_layers and ort["lower_ort_norms"] == 0


@pytest.mark.parametrize("name", sorted(FAMILY_MODELS))
def test_greedy_generation_matches_transformers(family, name):
    hf_dir, _, engine = family(name)
    prompt = prompt_of(20, seed=7)
    want_tokens, want_logits = hf_greedy(hf_dir, prompt, STEPS)
    want_logprobs = [float(torch.log_softmax(torch.from_numpy(step), -1)[t])
                     for step, t in zip(want_logits, want_tokens, strict=True)]
    assert len(set(want_tokens)) > STEPS // 2  # a varied continuation, not one token repeated

    # the twin (GroupQueryAttention-lowered) through the runtime a user calls
    with LLM(engine, backend="onnxruntime") as llm:
        got = llm.generate(prompt_token_ids=[prompt], params=SamplingParams(
            temperature=0, max_new_tokens=STEPS, ignore_eos=True, logprobs=0))[0]
    assert list(got.token_ids) == want_tokens
    assert np.allclose([lp.logprob for lp in got.logprobs], want_logprobs, atol=TOL)

    # a batch of two prompts of different lengths: each row's positions (learned or rotary) are its own
    short = prompt_of(7, seed=11)
    want_short, _ = hf_greedy(hf_dir, short, STEPS)
    with LLM(engine, backend="onnxruntime") as llm:
        both = llm.generate(prompt_token_ids=[prompt, short], params=SamplingParams(
            temperature=0, max_new_tokens=STEPS, ignore_eos=True))
    assert [list(o.token_ids) for o in both] == [want_tokens, want_short]

    # the graph TensorRT-RTX parsed, run in onnxruntime
    tokens, logits = OrtDecoder(engine / TRT_MODEL).greedy(prompt, STEPS)
    errors = [float(np.abs(g - w).max()) for g, w in zip(logits, want_logits, strict=True)]
    assert max(errors) <= TOL, f"max |logits - HF| per step: {[f'{e:.1e}' for e in errors]}"
    assert tokens == want_tokens


def test_gpt2_positions_end_at_n_positions(family, tmp_path):
    """Learned positions stop at n_positions: a longer KV cache is refused before anything is built."""
    _, ckpt, _ = family("gpt2")
    n_positions = FAMILY_MODELS["gpt2"][2]["n_positions"]
    with pytest.raises(ConfigError, match=f"--max-seq-len {n_positions} or less"):
        build(ckpt, tmp_path / "engine", BuildConfig(targets=("onnxruntime",), dtype="float32", limits=Limits(
            max_batch=1, max_input_len=16, max_seq_len=n_positions + 1)))
    assert not (tmp_path / "engine").exists()


def test_gpt2_original_names_and_old_buffers(family, tmp_path):
    """The OpenAI checkpoints' names (no `transformer.` prefix) with the old attn.bias buffers convert to the
    same checkpoint."""
    hf_dir, ckpt, _ = family("gpt2")
    src = tmp_path / "hf"
    shutil.copytree(hf_dir, src)
    tensors = {k.removeprefix("transformer."): v for k, v in load_file(src / "model.safetensors").items()}
    tensors["h.0.attn.bias"] = torch.tril(torch.ones(1, 1, 8, 8))
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    result = convert(src, tmp_path / "ckpt", dtype="float32")
    assert "h.0.attn.bias" in result.dropped
    assert (tmp_path / "ckpt" / "rank0.safetensors").read_bytes() == (ckpt / "rank0.safetensors").read_bytes()


def test_gpt_neox_transformers4_rotary_fields():
    """rotary_pct / rotary_emb_base (transformers 4 configs, e.g. Pythia's) and their defaults when absent."""
    hf = dict(model_type="gpt_neox", vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, max_position_embeddings=256)
    old = GPTNeoXConverter.config_from_hf({**hf, "rotary_pct": 0.5, "rotary_emb_base": 500.0,
                                           "use_parallel_residual": False})
    assert (old.rope.dim, old.rope.theta, old.block.residual.layout) == (8, 500.0, "sequential")
    default = GPTNeoXConverter.config_from_hf(hf)  # transformers' defaults: a quarter of each head, base 10000
    assert (default.rope.dim, default.rope.theta, default.block.residual.layout) == (4, 10000.0, "parallel")


def _edit_config(src: Path, dst: Path, **changes) -> Path:
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, **changes}))
    return dst


def _cut_rows(src: Path, dst: Path, name: str) -> Path:
    """A copy of SRC whose tensor NAME lost its last three rows."""
    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    tensors[name] = tensors[name][:-3].clone()
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def test_bad_configs_and_shapes(family, tmp_path):
    gpt2, _, _ = family("gpt2")
    neox, _, _ = family("gpt_neox")
    # a Conv1D weight whose transpose disagrees with config.json: named with both shapes, through the CLI
    proc = trtbuild("convert", _edit_config(gpt2, tmp_path / "wide", n_inner=128), tmp_path / "out")
    assert_user_error(proc, "transformer.h.0.mlp.c_fc.weight", "[64, 96] ([96, 64] re-laid out)", "[128, 64]")
    assert not (tmp_path / "out").exists()
    cases = [
        (_edit_config(gpt2, tmp_path / "layer_scale", scale_attn_by_inverse_layer_idx=True), UnsupportedError,
         "scale_attn_by_inverse_layer_idx"),
        (_edit_config(gpt2, tmp_path / "cross", add_cross_attention=True), UnsupportedError, "add_cross_attention"),
        (_edit_config(gpt2, tmp_path / "act", activation_function="relu"), UnsupportedError, "'relu'"),
        (_edit_config(neox, tmp_path / "gqa", num_key_value_heads=2), UnsupportedError, "num_key_value_heads"),
        (_cut_rows(neox, tmp_path / "rows", "gpt_neox.layers.1.attention.query_key_value.weight"), InputError,
         "'gpt_neox.layers.1.attention.query_key_value.weight' has shape [189, 64]"),
    ]
    for src, error, needle in cases:
        with pytest.raises(error, match=needle.replace("(", r"\(").replace("[", r"\[")):
            convert(src, tmp_path / f"{src.name}-out", dtype="float32")


def test_float16_checkpoint_relaid_out_and_cast(family, tmp_path):
    """A float16 source: transformed tensors are re-laid out, then cast like every other (--dtype float32)."""
    hf_dir, ckpt, _ = family("gpt_neox")
    src = tmp_path / "hf16"
    shutil.copytree(hf_dir, src)
    load_hf(hf_dir).to(torch.float16).save_pretrained(src)
    convert(src, tmp_path / "ckpt", dtype="float32")
    got, want = load_file(tmp_path / "ckpt" / "rank0.safetensors"), load_file(ckpt / "rank0.safetensors")
    qkv = "layers.1.attn.qkv.weight"
    assert torch.equal(got[qkv], want[qkv].half().float())


@pytest.mark.parametrize("name", sorted(FAMILY_MODELS))
def test_folded_scales_leave_the_twin_unchanged(family, name, tmp_path):
    """AWQ / SmoothQuant fold 1/s into the op before each linear: a LayerNorm's weight AND bias for qkv and a
    plain MLP's up, the v rows for o; never into a plain MLP's up for down (act(up) lets no scale through)."""
    _, ckpt, engine = family(name)
    cfg = CheckpointConfig.load(ckpt).model
    tensors = {k: v.numpy() for k, v in load_file(ckpt / "rank0.safetensors").items()}
    rng = np.random.default_rng(1)  # scales far from 1, so a fold into the wrong op or rows shows
    in_features = {"attn.qkv": cfg.hidden_size, "mlp.up": cfg.hidden_size, "attn.o": cfg.q_dim}
    scales = {p: np.exp(rng.uniform(-1.6, 1.6, in_features[p.split(".", 2)[2]])).astype(np.float32)
              for p in foldable(cfg)}
    assert set(scales) == {f"layers.{i}.{p}" for i in range(cfg.num_layers) for p in in_features}
    folding = Folding(cfg, scales)
    folded = {n: folding.apply(n, t) if folding.touches(n) else t for n, t in tensors.items()}
    changed = {n for n in tensors if not np.array_equal(folded[n], tensors[n])}
    assert changed == {f"layers.{i}.{t}" for i in range(cfg.num_layers) for t in (
        "attn_norm.weight", "attn_norm.bias", "mlp_norm.weight", "mlp_norm.bias", "attn.qkv.weight",
        "attn.qkv.bias", "attn.o.weight", "mlp.up.weight")}

    shutil.copytree(ckpt, tmp_path / "ckpt")
    save_numpy(folded, tmp_path / "ckpt" / "rank0.safetensors", metadata={"format": "pt"})
    build(tmp_path / "ckpt", tmp_path / "engine", BuildConfig(targets=("onnxruntime",), dtype="float32", limits=LIMITS))
    prompt = prompt_of(20, seed=3)
    _, want = OrtDecoder(engine / "model.onnx").greedy(prompt, 4)
    _, got = OrtDecoder(tmp_path / "engine" / "model.onnx").greedy(prompt, 4)
    for g, w in zip(got, want, strict=True):  # float32 reassociation only: (x / s) (W s) rounds unlike x W
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * np.abs(w).max())


def test_gpt2_calibrates_within_its_learned_positions(family, tmp_path):
    """A calibrated scheme's default window shrinks to n_positions; a longer --calib-seq-len is refused."""
    hf_dir, _, engine = family("gpt2")
    n_positions = FAMILY_MODELS["gpt2"][2]["n_positions"]
    words = np.random.default_rng(0).integers(3, 320, 4 * n_positions)
    (tmp_path / "calib.txt").write_text(" ".join(f"w{i}" for i in words))  # the word tokenizer's own words
    with pytest.raises(InputError, match=f"--calib-seq-len {n_positions + 1} is past the {n_positions} positions"):
        convert(hf_dir, tmp_path / "bad", quant="w8a8_sq", calib=tmp_path / "calib.txt",
                calib_seq_len=n_positions + 1)
    assert not (tmp_path / "bad").exists()
    convert(hf_dir, tmp_path / "ckpt", quant="w8a8_sq", calib=tmp_path / "calib.txt")
    assert CheckpointConfig.load(tmp_path / "ckpt").quantization.calibration.seq_len == n_positions
    build(tmp_path / "ckpt", tmp_path / "engine", BuildConfig(targets=("onnxruntime",), dtype="float32", limits=LIMITS))
    prompt = prompt_of(20, seed=7)
    tokens, _ = OrtDecoder(tmp_path / "engine" / "model.onnx").greedy(prompt, 1)
    want, _ = OrtDecoder(engine / "model.onnx").greedy(prompt, 1)
    assert tokens == want  # int8 weights and activations keep the float model's first choice


@pytest.mark.parametrize("name", sorted(FAMILY_MODELS))
def test_fp16_twin_is_as_accurate_as_hf_fp16(family, name, tmp_path):
    """LayerNormalization with float32 statistics, Gelu and the lowered attention in float16: held to HF's own
    float16 error against float32, as every other family is (test_build_numerics.py)."""
    hf_dir, ckpt, _ = family(name)
    build(ckpt, tmp_path / "engine", BuildConfig(targets=("onnxruntime",), dtype="float16", limits=LIMITS))
    prompt = prompt_of(20, seed=8)
    with torch.no_grad():
        ref = load_hf(hf_dir)(torch.tensor([prompt])).logits[0, -1].numpy()
        hf16 = load_hf(hf_dir, torch.float16)(torch.tensor([prompt])).logits[0, -1].float().numpy()
    dec = OrtDecoder(tmp_path / "engine" / "model.onnx")
    got = dec.run(dec.empty(1), np.array([prompt]))[0, -1]
    assert np.abs(got - ref).max() <= 1.5 * np.abs(hf16 - ref).max()

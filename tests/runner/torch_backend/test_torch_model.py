"""The torch decoder (runner/torch_backend/model.py) against Hugging Face transformers, family by family.

Every decoder family the converter supports, as a tiny random model converted by `trtbuild convert`'s function,
run in float32 on the CPU over a paged pool of 4-token blocks handed out in shuffled order:

    prefill      every prompt position's logits equal transformers' forward
    generate     greedy tokens (and each step's logits) equal transformers' generate, through the pool; phi3
                 re-prefilled at the longrope switch as the runtime does (Backend.reprefill_after)
    batch        two sequences of different lengths in one flat forward, ragged query_start (a prefill beside a
                 decode, then two decodes), each get the logits they get alone
    long         phi3 past its longrope switch and llama's dynamic NTK past max_position_embeddings; the
                 sliding-window families' prompts are longer than their window everywhere
    no sync      the forward makes no host synchronization outside the attention function it is given

plus weight-only quantized checkpoints (equal to their dequantized weights), an engine dir, and the refusals.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
import transformers
from paged_run import PagedRun
from tiny_models import COMMON, FAMILY_MODELS, MOE_MODELS, TINY_MODELS, make_tiny_model, spread_routers
from torch.utils._python_dispatch import TorchDispatchMode

from converters.convert import convert
from converters.quantize.rtn import dequantize_blocked, dequantize_int8
from engine_builder.formats import graph_io as io
from engine_builder.formats.build_config import BuildConfig, Limits
from engine_builder.formats.checkpoint import WEIGHTS_FILE, CheckpointConfig
from engine_builder.formats.encoder_spec import EncoderSpec
from engine_builder.formats.quant_packing import pack_int4, unpack_int4
from engine_builder.formats.quantization import Quantization
from engine_builder.runner.torch_backend.checkpoint_tensors import LazySafetensors
from engine_builder.runner.torch_backend.device_kv_attention import paged_attention_ref
from engine_builder.runner.torch_backend.layers import linear, residual_add
from engine_builder.runner.torch_backend.model import TorchDecoder
from engine_builder.runner.torch_backend.rope_tables import RotaryTable, apply_rotary
from engine_builder.util.errors import UnsupportedError

PROMPT = 12
STEPS = 8
# float32 against transformers, relative to the logits' scale (tiny random models: ~0.5..7): they agree to float
# rounding (measured: at most 4e-6 absolute, 6e-7 of the scale, over every family and step)
TOL = 1e-4

# families tiny_models.py lacks, made with its recipe: the MoEs of tests/engine_builder/test_moe.py (8 experts,
# top-2, router weights spread so tokens pick many experts), dynamic NTK with a max_position_embeddings short
# enough to cross, and (make_model) multimodal gemma3, whose vision tower the converter drops
OTHER_MODELS: dict[str, tuple[str, str, dict]] = {
    "llama_dynamic": ("LlamaConfig", "LlamaForCausalLM", dict(
        max_position_embeddings=32, rope_scaling={"rope_type": "dynamic", "factor": 8.0})),
    **MOE_MODELS,
}
FAMILIES = sorted(TINY_MODELS) + sorted(FAMILY_MODELS) + sorted(OTHER_MODELS) + ["gemma3"]
# prompt lengths that cross what a family's rope decides by length: phi3's longrope switch at
# original_max_position_embeddings 64 (generation crosses it), dynamic NTK's max_position_embeddings 32
LONG_PROMPTS = {"phi3": 60, "llama_dynamic": 28}


def make_model(name: str, out: Path) -> Path:
    if name in TINY_MODELS or name in FAMILY_MODELS:
        return make_tiny_model(name, out)
    if name == "gemma3":  # multimodal: gemma3_text's decoder under a one-layer vision tower the converter drops
        config = transformers.Gemma3Config(
            text_config={**COMMON, **TINY_MODELS["gemma3_text"][2]}, mm_tokens_per_image=4,
            vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                               image_size=28, patch_size=14),
            image_token_index=COMMON["vocab_size"] - 1, boi_token_index=COMMON["vocab_size"] - 2,
            eoi_token_index=COMMON["vocab_size"] - 3)
        model_cls = "Gemma3ForConditionalGeneration"
    else:
        config_cls, model_cls, overrides = OTHER_MODELS[name]
        config = getattr(transformers, config_cls)(**{**COMMON, **overrides})
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).eval()
    spread_routers(model)
    model.save_pretrained(out)
    return out


def load_hf(hf_dir: Path) -> transformers.PreTrainedModel:
    # a fresh model per reference run: dynamic rope keeps state between calls
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32,
                                                              attn_implementation="eager")
    model.generation_config.eos_token_id = None  # random weights may emit EOS; we want every step
    return model.eval()


def prompt_of(length: int, seed: int = 0) -> list[int]:
    """Random ids past the special ones and below gemma3's image tokens (the vocabulary's last three)."""
    return np.random.default_rng(seed).integers(3, COMMON["vocab_size"] - 3, length).tolist()


@dataclass(frozen=True)
class Family:
    name: str
    hf_dir: Path
    ckpt: Path
    decoder: TorchDecoder


@pytest.fixture(scope="module")
def families(module_tmp_factory):
    """families(name) -> that family made, converted and loaded, once per module."""
    made: dict[str, Family] = {}

    def get(name: str) -> Family:
        if name not in made:
            base = module_tmp_factory.mktemp(name)
            hf_dir = make_model(name, base / "hf")
            convert(hf_dir, base / "ckpt")
            made[name] = Family(name, hf_dir, base / "ckpt",
                                TorchDecoder.from_dir(base / "ckpt", device="cpu", dtype=torch.float32))
        return made[name]

    return get


@pytest.fixture(params=FAMILIES)
def family(request, families) -> Family:
    return families(request.param)


def scale_of(reference: torch.Tensor) -> float:
    """The tolerance's unit: the logits' magnitude (random tiny models: ~0.5..6)."""
    return max(1.0, float(reference.abs().max()))


def test_prefill_logits_match_transformers(family):
    prompt = prompt_of(PROMPT)
    with torch.no_grad():
        want = load_hf(family.hf_dir)(torch.tensor([prompt])).logits[0]  # [prompt, vocab]
    got = PagedRun(family.decoder).step({"s": prompt})["s"]
    err = float((got - want).abs().max())
    assert err <= TOL * scale_of(want), f"{family.name}: max |logits - HF| {err:.2e}"


def _greedy_matches_transformers(family: Family, prompt: list[int], steps: int) -> None:
    out = load_hf(family.hf_dir).generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=steps,
                                          output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    want_tokens, want_logits = out.sequences[0, len(prompt):].tolist(), [step[0] for step in out.logits]
    tokens, logits = PagedRun(family.decoder).greedy(prompt, steps)
    errors = [float((g - w).abs().max()) / scale_of(w) for g, w in zip(logits, want_logits, strict=True)]
    assert max(errors) <= TOL, f"{family.name}: max |logits - HF| / scale per step: {[f'{e:.1e}' for e in errors]}"
    assert tokens == want_tokens


def test_greedy_generation_matches_transformers(family):
    window = family.decoder.cfg.block.attention.sliding_window
    assert window is None or window < PROMPT  # the sliding families attend past their window from the prompt on
    _greedy_matches_transformers(family, prompt_of(PROMPT, seed=1), STEPS)


def test_ragged_batch_equals_each_sequence_alone(family):
    """A prefill beside a decode, then two decodes of different lengths, in one flat forward each."""
    a, b = prompt_of(PROMPT, seed=2), prompt_of(7, seed=3)
    a1, a2, b1 = 5, 9, 11  # any tokens: the logits are compared, not sampled
    alone_a, alone_b = PagedRun(family.decoder, seed=4), PagedRun(family.decoder, seed=5)
    want_a = [alone_a.step({"a": a})["a"], alone_a.step({"a": [a1]})["a"], alone_a.step({"a": [a2]})["a"]]
    want_b = [alone_b.step({"b": b})["b"], alone_b.step({"b": [b1]})["b"]]
    both = PagedRun(family.decoder, seed=6)
    got_a0 = both.step({"a": a})["a"]
    mixed = both.step({"a": [a1], "b": b})  # decode + prefill: query_start [0, 1, 8]
    decode = both.step({"b": [b1], "a": [a2]})  # two decodes, context lengths 8 and 14
    pairs = [(got_a0, want_a[0]), (mixed["a"], want_a[1]), (mixed["b"], want_b[0]), (decode["a"], want_a[2]),
             (decode["b"], want_b[1])]
    for got, want in pairs:
        assert got.shape == want.shape
        err = float((got - want).abs().max())
        assert err <= 1e-5 * scale_of(want), f"{family.name}: batched vs alone {err:.2e}"


@pytest.mark.parametrize("name", sorted(LONG_PROMPTS))
def test_past_the_rope_switch(families, name):
    """phi3's longrope past original_max_position_embeddings (a re-prefill at the switch, as transformers' own
    generate re-computes its cache there) and dynamic NTK past max_position_embeddings."""
    family = families(name)
    cfg = family.decoder.cfg
    switch = family.decoder.reprefill_after or cfg.max_position_embeddings
    assert LONG_PROMPTS[family.name] < switch < LONG_PROMPTS[family.name] + STEPS
    _greedy_matches_transformers(family, prompt_of(LONG_PROMPTS[family.name], seed=7), STEPS)


SYNCS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default,
         torch.ops.aten.nonzero.default, torch.ops.aten.item.default}


class _SyncWatch(TorchDispatchMode):
    """Records every op that would make the host wait for the device, outside the attention function."""

    def __init__(self):
        super().__init__()
        self.inside_attention = False
        self.syncs: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in SYNCS and not self.inside_attention:
            self.syncs.append(str(func))
        return func(*args, **(kwargs or {}))


def test_forward_holds_no_host_sync_outside_attention(family):
    decoder, watch, calls = family.decoder, _SyncWatch(), []

    def attention(*args, **kwargs):
        calls.append(kwargs)
        watch.inside_attention = True
        try:
            return paged_attention_ref(*args, **kwargs)
        finally:
            watch.inside_attention = False

    run = PagedRun(decoder)
    decoder.attention = attention
    try:
        with watch:
            run.step({"a": prompt_of(6), "b": prompt_of(3, seed=1)})
            run.step({"a": [4], "b": [5]})  # the decode shape (and the MoE's gathered experts)
    finally:
        decoder.attention = paged_attention_ref
    assert watch.syncs == []
    spec = decoder.cfg.block.attention
    windows = [spec.sliding_window if t == "sliding_attention" else None for t in spec.layer_types]
    assert [c["sliding_window"] for c in calls] == windows * 2
    assert {c["softcap"] for c in calls} == {spec.logit_softcap}


@pytest.mark.parametrize("x_shape", [(1, 24), (5, 24), (2, 3, 24)])
@pytest.mark.parametrize("layout", ["column-major", "row-major"])
def test_cpu_linear_through_numpy_is_f_linear(x_shape, layout):
    """layers.linear's float32 CPU product (numpy's BLAS over the tensors' memory) equals F.linear for a weight as
    stored (row-major, TorchDecoder._linear's) or a column-major one, one token or several, a bias or none, a
    strided input; a float64 input takes F.linear."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(40, 24, generator=gen)
    if layout == "column-major":
        weight = weight.t().contiguous().t()
    bias = torch.randn(40, generator=gen)
    x = torch.randn(*x_shape[:-1], 2 * x_shape[-1], generator=gen)[..., ::2]  # not contiguous
    for b in (None, bias):
        got = linear(x, weight, b)
        assert got.shape == (*x_shape[:-1], 40) and got.dtype == torch.float32
        torch.testing.assert_close(got, F.linear(x, weight, b), rtol=1e-5, atol=1e-5)
    assert torch.equal(linear(x.double(), weight.double()), F.linear(x.double(), weight.double()))


def test_interleaved_rotary_is_rotate_half_with_its_channels_paired():
    """No converter sets rope.interleaved yet; the GPT-J form must be the rotate-half form with channel i of
    each half moved to pair (2i, 2i + 1)."""
    dim, positions = 8, torch.arange(5)
    halves = RotaryTable(dim, False, *_cos_sin(dim, interleaved=False))
    pairs = RotaryTable(dim, True, *_cos_sin(dim, interleaved=True))
    x = torch.randn(5, 3, dim + 4, generator=torch.Generator().manual_seed(0))  # partial: 4 channels pass
    to_pairs = torch.cat((torch.arange(dim).view(2, -1).T.reshape(-1), torch.arange(dim, dim + 4)))
    want = apply_rotary(x, *halves.cos_sin(positions, None), halves.interleaved)[..., to_pairs]
    got = apply_rotary(x[..., to_pairs], *pairs.cos_sin(positions, None), pairs.interleaved)
    assert torch.allclose(got, want, atol=1e-6)


def _cos_sin(dim: int, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2).float() / dim))
    freqs = torch.arange(5).float()[:, None] * inv_freq  # [5, dim / 2]
    emb = freqs.repeat_interleave(2, dim=-1) if interleaved else torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


# -- quantized checkpoints, an engine dir, refusals: one family (llama: GQA, llama3 rope) --


@pytest.fixture(scope="module")
def llama(module_tmp_factory) -> tuple[Path, Path]:
    base = module_tmp_factory.mktemp("llama_q")
    hf_dir = make_model("llama", base / "hf")
    convert(hf_dir, base / "ckpt")
    return hf_dir, base / "ckpt"


def _dequantized(cfg: CheckpointConfig, tensors: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """The float weights FORMAT.md says a quantized checkpoint holds, dequantized in numpy (rtn.py's helpers)."""
    q, out = cfg.quantization, {}
    for name, t in tensors.items():
        prefix = name.removesuffix(".weight")
        if prefix not in q.quantized:
            if not name.endswith(("_scale", "_zero", "_offset")):
                out[name] = torch.from_numpy(t.astype(np.float32))
            continue
        ql = q.for_linear(prefix)
        scale = tensors[prefix + ".weight_scale"].astype(np.float32)
        if t.dtype == np.int8:
            w = dequantize_int8(t, scale)  # per channel, or blocked
        else:
            zero = unpack_int4(tensors[prefix + ".weight_zero"], scale.shape[1], signed=False) if ql.zero_point \
                else None
            w = dequantize_blocked(unpack_int4(t, t.shape[1] * 2, signed=not ql.zero_point), scale, zero)
            if prefix + ".weight_offset" in tensors:  # gguf: + offset per block
                offset = tensors[prefix + ".weight_offset"].astype(np.float32)  # [out, blocks]
                w = w + np.repeat(offset, w.shape[1] // offset.shape[1], axis=1)
        out[name] = torch.from_numpy(np.asarray(w, np.float32))
    return out


def _logits(decoder: TorchDecoder) -> torch.Tensor:
    return PagedRun(decoder).step({"s": prompt_of(PROMPT)})["s"]


@pytest.mark.parametrize(("quant", "group"), [("int8_wo", None), ("int8_wo", 32), ("int4_wo", 32)])
def test_weight_only_quantized_checkpoint_equals_its_dequantized_weights(llama, tmp_path, quant, group):
    hf_dir, ckpt = llama
    convert(hf_dir, tmp_path / "q", quant=quant, group_size=group)
    qcfg = CheckpointConfig.load(tmp_path / "q")
    assert "lm_head" in qcfg.quantization.quantized and qcfg.quantization.weight_bits == int(quant[3])
    got = _logits(TorchDecoder.from_dir(tmp_path / "q", device="cpu", dtype=torch.float32))
    from safetensors.numpy import load_file

    twin = _dequantized(qcfg, load_file(tmp_path / "q" / WEIGHTS_FILE))
    want = _logits(TorchDecoder(qcfg.model, twin, device="cpu", dtype=torch.float32))
    assert float((got - want).abs().max()) <= 1e-5 * scale_of(want)
    float_logits = _logits(TorchDecoder.from_dir(ckpt, device="cpu", dtype=torch.float32))
    assert float((got - float_logits).abs().max()) > 1e-4  # the quantized weights were used, not float ones


def _ingested_int4(w: np.ndarray, scheme: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """w [out, in] in groups of 32 as FORMAT.md stores an ingested scheme, in numpy. awq: asymmetric, q in 0..15
    around a per-group zero (packed per row); gguf: signed q in -8..7, w = q * scale + offset."""
    out, inp = w.shape
    groups = w.reshape(out, inp // 32, 32)
    lo, hi = groups.min(axis=2), groups.max(axis=2)
    if scheme == "awq":
        lo, hi = np.minimum(lo, 0), np.maximum(hi, 0)
        scale = ((hi - lo) / 15).astype(np.float32)
        zero = np.clip(np.rint(-lo / scale) + rng.integers(-1, 2, scale.shape), 0, 15).astype(np.uint8)
        q = np.clip(np.rint(groups / scale[:, :, None]) + zero[:, :, None], 0, 15)
        return {".weight": pack_int4(q.reshape(out, inp)), ".weight_scale": scale, ".weight_zero": pack_int4(zero)}
    scale = ((hi - lo) / 15).astype(np.float32)
    offset = (lo + 8 * scale).astype(np.float32)
    q = np.clip(np.rint((groups - offset[:, :, None]) / scale[:, :, None]), -8, 7)
    return {".weight": pack_int4(q.reshape(out, inp)), ".weight_scale": scale, ".weight_offset": offset}


@pytest.mark.parametrize("scheme", ["awq", "gguf"])
def test_ingested_int4_layouts_equal_their_dequantized_weights(llama, scheme):
    """The layouts `convert` only ingests (awq / gptq checkpoints' uint4 + zeros, a GGUF's Q4_1 blocks with
    offsets), made here in numpy for three linears."""
    _, ckpt = llama
    cfg = CheckpointConfig.load(ckpt)
    file = LazySafetensors(ckpt / WEIGHTS_FILE)
    stored = {name: file[name].numpy() for name in file}
    prefixes = ("layers.0.attn.qkv", "layers.1.mlp.gate_up", "layers.1.mlp.down")
    rng = np.random.default_rng(0)
    for p in prefixes:
        stored |= {p + suffix: t for suffix, t in _ingested_int4(stored.pop(p + ".weight"), scheme, rng).items()}
    quant = Quantization(scheme=scheme, weight_bits=4, group_size=32, zero_point=scheme == "awq", quantized=prefixes)
    got = _logits(TorchDecoder(cfg.model, {k: torch.from_numpy(v) for k, v in stored.items()}, device="cpu",
                               dtype=torch.float32, quantization=quant))
    twin = _dequantized(dataclasses.replace(cfg, quantization=quant), stored)
    want = _logits(TorchDecoder(cfg.model, twin, device="cpu", dtype=torch.float32))
    assert float((got - want).abs().max()) <= 1e-5 * scale_of(want)


def test_an_engine_dir_loads_as_its_checkpoint_and_says_the_longrope_switch_as_its_graph(tmp_path):
    """phi3's engine dir: the same logits as its checkpoint, rotary tables up to the engine's max_seq_len, and
    reprefill_after = the trtbuild.reprefill_after the onnxruntime graph records."""
    from engine_builder.build.pipeline import build

    hf_dir = make_model("phi3", tmp_path / "hf")
    convert(hf_dir, tmp_path / "ckpt")
    build(tmp_path / "ckpt", tmp_path / "engine", BuildConfig(
        targets=("onnxruntime",), dtype="float32", limits=Limits(max_batch=2, max_input_len=64, max_seq_len=320)))
    engine = TorchDecoder.from_dir(tmp_path / "engine", device="cpu", dtype=torch.float32)
    ckpt = TorchDecoder.from_dir(tmp_path / "ckpt", device="cpu", dtype=torch.float32)
    graph = onnx.load(tmp_path / "engine" / "model.onnx", load_external_data=False)
    assert engine.reprefill_after == io.reprefill_after({p.key: p.value for p in graph.metadata_props}) == 64
    assert (engine.max_positions, ckpt.max_positions) == (320, 256)
    assert torch.equal(_logits(engine), _logits(ckpt))
    assert TorchDecoder.from_dir(tmp_path / "ckpt", device="cpu", dtype=torch.float32).reprefill_after == 64


def test_what_it_cannot_run_is_refused_in_one_line(llama):
    _, ckpt = llama
    cfg = CheckpointConfig.load(ckpt).model
    tensors = LazySafetensors(ckpt / WEIGHTS_FILE)
    cases = [
        (dict(quantization=Quantization(scheme="w8a8_sq", weight_bits=8, activation="int8",
                                        quantized=("layers.0.attn.qkv",))), "without --quant"),
        (dict(quantization=Quantization(scheme="fp8", activation="fp8", quantized=("layers.0.attn.qkv",))),
         "without --quant"),
        (dict(quantization=Quantization(kv_cache="int8")), "without --kv-cache"),
    ]
    for kwargs, needle in cases:
        with pytest.raises(UnsupportedError, match=needle) as err:
            TorchDecoder(cfg, tensors, device="cpu", dtype=torch.float32, **kwargs)
        assert "\n" not in str(err.value)
    with pytest.raises(UnsupportedError, match="encoder"):
        TorchDecoder(dataclasses.replace(cfg, encoder=EncoderSpec()), tensors, device="cpu", dtype=torch.float32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_compiled_residual_add_is_the_16_bit_add_bit_for_bit(dtype):
    """Under torch.compile residual_add writes a 16-bit sum as float32 adds rounded once (so inductor cannot make it
    an addmm): the same bits as the plain add, which computes in float32 and rounds, including where the sum
    overflows or rounds to even."""
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(64, 96, generator=gen) * 4).to(dtype)
    h = (torch.randn(64, 96, generator=gen) * 4).to(dtype)
    big = torch.finfo(dtype).max
    x[0, :3] = torch.tensor([big, -big, 1.0], dtype=dtype)
    # inf; a large cancellation; 1 + half an ulp, a tie that rounds to even (1)
    h[0, :3] = torch.tensor([big, big / 2, torch.finfo(dtype).eps / 2], dtype=dtype)
    compiled = torch.compile(residual_add, fullgraph=True, dynamic=False)
    want = x + h
    got = compiled(x, h)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert torch.equal(residual_add(x, h), want)  # eager: the plain add

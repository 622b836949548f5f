"""`convert --kv-cache int8`: per-channel KV-cache scales (FORMAT.md) equal to max |k| / 127 and max |v| / 127 of
what transformers caches (keys after rotary) on the same calibration windows, with any --quant scheme or none."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from checkpoint_to_hf import read_checkpoint
from runner_engines import add_word_tokenizer
from test_prequantized import GPTQ_CONFIG, write_prequantized
from test_quantize_errors import assert_refused, run_convert

from converters.convert import convert
from converters.quantize import calibration_text
from converters.quantize.quant_options import QuantOptions
from converters.sources.source import safetensors_header
from engine_builder.formats.checkpoint import CheckpointConfig, linear_prefixes
from engine_builder.util.errors import InputError

VOCAB, SAMPLES, SEQ_LEN = 320, 4, 32


@pytest.fixture(scope="module")
def words(module_tmp_factory) -> Path:
    """A text of random words; 30..99 only: the tokenizer's special "w0" / "w1" / "w2" would also match inside
    "w17", "w203"."""
    text = module_tmp_factory.mktemp("kv-text") / "words.txt"
    text.write_text(" ".join(f"w{i}" for i in np.random.default_rng(0).integers(30, 100, 400)))
    return text


@pytest.fixture(scope="module")
def kv_source(tiny_model_dir, module_tmp_factory, words):
    """kv_source(arch) -> (HF dir with a word tokenizer, its `--kv-cache int8` checkpoint, the ConvertResult)."""
    made: dict[str, tuple] = {}

    def get(arch: str) -> tuple:
        if arch not in made:
            root = module_tmp_factory.mktemp(f"kv-{arch}")
            hf = root / "hf"
            shutil.copytree(tiny_model_dir(arch), hf)
            add_word_tokenizer(hf, VOCAB)
            result = convert(hf, root / "ckpt", quant="none", kv_cache="int8", calib=words, calib_samples=SAMPLES,
                             calib_seq_len=SEQ_LEN)
            made[arch] = hf, root / "ckpt", result
        return made[arch]

    return get


def cache_scale_names(num_layers: int) -> list[str]:
    return [f"layers.{i}.attn.{kv}_cache_scale" for i in range(num_layers) for kv in "kv"]


def file_order(ckpt: Path) -> list[str]:
    _, header = safetensors_header(ckpt / "rank0.safetensors")
    return sorted((n for n in header if n != "__metadata__"), key=lambda n: header[n]["data_offsets"][0])


def hf_cache_scales(model: transformers.PreTrainedModel, ids: np.ndarray) -> dict[str, np.ndarray]:
    """"layers.{i}.attn.k_cache_scale" -> max |k| / 127 [kv_heads, head_dim] (0 -> 1) of the keys and values
    transformers caches for windows IDS [n, seq], each prefilled from an empty cache.

    A DynamicCache made without the config keeps every token of sliding-window layers too."""
    absmax: dict[str, np.ndarray] = {}
    with torch.no_grad():
        for window in ids:
            cache = transformers.DynamicCache()
            model(torch.tensor(window[None, :]), past_key_values=cache, use_cache=True)
            for i, layer in enumerate(cache.layers):
                for kv, x in (("k", layer.keys), ("v", layer.values)):  # [1, kv_heads, seq, head_dim]
                    a = x.abs().amax(dim=(0, 2)).numpy()  # [kv_heads, head_dim]
                    name = f"layers.{i}.attn.{kv}_cache_scale"
                    absmax[name] = np.maximum(absmax[name], a) if name in absmax else a
    return {name: np.where(a > 0, a / 127, 1.0) for name, a in absmax.items()}


def assert_scales_match(tensors: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    for name, scale in want.items():
        assert tensors[name].dtype == np.float32 and tensors[name].shape == scale.shape, name
        np.testing.assert_allclose(tensors[name], scale, rtol=1e-4, atol=1e-6 * scale.max(), err_msg=name)


def test_kv_cache_only_scales_match_hf_caches(kv_source, arch, words, tmp_path):
    hf, ckpt, result = kv_source(arch)
    cfg = CheckpointConfig.load(ckpt)
    block, model = cfg.quantization, cfg.model
    assert (block.scheme, block.weight_bits, block.group_size, block.activation, block.kv_cache) == \
        ("none", None, None, "none", "int8")
    assert block.quantized == () and block.excluded == ()
    text = calibration_text.load(words)
    info = block.calibration
    assert (info.source, info.sha256, info.samples, info.seq_len) == ("words.txt", text.sha256, SAMPLES, SEQ_LEN)
    assert (result.quantization, result.kv_cache, result.quantized) == ("none", "int8", 0)
    assert result.calibration_seconds > 0

    # the float weights are those of a plain convert, in its order; the scales come after them
    plain = tmp_path / "float"
    convert(hf, plain)
    tensors, float_tensors = read_checkpoint(ckpt), read_checkpoint(plain)
    scales = cache_scale_names(model.num_layers)
    assert file_order(ckpt) == [*file_order(plain), *scales]
    assert cfg.dtype == CheckpointConfig.load(plain).dtype
    assert cfg.num_tensors == result.tensors == len(tensors) == len(float_tensors) + 2 * model.num_layers
    for name, tensor in float_tensors.items():
        np.testing.assert_array_equal(tensors[name], tensor, err_msg=name)
    for name in scales:
        assert tensors[name].shape == (model.num_kv_heads, model.head_dim)

    # the exact windows collect() prefilled, run by transformers
    ids = calibration_text.windows(text, ckpt, SAMPLES, SEQ_LEN)  # [samples, seq]
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32,
                                                                 attn_implementation="eager")
    assert_scales_match(tensors, hf_cache_scales(hf_model.eval(), ids))


def test_kv_cache_with_a_weight_scheme(kv_source, words, tmp_path):
    """int8_wo + --kv-cache int8: the quantized linears and the scales, the same scales as without int8_wo (both
    calibrate the same float32 checkpoint)."""
    hf, kv_only, _ = kv_source("llama")
    out = tmp_path / "ckpt"
    result = convert(hf, out, quant="int8_wo", kv_cache="int8", calib=words, calib_samples=SAMPLES,
                     calib_seq_len=SEQ_LEN)
    cfg = CheckpointConfig.load(out)
    block = cfg.quantization
    assert (block.scheme, block.weight_bits, block.kv_cache) == ("int8_wo", 8, "int8")
    assert block.quantized == linear_prefixes(cfg.model) and block.calibration.samples == SAMPLES
    tensors, expected = read_checkpoint(out), read_checkpoint(kv_only)
    for prefix in block.quantized:
        assert tensors[f"{prefix}.weight"].dtype == np.int8 and f"{prefix}.weight_scale" in tensors
    scales = cache_scale_names(cfg.model.num_layers)
    assert file_order(out)[-len(scales):] == scales
    for name in scales:
        assert tensors[name].dtype == np.float32
        np.testing.assert_array_equal(tensors[name], expected[name], err_msg=name)
    assert (result.quantization, result.kv_cache, result.quantized) == ("int8_wo", "int8", len(block.quantized))
    assert cfg.num_tensors == result.tensors == len(tensors)


def test_calibration_runs_once_for_scheme_and_cache(kv_source, words, tmp_path):
    hf, kv_only, _ = kv_source("llama")
    calls = []
    convert(hf, tmp_path / "ckpt", quant="w8a8_sq", kv_cache="int8", calib=words, calib_samples=SAMPLES,
            calib_seq_len=SEQ_LEN, progress=lambda stage, n, total: calls.append((stage, n, total)))
    assert [c for c in calls if c[0] == "calibrating"] == [("calibrating", n, SAMPLES) for n in range(1, SAMPLES + 1)]
    tensors, expected = read_checkpoint(tmp_path / "ckpt"), read_checkpoint(kv_only)
    assert "layers.0.attn.qkv.input_scale" in tensors
    for name in cache_scale_names(2):
        np.testing.assert_array_equal(tensors[name], expected[name], err_msg=name)


def test_half_precision_weights_keep_float32_scales(kv_source, words, tmp_path):
    """A float16 checkpoint stays float16 (no scheme: dtype auto keeps the source's) but its cache scales are
    float32, calibrated on its float16-rounded weights."""
    hf, _, _ = kv_source("llama")
    out = tmp_path / "ckpt"
    convert(hf, out, dtype="float16", kv_cache="int8", calib=words, calib_samples=SAMPLES, calib_seq_len=SEQ_LEN)
    tensors = read_checkpoint(out)
    assert CheckpointConfig.load(out).dtype == "float16" and tensors["embed.weight"].dtype == np.float16
    ids = calibration_text.windows(calibration_text.load(words), out, SAMPLES, SEQ_LEN)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32, attn_implementation="eager")
    assert_scales_match(tensors, hf_cache_scales(model.half().float().eval(), ids))


def test_fp8_kv_cache_is_refused(kv_source, tmp_path):
    hf, _, _ = kv_source("llama")
    out = tmp_path / "out"
    assert_refused(run_convert(hf, out, "--kv-cache", "fp8"), out, "--kv-cache fp8 is not supported",
                   "no fp8-cache kernel", "use --kv-cache int8 (onnxruntime target)")


def test_calib_is_accepted_for_the_kv_cache_alone(kv_source, words, tmp_path):
    """--calib feeds the KV-cache scales even when the scheme needs no calibration (int8_wo)."""
    hf, _, _ = kv_source("llama")
    out = tmp_path / "out"
    proc = run_convert(hf, out, "--quant", "int8_wo", "--kv-cache", "int8", "--calib", words, "--calib-samples",
                       SAMPLES, "--calib-seq-len", SEQ_LEN, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["quantization"], report["kv_cache"]) == ("int8_wo", "int8")
    assert report["tensors"] == CheckpointConfig.load(out).num_tensors
    assert CheckpointConfig.load(out).quantization.calibration.source == "words.txt"
    # without the KV cache, --calib still has nothing to feed
    with pytest.raises(InputError, match="drop --calib"):
        QuantOptions("int8_wo", calib=words).validate()
    QuantOptions("none", kv_cache="int8", calib=words).validate()


def test_kv_cache_on_a_prequantized_source_is_refused(tiny_model_dir, tmp_path):
    src = tmp_path / "src"
    write_prequantized(tiny_model_dir("llama"), src, "gptq", GPTQ_CONFIG)
    out = tmp_path / "out"
    assert_refused(run_convert(src, out, "--kv-cache", "int8"), out,
                   "--kv-cache int8 is not supported yet for a pre-quantized (gptq) source", "drop --kv-cache")


def test_kv_cache_needs_a_tokenizer(tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(InputError, match="--kv-cache int8 calibrates on text tokenized .* use --kv-cache none"):
        convert(tiny_model_dir("llama"), out, kv_cache="int8")
    assert not list(tmp_path.iterdir())

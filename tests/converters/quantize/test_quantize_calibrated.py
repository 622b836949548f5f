"""`convert --quant int4_awq / w8a8_sq / fp8` on a tiny llama with a word tokenizer: FORMAT.md's tensors, the
calibration record, and the checkpoint run by transformers (weights dequantized, inputs fake-quantized)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from checkpoint_to_hf import canonical_to_hf, dequantized, hf_model, read_checkpoint
from runner_engines import add_word_tokenizer

from converters.convert import convert
from converters.quantize import calibration_text, smoothquant
from converters.quantize.calibrate import collect
from engine_builder.formats.checkpoint import CheckpointConfig

VOCAB, SAMPLES, SEQ_LEN, GROUP = 320, 4, 32, 32


@pytest.fixture(scope="module")
def calibrated(tiny_model_dir, module_tmp_factory):
    """HF dir with a word tokenizer, a text of random words, and the checkpoint of every scheme."""
    root = module_tmp_factory.mktemp("calibrated")
    hf = root / "hf"
    shutil.copytree(tiny_model_dir("llama"), hf)
    add_word_tokenizer(hf, VOCAB)
    # 30..99 only: the tokenizer's special "w0" / "w1" / "w2" would also match inside "w17", "w203"
    text = root / "words.txt"
    text.write_text(" ".join(f"w{i}" for i in np.random.default_rng(0).integers(30, 100, 400)))
    ckpts = {"float32": root / "float32"}
    convert(hf, ckpts["float32"], dtype="float32")
    for scheme in ("int4_wo", "int4_awq", "w8a8_sq", "fp8"):
        calib = {"calib": text, "calib_samples": SAMPLES, "calib_seq_len": SEQ_LEN} if scheme != "int4_wo" else {}
        group = {"group_size": GROUP} if scheme.startswith("int4") else {}
        ckpts[scheme] = root / scheme
        convert(hf, ckpts[scheme], quant=scheme, **group, **calib)
    return hf, text, ckpts


def test_calibrated_checkpoints_follow_the_format(calibrated):
    _, text, ckpts = calibrated
    loaded = calibration_text.load(text)
    for scheme, activation in (("int4_awq", "none"), ("w8a8_sq", "int8"), ("fp8", "fp8")):
        cfg = CheckpointConfig.load(ckpts[scheme])
        block = cfg.quantization
        assert (block.scheme, block.activation, block.zero_point) == (scheme, activation, False)
        assert block.weight_bits == {"int4_awq": 4, "w8a8_sq": 8, "fp8": None}[scheme]
        assert block.group_size == (GROUP if scheme == "int4_awq" else None)
        info = block.calibration
        assert (info.source, info.sha256, info.samples, info.seq_len) == ("words.txt", loaded.sha256, SAMPLES, SEQ_LEN)
        tensors = read_checkpoint(ckpts[scheme])
        for prefix in block.quantized:
            q, scale = tensors[f"{prefix}.weight"], tensors[f"{prefix}.weight_scale"]
            if scheme == "int4_awq" and prefix == "lm_head":  # weight-only: lm_head int8 per channel by default
                assert block.lm_head == "int8" and q.dtype == np.int8 and scale.shape == (q.shape[0],)
            elif scheme == "int4_awq":
                assert q.dtype == np.uint8 and scale.shape == (q.shape[0], q.shape[1] * 2 // GROUP)
                assert f"{prefix}.input_scale" not in tensors
            else:
                assert q.dtype == (np.int8 if scheme == "w8a8_sq" else np.uint8)  # fp8: e4m3 bytes
                assert scale.shape == ((q.shape[0],) if scheme == "w8a8_sq" else ())
                input_scale = tensors[f"{prefix}.input_scale"]
                assert input_scale.dtype == np.float32 and input_scale.shape == () and input_scale > 0


def test_w8a8_input_scale_is_of_the_smoothed_activation(calibrated):
    """qkv's smoothing scale s is recoverable from the folded norm (llama: w / s); its input scale must be
    max(absmax / s) / 127 of the calibration statistics, taken again here on the float checkpoint."""
    _, text, ckpts = calibrated
    data = collect(ckpts["float32"], calibration_text.load(text), SAMPLES, SEQ_LEN)
    fp, sq = read_checkpoint(ckpts["float32"]), read_checkpoint(ckpts["w8a8_sq"])
    for i in range(2):
        s = fp[f"layers.{i}.attn_norm.weight"] / sq[f"layers.{i}.attn_norm.weight"]  # [hidden]
        assert np.abs(s - 1).max() > 0.1  # really smoothed
        want = smoothquant.activation_scale(data.inputs[f"layers.{i}.attn.qkv"].absmax, s)
        np.testing.assert_allclose(sq[f"layers.{i}.attn.qkv.input_scale"], want, rtol=1e-6)


def logit_error(hf, ckpt, activation: str, ids: torch.Tensor, reference: np.ndarray) -> float:
    tensors, input_scales = dequantized(ckpt)
    model = hf_model(hf, canonical_to_hf(tensors, "llama", CheckpointConfig.load(ckpt).model), input_scales,
                     activation)
    with torch.no_grad():
        got = model(ids).logits.numpy()
    return float(np.mean((got - reference) ** 2))


def test_quantized_checkpoints_run_close_to_float_in_transformers(calibrated):
    """On held-out windows: AWQ beats plain int4 round-to-nearest at the same group size, and the 8-bit
    schemes (weights and activations quantized) beat both."""
    hf, _, ckpts = calibrated
    ids = torch.from_numpy(np.random.default_rng(3).integers(30, 100, (4, SEQ_LEN)))  # not the calibration text
    with torch.no_grad():
        reference = hf_model(hf)(ids).logits.numpy()
    errors = {scheme: logit_error(hf, ckpts[scheme], activation, ids, reference)
              for scheme, activation in (("int4_wo", "none"), ("int4_awq", "none"), ("w8a8_sq", "int8"),
                                         ("fp8", "fp8"))}
    assert errors["int4_awq"] < errors["int4_wo"], errors
    assert max(errors["w8a8_sq"], errors["fp8"]) < errors["int4_awq"], errors
    assert min(errors.values()) > 0, errors

"""AWQ scale search: the folding algebra, and lower int4 output error than plain RTN on tokens the
search never saw, on synthetic outlier channels and on SmolLM2's real weights and activations."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors import safe_open

from converters.quantize import calibration_text
from converters.quantize.awq import CLIP_GRID, CLIP_STEPS, clip, output_error, search_clip, search_scales
from converters.quantize.calibrate import collect
from converters.quantize.rtn import dequantize_blocked, quantize_int4_blocked
from engine_builder.util.errors import InputError

GROUP = 64  # divides SmolLM2's 576 and 1536 input channels (128 does not divide 576)


def activations(rng: np.random.Generator, n: int, channels: int, outliers: tuple[int, ...]) -> np.ndarray:
    x = rng.standard_normal((n, channels)).astype(np.float32)
    x[:, list(outliers)] *= 20
    return x


def test_output_error_is_the_folded_linears_error():
    """(x / s) @ Q(W * s)^T is what the quantized graph computes once 1/s is folded into the op before."""
    rng = np.random.default_rng(0)
    w, x = rng.standard_normal((32, 128)).astype(np.float32), rng.standard_normal((16, 128)).astype(np.float32)
    s = rng.uniform(0.5, 2, 128).astype(np.float32)
    q, scale = quantize_int4_blocked(w * s, GROUP)
    graph_out = (x / s) @ dequantize_blocked(q, scale).T  # [n, out]
    want = np.mean(np.square((x @ w.T).astype(np.float64) - graph_out))
    assert np.isclose(output_error(w, x, s, GROUP), want, rtol=1e-4)


def test_scales_beat_rtn_on_held_out_outlier_activations():
    rng = np.random.default_rng(0)
    outliers = (5, 77, 200)
    w = (rng.standard_normal((128, 256)) * 0.05).astype(np.float32)
    calib, held = activations(rng, 512, 256, outliers), activations(rng, 512, 256, outliers)
    s = search_scales(w, calib, GROUP)
    assert s.shape == (256,) and s.dtype == np.float32
    # the outlier channels get the largest scales: their weights keep the most precision
    assert set(np.argsort(s)[-3:]) == set(outliers)
    rtn, awq = output_error(w, held, np.ones_like(s), GROUP), output_error(w, held, s, GROUP)
    assert awq < 0.5 * rtn, (rtn, awq)  # measured 0.32


def test_never_worse_than_rtn_on_the_sample():
    """Without outliers there is little to gain, but alpha = 0 (s = 1) bounds the search's result by RTN."""
    rng = np.random.default_rng(2)
    w, x = rng.standard_normal((64, 128)).astype(np.float32), rng.standard_normal((200, 128)).astype(np.float32)
    s = search_scales(w, x, 32)
    assert output_error(w, x, s, 32) <= output_error(w, x, np.ones_like(s), 32)


def test_group_size_must_divide_input_channels():
    with pytest.raises(InputError, match="--group-size 128 does not divide weight's 576 input channels"):
        search_scales(np.ones((8, 576), np.float32), np.ones((4, 576), np.float32), 128)


def clipped_error(w: np.ndarray, x: np.ndarray, limits: np.ndarray | None) -> float:
    """Mean squared output error of int4 RTN of W, clamped to LIMITS first when given."""
    q, scale = quantize_int4_blocked(w if limits is None else clip(w, limits), GROUP)
    diff = x @ (w - dequantize_blocked(q, scale)).T
    return float(np.mean(np.square(diff, dtype=np.float64)))


def test_clip_limits_are_the_quantizers_ranges():
    """Clamped to its limits, a group's amax is its limit: the int4 scale is limit / 7, from the grid."""
    rng = np.random.default_rng(3)
    w, x = rng.standard_normal((16, 128)).astype(np.float32), rng.standard_normal((64, 128)).astype(np.float32)
    limits = search_clip(w, x, GROUP)
    amax = np.abs(w).reshape(16, -1, GROUP).max(axis=2)
    assert limits.shape == (16, 128 // GROUP) and limits.dtype == np.float32
    ratios = limits / amax
    grid = 1 - np.arange(CLIP_STEPS) / CLIP_GRID
    assert np.isclose(ratios[..., None], grid, atol=1e-6).any(axis=-1).all()
    _, scale = quantize_int4_blocked(clip(w, limits), GROUP)
    assert np.allclose(scale, limits / 7, rtol=1e-6)


def test_clip_beats_rtn_on_held_out_tokens():
    """Gaussian weights: clipping the rare largest weights buys finer steps for all the others."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((128, 256)).astype(np.float32)
    calib, held = activations(rng, 512, 256, ()), activations(rng, 512, 256, ())
    limits = search_clip(w, calib, GROUP)
    assert (limits < np.abs(w).reshape(128, -1, GROUP).max(axis=2)).mean() > 0.5  # most groups are clipped
    rtn, clipped = clipped_error(w, held, None), clipped_error(w, held, limits)
    assert clipped < 0.9 * rtn, (rtn, clipped)


def test_scales_beat_rtn_on_smollm2_layers(smollm2_ckpt):
    """Real weights and activations: searched on half the calibration tokens, scored on the other half."""
    data = collect(smollm2_ckpt, calibration_text.load(None), samples=4, seq_len=128)
    ratios = {}
    with safe_open(smollm2_ckpt / "rank0.safetensors", "np") as f:
        for name in ("layers.0.attn.qkv", "layers.0.attn.o", "layers.15.attn.qkv", "layers.15.mlp.down",
                     "layers.29.mlp.gate_up", "layers.29.mlp.down"):
            w, sample = f.get_tensor(f"{name}.weight"), data.inputs[name].sample  # [out, in], [512, in]
            s = search_scales(w, sample[0::2], GROUP)
            held = sample[1::2]
            ratios[name] = output_error(w, held, s, GROUP) / output_error(w, held, np.ones_like(s), GROUP)
    # measured 0.28 .. 0.85 of RTN's error
    assert max(ratios.values()) < 0.9, ratios

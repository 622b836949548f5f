"""SmoothQuant scales: on activations with outlier channels, smoothing cuts the error of W8A8
(per-tensor static int8 activations x per-channel int8 weights), on synthetic data and on SmolLM2."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors import safe_open

from converters.quantize import calibration_text
from converters.quantize.calibrate import collect
from converters.quantize.rtn import INT8_MAX, dequantize_int8, quantize_int8_per_channel
from converters.quantize.smoothquant import MIN_SCALE, activation_scale, smooth_scales
from engine_builder.util.errors import InputError


def w8a8_error(x: np.ndarray, w: np.ndarray, x_absmax: np.ndarray, scales: np.ndarray) -> float:
    """Relative error of (x/s) @ (W*s)^T through int8 activations (static per-tensor) and int8 weights."""
    xs = x / scales  # [n, in]
    x_scale = activation_scale(x_absmax, scales)
    x_q = np.clip(np.rint(xs / x_scale), -INT8_MAX, INT8_MAX) * x_scale
    w_q = dequantize_int8(*quantize_int8_per_channel(w * scales))  # [out, in]
    want = x @ w.T  # [n, out]
    return float(np.linalg.norm(x_q @ w_q.T - want) / np.linalg.norm(want))


def outlier_activations(rng: np.random.Generator, n: int, channels: int) -> np.ndarray:
    x = rng.standard_normal((n, channels)).astype(np.float32)
    x[:, [3, 20, 50]] *= 60  # the few huge channels LLM activations have
    return x


def test_smoothing_reduces_w8a8_error_on_outlier_channels():
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((96, 128)) * 0.05).astype(np.float32)
    calib, held = outlier_activations(rng, 1024, 128), outlier_activations(rng, 512, 128)
    absmax = np.abs(calib).max(axis=0)
    plain = w8a8_error(held, w, absmax, np.ones(128, np.float32))
    smoothed = w8a8_error(held, w, absmax, smooth_scales(w, absmax))
    assert smoothed < 0.25 * plain, (plain, smoothed)  # measured 0.20: 5.8 % -> 1.1 % relative error


def test_half_alpha_balances_activation_and_weight_ranges():
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((32, 64)) * rng.uniform(0.01, 1, 64)).astype(np.float32)
    absmax = np.abs(outlier_activations(rng, 256, 64)).max(axis=0)
    s = smooth_scales(w, absmax)
    assert s.shape == (64,) and s.dtype == np.float32
    # per channel: max|x_j / s_j| == max|W_j * s_j| = sqrt(max|x_j| max|W_j|)
    np.testing.assert_allclose(absmax / s, np.abs(w * s).max(axis=0), rtol=1e-5)
    # alpha 0 moves everything into the activations: every weight column ends with max 1
    np.testing.assert_allclose(np.abs(w * smooth_scales(w, absmax, alpha=0.0)).max(axis=0), 1.0, rtol=1e-6)
    # the stored activation scale maps the smoothed max onto 127 exactly: nothing clips
    assert np.isclose((absmax / s).max() / activation_scale(absmax, s), INT8_MAX, rtol=1e-6)


def test_dead_channels_stay_finite_and_alpha_is_checked():
    w = np.ones((4, 3), np.float32)
    w[:, 1] = 0
    s = smooth_scales(w, np.array([2.0, 5.0, 0.0], np.float32))
    assert np.isfinite(s).all() and (s >= MIN_SCALE).all()
    with pytest.raises(InputError, match=r"alpha 1.5 is outside \[0, 1\]"):
        smooth_scales(w, np.ones(3, np.float32), alpha=1.5)


def test_smoothing_helps_smollm2_linears(smollm2_ckpt):
    """Real weights and real activations: every tested linear gets lower W8A8 error on held-out tokens."""
    data = collect(smollm2_ckpt, calibration_text.load(None), samples=2, seq_len=128)
    with safe_open(smollm2_ckpt / "rank0.safetensors", "np") as f:
        for name in ("layers.0.attn.qkv", "layers.10.mlp.gate_up", "layers.20.mlp.down", "layers.29.mlp.down"):
            w, stats = f.get_tensor(f"{name}.weight"), data.inputs[name]
            held = stats.sample[1::2]  # [n/2, in]
            absmax = np.abs(stats.sample[0::2]).max(axis=0)  # calibrated on the other half
            plain = w8a8_error(held, w, absmax, np.ones_like(absmax))
            smoothed = w8a8_error(held, w, absmax, smooth_scales(w, absmax))
            assert smoothed < 0.7 * plain, (name, plain, smoothed)  # measured 0.40 .. 0.64

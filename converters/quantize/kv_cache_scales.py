"""Static per-channel scales of an int8 KV cache (`--kv-cache int8`), from calibrated max |k| and |v|.

    scales = kv_cache_scales(calib.caches)   # "layers.3.attn.k_cache_scale" -> f32 [kv_heads, head_dim]

The graph stores q = saturate_int8(round_half_even(x / scale)) and reads x' = q * scale
(FORMAT.md), so scale = absmax / 127 maps every calibrated key and value into -127..127.
"""

from __future__ import annotations

import numpy as np

from converters.quantize.rtn import INT8_MAX, symmetric_scale

SCALE_DTYPE = "float32"  # whatever the checkpoint dtype: the cache's only precision is in these scales


def kv_cache_scales(absmax: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Cache prefix ("layers.3.attn.k_cache") -> max |x| [kv_heads, head_dim]  =>  "{prefix}_scale" -> scale.

    A channel that was 0 on every calibration token gets scale 1.0 (rtn.symmetric_scale)."""
    return {f"{prefix}_scale": symmetric_scale(a, INT8_MAX) for prefix, a in absmax.items()}  # [kv_heads, head_dim]

"""What `--quant NAME` means, one registered QuantScheme per name (converters/quantize/schemes/).

A scheme says how a float linear becomes the tensors FORMAT.md stores for it (`layout`, `quantize`),
what its checkpoint's quantization block records (bits, activations, groups), and, for the
calibrated ones, how activation statistics turn into scales (`smoothing_scales`, `input_scale`,
`clip`). quantized_checkpoint.py runs any scheme through this interface and names none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

import numpy as np

from engine_builder.util.errors import InputError

if TYPE_CHECKING:
    from converters.quantize.calibrate import LinearInputStats

# (tensor name, dtype, shape), in the torch dtype spelling of converters/safetensors_writer.py
Layout = list[tuple[str, str, tuple[int, ...]]]
Groups = Literal["never", "optional", "always"]


class QuantScheme:
    name: ClassVar[str]
    weight_bits: ClassVar[int | None] = None  # 8 or 4; None: the dtype says it (fp8)
    activation: ClassVar[Literal["none", "int8", "fp8"]] = "none"  # static per-tensor input quantization
    calibrated: ClassVar[bool] = False  # scales come from activation statistics of calibration text
    smooths: ClassVar[bool] = False  # folds a per-input-channel scale out of each input (smoothing_scales)
    groups: ClassVar[Groups] = "never"  # per-group weight scales: never, on --group-size, or always
    default_group: ClassVar[int | None] = None  # with groups "always", when --group-size is not given
    # the blocks come from the source file as they are (gguf): convert.py writes them, nothing is re-quantized
    from_source: ClassVar[bool] = False

    def layout(self, prefix: str, out: int, inp: int, dtype: str, group_size: int | None) -> Layout:
        """What the checkpoint holds for linear PREFIX of weight [out, inp]; DTYPE is the checkpoint's float
        dtype; group_size None: one scale per output channel."""
        raise NotImplementedError(f"--quant {self.name} stores no re-quantized linears")

    def quantize(self, w: np.ndarray, group_size: int | None, input_scale: float | None) -> list[np.ndarray]:
        """w: [out, in] float32 (smoothing scales already folded in) -> arrays in `layout`'s order."""
        raise NotImplementedError(f"--quant {self.name} stores no re-quantized linears")

    def smoothing_scales(self, w: np.ndarray, stats: LinearInputStats, group_size: int | None) -> np.ndarray:
        """The per-input-channel scale s [in] folded out of the linear's input (schemes that smooth)."""
        raise NotImplementedError(f"--quant {self.name} folds no scales")

    def input_scale(self, absmax: np.ndarray, smoothing: np.ndarray | None) -> float | None:
        """The static scale of the linear's input (activation != "none"), from its per-channel absmax [in]."""
        return None

    def clip(self, w: np.ndarray, x: np.ndarray, group_size: int | None) -> np.ndarray:
        """w [out, in] clamped to limits searched on the input it will meet, x [n, in]; as is by default."""
        return w


_REGISTRY: dict[str, QuantScheme] = {}


def register_scheme(cls: type[QuantScheme]) -> type[QuantScheme]:
    _REGISTRY[cls.name] = cls()
    return cls


def scheme_names() -> tuple[str, ...]:
    """Every registered scheme, in registration order (schemes/__init__.py)."""
    return tuple(_REGISTRY)


def get_scheme(name: str) -> QuantScheme:
    if name not in _REGISTRY:
        raise InputError(f"--quant {name!r} is not a scheme; choose one of none, {', '.join(_REGISTRY)}")
    return _REGISTRY[name]

"""gguf: a .gguf source's own Q4_0/Q4_1/Q4_K blocks kept as they are (converters/quantize/gguf_blocks.py);
nothing is re-quantized, so the scheme stores what the source holds rather than what `quantize` makes."""

from __future__ import annotations

from converters.quantize.scheme import QuantScheme, register_scheme


@register_scheme
class GGUFBlocks(QuantScheme):
    name = "gguf"
    weight_bits = 4
    from_source = True

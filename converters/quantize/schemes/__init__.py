"""One registered module per `--quant` scheme; importing this package registers every one of them, in the
order `trtbuild convert --help` and the error messages list them."""

# isort: off
from converters.quantize.schemes import int8_wo, int4_wo, int4_awq, w8a8_sq, fp8_e4m3, gguf_q4  # noqa: F401
# isort: on

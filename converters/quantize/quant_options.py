"""What `trtbuild convert --quant ...` was asked for, checked before any expensive work."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path

import converters.quantize.schemes  # noqa: F401  (registers every scheme)
from converters.quantize.scheme import get_scheme, scheme_names
from engine_builder.formats.checkpoint import expected_shapes, linear_prefixes
from engine_builder.formats.model_config import ModelConfig
from engine_builder.util.errors import InputError, UnsupportedError

SCHEMES = ("none", *scheme_names())
# schemes whose scales come from activation statistics of calibration text
CALIBRATED = tuple(n for n in scheme_names() if get_scheme(n).calibrated)
GROUP_SIZES = (32, 64, 128)
GROUPED = tuple(n for n in scheme_names() if get_scheme(n).groups != "never")  # per-group weight scales
KV_CACHE = ("none", "int8", "fp8")
LM_HEAD = ("float", "int8", "same")


@dataclass(frozen=True)
class QuantOptions:
    scheme: str = "none"
    # input channels per scale; None = the scheme's default: its default_group where it always has
    # groups (int4), one scale per output channel otherwise (see `groups`)
    group_size: int | None = None
    kv_cache: str = "none"
    calib: Path | None = None  # None: the shipped calibration text
    # None: calibrate.DEFAULT_SAMPLES / DEFAULT_SEQ_LEN (not imported here: it loads onnxruntime)
    calib_samples: int | None = None
    calib_seq_len: int | None = None
    exclude: tuple[str, ...] = ()  # fnmatch patterns over linear prefixes kept in full precision
    # --lm-head: float, int8 (per output channel) or same (as the body); None: the scheme's default (lm_head_mode)
    lm_head: str | None = None

    @property
    def calibrated(self) -> bool:
        """Does the scheme take its scales from calibration text?"""
        return self.scheme in CALIBRATED

    @property
    def needs_calibration(self) -> bool:
        """Does anything asked for (the scheme, or an int8 KV cache's scales) need calibration text?"""
        return self.calibrated or self.kv_cache == "int8"

    @property
    def quantizing(self) -> bool:
        """Is the checkpoint changed at all: a scheme, or KV-cache scales to add?"""
        return self.scheme != "none" or self.kv_cache != "none"

    @property
    def lm_head_mode(self) -> str:
        """How lm_head is stored: "float", "int8" (per output channel) or "same" (as the body).

        Weight-only schemes default to int8: a 4-bit lm_head is the costliest place to lose precision
        (every logit), and a float one is most of the bytes a small model reads per token (SmolLM2 int4:
        113 of ~190 MB). Schemes that quantize activations keep theirs ("same")."""
        if self.lm_head is not None:
            return self.lm_head
        if self.scheme == "none":
            return "same"
        if any(fnmatch.fnmatchcase("lm_head", p) for p in self.exclude):
            return "float"
        scheme = get_scheme(self.scheme)
        weight_only = scheme.activation == "none" and not scheme.from_source and scheme.weight_bits is not None
        if not weight_only or (scheme.weight_bits == 8 and self.groups is None):
            return "same"  # activation schemes keep theirs; int8_wo per channel already is int8 per channel
        return "int8"

    @property
    def groups(self) -> int | None:
        """Input channels per weight scale as the checkpoint stores them; None = per output channel."""
        groups = get_scheme(self.scheme).groups if self.scheme != "none" else "never"
        if groups == "always":
            return self.group_size or get_scheme(self.scheme).default_group
        return self.group_size if groups == "optional" else None

    def validate(self) -> None:
        if self.scheme not in SCHEMES:
            raise InputError(f"--quant {self.scheme!r} is not a scheme; choose one of {', '.join(SCHEMES)}")
        if self.group_size is not None and self.group_size not in GROUP_SIZES:
            raise InputError(f"--group-size {self.group_size} is not supported; choose one of "
                             f"{', '.join(map(str, GROUP_SIZES))}")
        if self.scheme != "none" and get_scheme(self.scheme).from_source and (
                self.group_size is not None or self.kv_cache != "none"):
            raise UnsupportedError("--quant gguf keeps the file's own blocks of 32 inputs as they are, so it takes "
                                   "no --group-size, and no --kv-cache yet (its scales need a float checkpoint "
                                   "to calibrate); drop them, or use --quant int4_awq")
        if self.group_size is not None and self.scheme not in GROUPED:
            raise InputError(f"--group-size applies to {', '.join(GROUPED)}; --quant {self.scheme} has one weight "
                             f"scale per {'output channel' if self.scheme == 'w8a8_sq' else 'tensor'}, so drop it")
        if self.kv_cache not in KV_CACHE:
            raise InputError(f"--kv-cache {self.kv_cache!r} is not supported; choose one of {', '.join(KV_CACHE)}")
        if self.kv_cache == "fp8":
            # refused here rather than by `build` after a long convert: no target could run it
            raise UnsupportedError("--kv-cache fp8 is not supported: onnxruntime's CPU GroupQueryAttention has no "
                                   "fp8-cache kernel and TensorRT-RTX 1.7 updates only float16/bfloat16/float32 "
                                   "caches; use --kv-cache int8 (onnxruntime target) or --kv-cache none")
        if self.calib is not None and not self.needs_calibration:
            raise InputError(f"--calib only feeds the calibrated schemes ({', '.join(CALIBRATED)}) and "
                             f"--kv-cache int8; --quant {self.scheme} uses no calibration, so drop --calib")
        if any(n is not None and n <= 0 for n in (self.calib_samples, self.calib_seq_len)):
            raise InputError(f"--calib-samples and --calib-seq-len must be positive, got {self.calib_samples} "
                             f"and {self.calib_seq_len}")
        if self.scheme == "none" and self.exclude:
            raise InputError("--exclude picks linears to keep in full precision; it needs a --quant scheme")
        if self.lm_head is not None:
            if self.lm_head not in LM_HEAD:
                raise InputError(f"--lm-head {self.lm_head!r} is not one of {', '.join(LM_HEAD)}")
            if self.scheme == "none":
                raise InputError("--lm-head chooses how a quantized checkpoint stores lm_head; it needs a --quant "
                                 "scheme (without one lm_head stays float)")
            if get_scheme(self.scheme).from_source and self.lm_head != "int8":
                raise UnsupportedError(f"--quant gguf keeps the file's own blocks for every linear, lm_head "
                                       f"included, or stores lm_head int8 (--lm-head int8, e.g. for a speculative "
                                       f"draft); --lm-head {self.lm_head} is neither: drop it, or use --quant "
                                       f"int4_awq --lm-head {self.lm_head}")
            if self.lm_head != "float" and any(fnmatch.fnmatchcase("lm_head", p) for p in self.exclude):
                raise InputError(f"--exclude keeps lm_head float but --lm-head {self.lm_head} quantizes it; "
                                 "drop one of them (--lm-head float is the same as --exclude lm_head)")


def split_excluded(linears: tuple[str, ...], patterns: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(quantized, excluded) prefixes; a pattern that matches no linear is a typo, so it is an error."""
    for pattern in patterns:
        if not fnmatch.filter(linears, pattern):
            raise InputError(f"--exclude {pattern!r} matches no linear; linears are named like "
                             f"{linears[0]}, {linears[1]}, layers.*.mlp.down, lm_head")
    excluded = tuple(p for p in linears if any(fnmatch.fnmatchcase(p, pat) for pat in patterns))
    return tuple(p for p in linears if p not in excluded), excluded


def in_features(model: ModelConfig, prefix: str) -> int:
    # the canonical [out, in] shape (an MoE's experts.down reads one expert's width); a tied lm_head has none
    shape = expected_shapes(model).get(prefix + ".weight")
    return shape[0][1] if shape else model.hidden_size


def select_linears(model: ModelConfig, options: QuantOptions) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(quantized, excluded) linear prefixes of MODEL under OPTIONS, the group size checked against each.

    --quant none quantizes no linear (a KV-cache-only conversion)."""
    if options.scheme == "none":
        return (), ()
    lm_float = options.lm_head_mode == "float" and not any(fnmatch.fnmatchcase("lm_head", p) for p in options.exclude)
    quantized, excluded = split_excluded(linear_prefixes(model), options.exclude + (("lm_head",) if lm_float else ()))
    if model.block.mlp.kind == "moe" and options.scheme in CALIBRATED:
        # calibration and folding read one dense MLP per layer; routed experts see only their tokens
        raise UnsupportedError(f"--quant {options.scheme} cannot calibrate an MoE model; use --quant int8_wo or "
                               "int4_wo (weight-only, per expert)")
    if (group := options.groups) is not None:
        # an int8 lm_head has one scale per output channel: no group to divide its inputs
        sizes = {p: in_features(model, p) for p in quantized if not (p == "lm_head" and options.lm_head_mode == "int8")}
        if bad := next((p for p, n in sizes.items() if n % group), None):
            fits = [g for g in GROUP_SIZES if all(n % g == 0 for n in sizes.values())]
            hint = (f"use --group-size {' or '.join(map(str, fits[::-1]))} for this model" if fits else
                    "no supported group size divides them all; use --quant int8_wo without --group-size, or "
                    "--exclude the linears")
            raise InputError(f"--group-size {group} does not divide {bad}'s {sizes[bad]} input channels; {hint}")
    return quantized, excluded

"""Converter registry and the weight-map machinery shared by every architecture.

An architecture is one file: a `Converter` subclass registered under its HF `model_type`
(`@register_converter`), which reads as a declaration:
  weight_map      data: HF tensor name template -> canonical name, (canonical name, part) for a
                  tensor fused by concatenating parts along dim 0, or None for a tensor
                  dropped on purpose. `{layer}` stands for the decoder layer index;
                  `*` matches anything in a drop rule (e.g. a vision tower).
  transforms      optional: HF tensor template -> a re-layout on the way (converters/transforms.py:
                  GPT-2's transposed Conv1D weights, GPT-NeoX's per-head q/k/v rows).
  config_from_hf  the hook: HF config.json dict -> ModelConfig, i.e. dims, rope and the typed
                  BlockSpec (norm, attention, MLP, residual layout; formats/model_config.py).
The network emitter and the canonical tensor list (checkpoint.expected_shapes) dispatch on the
BlockSpec, never on the architecture name, so an architecture the specs already describe needs
no code outside its own file. A source tensor that matches no template is an error, never a
silent skip.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from converters.transforms import Transform
from engine_builder.formats.checkpoint import expected_shapes
from engine_builder.formats.model_config import ModelConfig
from engine_builder.util.errors import InputError, UnsupportedError

Target = str | tuple[str, int] | None

_REGISTRY: dict[str, type[Converter]] = {}


def register_converter(*model_types: str):
    def decorate(cls: type[Converter]) -> type[Converter]:
        for model_type in model_types:
            _REGISTRY[model_type] = cls
        cls.model_type = model_types[0]
        return cls

    return decorate


def supported_model_types() -> list[str]:
    return sorted(_REGISTRY)


def get_converter(model_type: str | None) -> type[Converter]:
    if not isinstance(model_type, str) or model_type not in _REGISTRY:
        raise UnsupportedError(
            f"unknown model_type {model_type!r} in config.json; supported: "
            f"{', '.join(supported_model_types())}")
    return _REGISTRY[model_type]


class Converter:
    model_type: ClassVar[str]
    weight_map: ClassVar[dict[str, Target]]
    transforms: ClassVar[dict[str, Transform]] = {}  # weight_map template -> re-layout of its tensors

    @classmethod
    def config_from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        raise NotImplementedError

    @classmethod
    def config_from_source(cls, hf: dict[str, Any], root: Path | None) -> ModelConfig:
        """config_from_hf; ROOT is the source dir (None for a GGUF file), for architectures that also read
        files beside config.json (an encoder's sentence-transformers pooling modules)."""
        return cls.config_from_hf(hf)


@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...]
    dtype: str  # torch dtype name without the "torch." prefix, e.g. "bfloat16"


@dataclass(frozen=True)
class PlannedTensor:
    """One canonical output tensor: its sources are concatenated along dim 0 in order."""

    name: str
    sources: tuple[str, ...]
    shape: tuple[int, ...]
    # one per source (None: stored as is), or () when no source is re-laid out
    transforms: tuple[Transform | None, ...] = ()


@dataclass(frozen=True)
class Plan:
    tensors: tuple[PlannedTensor, ...]
    dropped: tuple[str, ...]


def _compile(weight_map: dict[str, Target]) -> list[tuple[re.Pattern[str], Target, str]]:
    # `{layer}` captures the layer index; `*` (drop rules only) matches anything
    # `{expert}` (MoE) captures the expert index: parts of one canonical tensor sort by (expert, part)
    return [(re.compile(re.escape(template).replace(r"\{layer\}", r"(?P<layer>\d+)")
                        .replace(r"\{expert\}", r"(?P<expert>\d+)").replace(r"\*", ".*") + "$"), target, template)
            for template, target in weight_map.items()]


def plan_conversion(converter: type[Converter], cfg: ModelConfig,
                    infos: dict[str, TensorInfo]) -> Plan:
    """Map every source tensor to its canonical place and check every shape against cfg."""
    patterns = _compile(converter.weight_map)
    parts: dict[str, dict[int | tuple[int, int], str]] = {}
    transforms: dict[str, Transform] = {}  # source tensor -> its re-layout
    dropped: list[str] = []
    for name in infos:
        found = next(((m, target, template) for pattern, target, template in patterns if (m := pattern.match(name))),
                     None)
        if found is None:
            raise InputError(
                f"tensor {name!r} is not in the {converter.model_type} weight map; the checkpoint "
                f"does not match its config.json model_type (or is a variant we do not support)")
        m, target, template = found
        if template in converter.transforms:
            transforms[name] = converter.transforms[template]
        layer = m.groupdict().get("layer")
        if layer is not None and int(layer) >= cfg.num_layers:
            raise InputError(
                f"tensor {name!r} belongs to layer {layer} but config.json says "
                f"num_hidden_layers={cfg.num_layers}; fix the config or the checkpoint")
        canonical, index = (target, 0) if isinstance(target, str) or target is None else target
        if canonical is None or (canonical == "lm_head.weight" and cfg.tie_word_embeddings):
            dropped.append(name)
            continue
        canonical = canonical.replace("{layer}", layer or "")
        if (expert := m.groupdict().get("expert")) is not None:
            if int(expert) >= cfg.block.mlp.num_experts:
                raise InputError(f"tensor {name!r} belongs to expert {expert} but config.json says "
                                 f"{cfg.block.mlp.num_experts} experts; fix the config or the checkpoint")
            index = (int(expert), index)
        parts.setdefault(canonical, {})[index] = name

    expected = expected_shapes(cfg)
    if extra := sorted(set(parts) - set(expected)):
        srcs = [n for c in extra for n in parts[c].values()]
        raise InputError(
            f"tensor(s) {', '.join(srcs[:3])} are present but config.json does not ask for them "
            f"(e.g. a bias or norm the config disables); the config and weights disagree")
    planned = []
    for canonical, (shape, part_rows) in expected.items():
        if canonical not in parts:
            raise InputError(
                f"the checkpoint has no tensor for {canonical!r} (see the {converter.model_type} "
                f"weight map); it is incomplete or a shard is missing")
        sources = tuple(parts[canonical][k] for k in sorted(parts[canonical]))
        wanted = [shape] if len(sources) == 1 else (
            [(rows, *shape[1:]) for rows in part_rows] if part_rows and len(sources) == len(part_rows)
            else None)
        if wanted is None:
            raise InputError(f"{canonical!r} has {len(sources)} source parts; expected 1 or "
                             f"{len(part_rows or ())}")
        for src, want in zip(sources, wanted):
            got = transforms[src].shape(infos[src].shape) if src in transforms else infos[src].shape
            if got != want:
                relaid = f" ({list(got)} re-laid out)" if got != infos[src].shape else ""
                raise InputError(
                    f"tensor {src!r} has shape {list(infos[src].shape)}{relaid} but config.json implies "
                    f"{list(want)}; the config and weights disagree")
        relayout = tuple(transforms.get(src) for src in sources) if any(s in transforms for s in sources) else ()
        planned.append(PlannedTensor(canonical, sources, shape, relayout))
    return Plan(tuple(planned), tuple(dropped))

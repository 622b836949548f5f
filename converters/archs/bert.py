"""BERT and RoBERTa encoders, with the pooling of a sentence-transformers model dir.

The layers are the same for both (post-norm, learned absolute positions, LayerNorm with bias, GELU);
RoBERTa only numbers positions from padding_idx + 1. What turns token states into one vector per
text comes from the sentence-transformers files beside config.json (formats/encoder_spec.py):
  modules.json              which modules run after the transformer: Pooling, Normalize
  1_Pooling/config.json     pooling_mode_* flags (or "pooling_mode"): mean, cls, max, mean_sqrt_len, lasttoken
  sentence_bert_config.json max_seq_length: inputs are truncated to it
A plain HF dir (no modules.json) gets mean pooling without normalization, as sentence-transformers
gives a model it loads without its modules.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from converters.archs import hf_config
from converters.registry import Converter, Target, register_converter
from engine_builder.formats.encoder_spec import EncoderActivation, EncoderSpec, PoolingMode, PoolingSpec
from engine_builder.formats.model_config import AttentionSpec, BlockSpec, ModelConfig, RopeConfig
from engine_builder.util.errors import InputError, UnsupportedError
from engine_builder.util.input_files import MAX_CONFIG_BYTES, read_json

E = "embeddings."
L = "encoder.layer.{layer}."
C = "layers.{layer}."

_LAYOUT: dict[str, Target] = {
    E + "word_embeddings.weight": "embed.weight",
    E + "position_embeddings.weight": "embed.position.weight",
    E + "token_type_embeddings.weight": "embed.token_type.weight",
    E + "LayerNorm.weight": "embed.norm.weight",
    E + "LayerNorm.bias": "embed.norm.bias",
    E + "position_ids": None,  # a buffer of arange(max_positions), recomputed in the graph
    E + "token_type_ids": None,
    **{L + f"attention.self.{name}.{kind}": (C + f"attn.qkv.{kind}", part)
       for part, name in enumerate(("query", "key", "value")) for kind in ("weight", "bias")},
    L + "attention.output.dense.weight": C + "attn.o.weight",
    L + "attention.output.dense.bias": C + "attn.o.bias",
    L + "attention.output.LayerNorm.weight": C + "attn_norm.weight",
    L + "attention.output.LayerNorm.bias": C + "attn_norm.bias",
    L + "intermediate.dense.weight": C + "mlp.up.weight",
    L + "intermediate.dense.bias": C + "mlp.up.bias",
    L + "output.dense.weight": C + "mlp.down.weight",
    L + "output.dense.bias": C + "mlp.down.bias",
    L + "output.LayerNorm.weight": C + "mlp_norm.weight",
    L + "output.LayerNorm.bias": C + "mlp_norm.bias",
    "pooler.*": None,  # BertModel's tanh pooler: sentence-transformers pools the token states instead
}


def _weight_map(prefix: str, heads: tuple[str, ...]) -> dict[str, Target]:
    """The layout as saved by BertModel (no prefix) and by the task models (`bert.` + their heads, dropped)."""
    out = dict(_LAYOUT)
    out |= {prefix + k: v for k, v in _LAYOUT.items()}
    out |= {head: None for head in heads}
    return out


_ACTIVATIONS: dict[str, EncoderActivation] = {"gelu": "gelu", "gelu_new": "gelu_tanh",
                                              "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}
_POOLING_FLAGS: dict[str, PoolingMode] = {
    "pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean", "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len", "pooling_mode_lasttoken": "lasttoken",
}
_MODULE_TYPES = ("Transformer", "Pooling", "Normalize")


@register_converter("bert")
class BertConverter(Converter):
    weight_map = _weight_map("bert.", ("cls.*",))
    position_offset = False  # RoBERTa: positions start at padding_idx + 1

    @classmethod
    def config_from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        return cls.config_from_source(hf, None)

    @classmethod
    def config_from_source(cls, hf: dict[str, Any], root: Path | None) -> ModelConfig:
        kind = hf.get("position_embedding_type", "absolute")
        if kind != "absolute":
            raise UnsupportedError(f"{cls.model_type} position_embedding_type {kind!r} is not supported; "
                                   "only 'absolute' (learned positions)")
        act = hf.get("hidden_act", "gelu")
        if act not in _ACTIVATIONS:
            raise UnsupportedError(f"{cls.model_type} hidden_act {act!r} is not supported; supported: "
                                   f"{', '.join(_ACTIVATIONS)}")
        pad = int(hf.get("pad_token_id") or 0)
        encoder = EncoderSpec(
            type_vocab_size=int(hf.get("type_vocab_size", 2)), pad_token_id=pad,
            position_offset=pad + 1 if cls.position_offset else 0,
            layer_norm_eps=float(hf.get("layer_norm_eps", 1e-12)), activation=_ACTIVATIONS[act],
            pooling=sentence_transformers_pooling(root) if root is not None else PoolingSpec(mode="mean"))
        heads = hf["num_attention_heads"]
        dims = hf_config.dims(hf)
        dims["num_kv_heads"] = heads  # encoders have no grouped KV heads
        dims["max_position_embeddings"] = hf.get("max_position_embeddings", 512)
        block = BlockSpec(attention=AttentionSpec(qkv_bias=True, o_bias=True,
                                                  layer_types=hf_config.full_attention(hf)))
        return ModelConfig(architecture=cls.model_type, **dims, rope=RopeConfig(), block=block,
                           encoder=encoder)


@register_converter("roberta", "xlm-roberta")
class RobertaConverter(BertConverter):
    weight_map = _weight_map("roberta.", ("lm_head.*", "classifier.*"))
    position_offset = True


def sentence_transformers_pooling(root: Path) -> PoolingSpec:
    """The pooling of a sentence-transformers dir ROOT; mean without normalization when it has no modules.json."""
    modules_file = root / "modules.json"
    if not modules_file.is_file():
        return PoolingSpec(mode="mean")
    modules = _json(modules_file)
    if not isinstance(modules, list):
        raise InputError(f"{modules_file} is not a list of modules; fix or delete it")
    mode: PoolingMode | None = None
    normalize = False
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        if kind not in _MODULE_TYPES:
            raise UnsupportedError(f"{modules_file}: sentence-transformers module {module.get('type')!r} is not "
                                   f"supported; supported: {', '.join(_MODULE_TYPES)}")
        if kind == "Pooling":
            mode = _pooling_mode(root / str(module.get("path", "")) / "config.json")
        normalize |= kind == "Normalize"
    if mode is None:
        raise UnsupportedError(f"{modules_file} has no Pooling module; trtbuild embeds with a pooled vector")
    max_len = None
    bert_config = root / "sentence_bert_config.json"
    if bert_config.is_file():
        max_len = _json(bert_config).get("max_seq_length")
    return PoolingSpec(mode=mode, normalize=normalize, max_seq_length=int(max_len) if max_len else None)


def _pooling_mode(path: Path) -> PoolingMode:
    if not path.is_file():
        raise InputError(f"{path} is missing (modules.json names a Pooling module there); restore it")
    config = _json(path)
    if isinstance(config.get("pooling_mode"), str):  # newer sentence-transformers spell it once
        name = config["pooling_mode"]
        modes = [m for m in _POOLING_FLAGS.values() if m == name]
        if not modes:
            raise UnsupportedError(f"{path}: pooling_mode {name!r} is not supported; supported: "
                                   f"{', '.join(_POOLING_FLAGS.values())}")
        return modes[0]
    unknown = [k for k, v in config.items() if k.startswith("pooling_mode_") and v and k not in _POOLING_FLAGS]
    if unknown:
        raise UnsupportedError(f"{path}: {unknown[0]} is not supported; supported: {', '.join(_POOLING_FLAGS)}")
    modes = [mode for flag, mode in _POOLING_FLAGS.items() if config.get(flag)]
    if len(modes) != 1:
        raise UnsupportedError(f"{path} turns on {len(modes)} pooling modes ({', '.join(modes) or 'none'}); "
                               "trtbuild supports exactly one")
    return modes[0]


def _json(path: Path) -> Any:
    return read_json(path, MAX_CONFIG_BYTES, "fix or restore it")

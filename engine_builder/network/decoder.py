"""The whole decoder graph: embedding, layers, final norm, LM head. See graph_io for the I/O contract."""

from __future__ import annotations

from pathlib import Path

import onnx_ir as ir
from onnx_ir.passes.common import ShapeInferencePass

from engine_builder.formats import graph_io as io
from engine_builder.formats.checkpoint import CheckpointConfig
from engine_builder.formats.model_config import LayerType, ModelConfig
from engine_builder.formats.rope_frequencies import rope_frequencies
from engine_builder.network.attention import self_attention
from engine_builder.network.builder import FLOAT, INT64, GraphBuilder
from engine_builder.network.linear import linear
from engine_builder.network.masks import AttentionMasks, attention_masks
from engine_builder.network.mlp import mlp
from engine_builder.network.norms import checkpoint_norm
from engine_builder.network.options import NetworkOptions
from engine_builder.network.paged_attention import paged_masks
from engine_builder.network.rotary import RotaryTables, rotary_tables
from engine_builder.network.weights import CheckpointWeights
from engine_builder.util.errors import ConfigError
from engine_builder.util.version import __version__

OPSET = 24
# the IR version onnx pairs with opset 24; onnxruntime 1.31 rejects 14, which onnx 1.23 writes
IR_VERSION = 12

DTYPES = {"float32": ir.DataType.FLOAT, "float16": ir.DataType.FLOAT16, "bfloat16": ir.DataType.BFLOAT16}


def build_decoder(ckpt_dir: Path, options: NetworkOptions = NetworkOptions()) -> ir.Model:
    """The decoder graph of checkpoint dir CKPT_DIR; its weights reference ckpt_dir/rank0.safetensors."""
    options.validate()
    ckpt_dir = Path(ckpt_dir)
    ckpt = CheckpointConfig.load(ckpt_dir)
    cfg = ckpt.model
    cfg.validate()
    if cfg.position_embedding == "learned" and options.max_seq_len > cfg.max_position_embeddings:
        raise ConfigError(f"max_seq_len {options.max_seq_len} is past the {cfg.max_position_embeddings} positions "
                          f"this {cfg.architecture} model learned (max_position_embeddings); pass --max-seq-len "
                          f"{cfg.max_position_embeddings} or less")
    dtype_name = ckpt.dtype if options.dtype == "auto" else options.dtype
    dtype = DTYPES[dtype_name]
    b = GraphBuilder(dtype)
    w = CheckpointWeights(ckpt_dir, cfg, b, ckpt.quantization)

    input_ids = _input(io.INPUT_IDS, INT64, [io.BATCH, io.SEQ])
    position_ids = _input(io.POSITION_IDS, INT64, [io.BATCH, io.SEQ])
    past_lengths = _input(io.PAST_LENGTHS, INT64, [io.BATCH])
    paged = options.kv_layout == "paged"
    kv = io.KVCacheLayout.of(cfg, options.max_seq_len, dtype_name, ckpt.quantization.kv_cache)
    kv_shape = list(kv.shape(io.BATCH))
    kv_dtype = {**DTYPES, "int8": ir.DataType.INT8}[kv.dtype]
    past_names, present_names = (io.past_key, io.past_value), (io.present_key, io.present_value)
    extra_inputs: list[ir.Value] = []
    if paged:  # a block pool and a block table instead of one row per sequence (network/paged_attention.py)
        pool = io.PagedKVLayout.of(cfg, options.max_seq_len, dtype_name, ckpt.quantization.kv_cache,
                                   options.kv_block_size)
        kv_shape = list(pool.pool_shape(io.NUM_BLOCKS))
        past_names, present_names = (io.kv_pool_key, io.kv_pool_value), (io.present_pool_key, io.present_pool_value)
        extra_inputs = [_input(io.BLOCK_TABLE, INT64, [io.BATCH, io.MAX_BLOCKS])]
    past = [(_input(past_names[0](i), kv_dtype, kv_shape), _input(past_names[1](i), kv_dtype, kv_shape))
            for i in range(cfg.num_layers)]
    image_inputs: list[ir.Value] = []
    if cfg.vision is not None:  # vision-language: image features replace the image tokens' embeddings (graph_io)
        image_inputs = [_input(io.IMAGE_EMBEDS, FLOAT, [io.BATCH, io.SEQ, cfg.hidden_size]),
                        _input(io.IMAGE_MASK, ir.DataType.BOOL, [io.BATCH, io.SEQ])]

    with b.scope("embed"):
        hidden = b.op("Gather", w["embed.weight"], input_ids, axis=0)  # [batch, seq, hidden]
        if cfg.embedding_multiplier != 1.0:
            # gemma: a constant in the model dtype, as transformers rounds sqrt(hidden) to it
            hidden = b.op("Mul", hidden, b.const(cfg.embedding_multiplier))
        if image_inputs:
            hidden = _splice_images(b, hidden, *image_inputs)
        if cfg.position_embedding == "learned":  # gpt2: token + position embeddings
            hidden = b.op("Add", hidden, b.op("Gather", w["pos_embed.weight"], position_ids, axis=0))

    attn = cfg.block.attention
    window = attn.sliding_window if "sliding_attention" in attn.layer_types else None
    # Gemma 3: an image's tokens see each other both ways at prefill (network/masks.py image_block_visible)
    image_blocks = image_inputs[1] if image_inputs and cfg.vision.image_attention == "bidirectional" else None
    if paged:
        masks = paged_masks(b, input_ids, past_lengths, extra_inputs[0], cfg.num_heads, cfg.num_kv_heads,
                            options.kv_block_size, window, cfg.head_dim, image_blocks)
    else:
        masks = attention_masks(b, input_ids, past_lengths, cfg.num_kv_heads, options.max_seq_len, window,
                                image_blocks)
    rotaries = _rotaries(b, position_ids, cfg)

    presents: list[ir.Value] = []
    for i in range(cfg.num_layers):
        with b.scope(f"layers.{i}"):
            hidden, present_key, present_value = _decoder_layer(b, hidden, cfg, w, i, rotaries, masks, *past[i])
        present_key.name, present_value.name = present_names[0](i), present_names[1](i)
        present_key.shape = present_value.shape = ir.Shape(kv_shape)
        present_key.dtype = present_value.dtype = kv_dtype
        presents += [present_key, present_value]

    with b.scope("head"):
        if not options.all_logits and options.logits_tail == 1:  # only the last position feeds sampling
            # Gather of index [-1] rather than Slice: shape inference then knows the 1
            hidden = b.op("Gather", hidden, b.ints([-1]), axis=1)  # [batch, 1, hidden]
        elif not options.all_logits:  # a verify step reads the last k+1; a long prefill still skips the rest
            hidden = b.op("Slice", hidden, b.ints([-options.logits_tail]), b.ints([io.INT64_MAX]),
                          b.ints([1]))  # [batch, min(seq, tail), hidden]
        hidden = checkpoint_norm(b, hidden, w, "final_norm", cfg.block.norm, name="final_norm")
        if cfg.tie_word_embeddings and "lm_head" not in ckpt.quantization.quantized:
            logits = b.linear(hidden, w["embed.weight"])  # [batch, seq or 1, vocab]
        else:  # a quantized lm_head has its own tensors, tied or not (FORMAT.md)
            logits = linear(b, w, hidden, "lm_head")
        if cfg.final_logit_softcap:
            cap = b.const(cfg.final_logit_softcap)
            logits = b.op("Mul", b.op("Tanh", b.op("Div", logits, cap)), cap)
        if dtype != FLOAT:
            logits = b.cast(logits, FLOAT)
    logits.name = io.LOGITS
    logits.dtype = FLOAT
    tail = io.SEQ if options.all_logits else 1 if options.logits_tail == 1 else io.LOGITS_SEQ
    logits.shape = ir.Shape([io.BATCH, tail, cfg.vocab_size])

    graph = ir.Graph(
        inputs=[input_ids, position_ids, past_lengths, *extra_inputs, *(v for pair in past for v in pair),
                *image_inputs],
        outputs=[logits, *presents], nodes=b.tape.nodes, initializers=b.initializers,
        opset_imports={"": OPSET}, name=f"{cfg.architecture}_decoder")
    model = ir.Model(graph, ir_version=IR_VERSION, producer_name="trtbuild", producer_version=__version__)
    model.metadata_props.update({
        io.META_ARCHITECTURE: cfg.architecture, io.META_MAX_SEQ_LEN: str(options.max_seq_len),
        io.META_ALL_LOGITS: str(options.all_logits).lower(), io.META_DTYPE: dtype.name.lower(),
        io.META_LOGITS_TAIL: str(options.logits_tail),
    })
    if paged:
        model.metadata_props.update({io.META_KV_LAYOUT: "paged", io.META_KV_BLOCK_SIZE: str(options.kv_block_size),
                                     io.META_KV_UPDATE: "in_place"})  # ScatterND into a pool bound over itself
    if cfg.rope.scaling.type == "longrope":
        # the tables switch once a sequence outgrows this length; keys already cached were rotated
        # with the short table, so (as transformers' phi3 generate does) the runner must re-prefill
        # the whole sequence when it grows past it
        model.metadata_props[io.META_REPREFILL_AFTER] = str(
            rope_frequencies(cfg, "full_attention").long_after)
    # dtypes and shapes on every value: readable dumps, and the rewrite passes match on them
    ShapeInferencePass()(model)
    return model


def _input(name: str, dtype: ir.DataType, shape: list) -> ir.Value:
    return ir.Value(name=name, type=ir.TensorType(dtype), shape=ir.Shape(shape))


def _splice_images(b: GraphBuilder, embeds: ir.Value, image_embeds: ir.Value, image_mask: ir.Value) -> ir.Value:
    """transformers' llava: inputs_embeds.masked_scatter(image positions, image features cast to its dtype), after
    get_input_embeddings() (gemma3's scale is inside that module, so it applies to text rows only) and before the
    decoder body (where gpt2's learned positions are added). The runtime places each feature row at its position,
    so masked_scatter's running index is a plain select here."""
    features = image_embeds if b.dtype == FLOAT else b.cast(image_embeds, b.dtype)  # [batch, seq, hidden]
    mask = b.op("Unsqueeze", image_mask, b.ints([-1]))  # [batch, seq, 1]
    return b.op("Where", mask, features, embeds, name="splice_images")  # [batch, seq, hidden]


def _rotaries(b: GraphBuilder, position_ids: ir.Value, cfg: ModelConfig) -> dict[LayerType, RotaryTables]:
    """cos/sin per layer type; the same tables unless local layers have their own base (gemma3). Empty
    without rotary (learned positions: attention rotates nothing)."""
    by_kind: dict[bool, RotaryTables] = {}
    tables: dict[LayerType, RotaryTables] = {}
    if cfg.position_embedding != "rotary":
        return {}
    for layer_type in dict.fromkeys(cfg.block.attention.layer_types):
        local = layer_type == "sliding_attention" and cfg.rope.local_theta is not None
        if local not in by_kind:
            by_kind[local] = rotary_tables(b, position_ids, rope_frequencies(cfg, layer_type),
                                           "rope_local" if local else "rope", cfg.rope.interleaved)
        tables[layer_type] = by_kind[local]
    return tables


def _decoder_layer(b: GraphBuilder, x: ir.Value, cfg: ModelConfig, w: CheckpointWeights, i: int,
                   rotaries: dict[LayerType, RotaryTables], masks: AttentionMasks, past_key: ir.Value,
                   past_value: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
    """Pre-norm residual block (ResidualSpec); gemma2/3 also normalize each branch's output (sandwich norms);
    a parallel block (gpt-neox) feeds both branches the same input and adds them as transformers does."""
    p, spec, residual = f"layers.{i}.", cfg.block.norm, cfg.block.residual
    h = checkpoint_norm(b, x, w, p + "attn_norm", spec, name="attn_norm")
    rotary = rotaries.get(cfg.block.attention.layer_types[i])
    attn = self_attention(b, h, cfg, w, i, rotary, masks, past_key, past_value)
    h = attn.out
    if residual.post_attention_norm:
        h = checkpoint_norm(b, h, w, p + "post_attn_norm", spec, name="post_attn_norm")
    if residual.layout == "parallel":
        attn_out = h
    else:
        x = b.op("Add", x, h, name="attn_residual")  # [batch, seq, hidden]
    h = checkpoint_norm(b, x, w, p + "mlp_norm", spec, name="mlp_norm")
    h = mlp(b, h, cfg, w, i)
    if residual.post_mlp_norm:
        h = checkpoint_norm(b, h, w, p + "post_mlp_norm", spec, name="post_mlp_norm")
    if residual.layout == "parallel":  # (mlp + attn) + x, transformers' order of the float sums
        return b.op("Add", b.op("Add", h, attn_out, name="branches"), x, name="residual"), \
            attn.present_key, attn.present_value
    x = b.op("Add", x, h, name="mlp_residual")
    return x, attn.present_key, attn.present_value

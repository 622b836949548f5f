"""The vision graph of a vision-language model: the vision tower (CLIP, SigLIP) and the multi-modal projector
(LLaVA's MLP, Gemma 3's pool + norm + projection, Idefics3's pixel shuffle + projection), each chosen by the
VisionSpec's kind.

What it computes and its I/O: formats/vision_spec.py. Its own graph beside the decoder's, so images are encoded
once per request (and their features cached by content) while the decoder steps tokens; images per call is the
one dynamic axis, the image size is the tower's. Attention is plain MatMul -> Softmax -> MatMul over every patch
(no mask, no KV cache), as network/encoder.py emits BERT's; softmax runs in float32 whatever the activation dtype.
"""

from __future__ import annotations

from pathlib import Path

import onnx_ir as ir
from onnx_ir.passes.common import ShapeInferencePass

from engine_builder.formats import graph_io
from engine_builder.formats import vision_spec as io
from engine_builder.formats.checkpoint import CheckpointConfig
from engine_builder.formats.vision_spec import VisionSpec
from engine_builder.network.builder import FLOAT, GraphBuilder
from engine_builder.network.decoder import DTYPES, IR_VERSION, OPSET
from engine_builder.network.encoder import META_GRAPH
from engine_builder.network.export import write_graph
from engine_builder.network.linear import linear
from engine_builder.network.norms import layer_norm, rms_norm
from engine_builder.network.options import NetworkOptions
from engine_builder.network.weights import CheckpointWeights
from engine_builder.util.errors import InputError
from engine_builder.util.version import __version__

QUICK_GELU = 1.702  # CLIP's quick_gelu: x * sigmoid(1.702 x)


def build_vision_encoder(ckpt_dir: Path, options: NetworkOptions = NetworkOptions()) -> ir.Model:
    """The vision graph of checkpoint dir CKPT_DIR (tower + projector); weights reference ckpt_dir/rank0.safetensors.

    Of OPTIONS only the dtype applies: the graph has no KV cache and no logits."""
    options.validate()
    ckpt_dir = Path(ckpt_dir)
    ckpt = CheckpointConfig.load(ckpt_dir)
    cfg = ckpt.model
    cfg.validate()
    if cfg.vision is None:
        raise InputError(f"{ckpt_dir} holds a text-only model ({cfg.architecture}); it has no vision tower")
    spec = cfg.vision
    dtype = DTYPES[ckpt.dtype if options.dtype == "auto" else options.dtype]
    b = GraphBuilder(dtype)
    w = CheckpointWeights(ckpt_dir, cfg, b, ckpt.quantization)

    size = spec.image_size
    pixel_values = ir.Value(name=io.PIXEL_VALUES, type=ir.TensorType(FLOAT),
                            shape=ir.Shape([io.IMAGES, spec.num_channels, size, size]))
    with b.scope("vision.embed"):
        x = _embeddings(b, w, pixel_values if dtype == FLOAT else b.cast(pixel_values, dtype), spec)
    # hidden_states[0]: the (CLIP: pre-normed) embeddings; [i + 1]: layer i's output (transformers' numbering)
    if spec.class_token:
        x = layer_norm(b, x, w["vision.pre_norm.weight"], w["vision.pre_norm.bias"], spec.layer_norm_eps,
                       name="vision.pre_norm")
    hidden_states = [x]
    for i in range(spec.layers_computed()):
        with b.scope(f"vision.layers.{i}"):
            hidden_states.append(_layer(b, w, hidden_states[-1], spec, i))
    with b.scope("vision.select"):
        selected = [hidden_states[i] for i in spec.hidden_state_indices()]
        if spec.class_token and spec.feature_select_strategy == "default":  # crop the class token
            selected = [b.op("Slice", s, b.ints([1]), b.ints([spec.num_patches + 1]), b.ints([1])) for s in selected]
        features = selected[0] if len(selected) == 1 else b.op("Concat", *selected, axis=-1)
    if spec.post_norm:  # SigLIP's last_hidden_state
        features = layer_norm(b, features, w["vision.post_norm.weight"], w["vision.post_norm.bias"],
                              spec.layer_norm_eps, name="vision.post_norm")
    with b.scope("vision.projector"):
        h = _PROJECTORS[spec.projector](b, w, features, spec)
    out = h if dtype == FLOAT else b.cast(h, FLOAT)
    out.name = io.IMAGE_FEATURES
    out.dtype, out.shape = FLOAT, ir.Shape([io.IMAGES, spec.tokens_per_image, cfg.hidden_size])

    graph = ir.Graph(inputs=[pixel_values], outputs=[out], nodes=b.tape.nodes, initializers=b.initializers,
                     opset_imports={"": OPSET}, name=f"{cfg.architecture}_vision")
    model = ir.Model(graph, ir_version=IR_VERSION, producer_name="trtbuild", producer_version=__version__)
    model.metadata_props.update({graph_io.META_ARCHITECTURE: cfg.architecture, META_GRAPH: "vision",
                                 graph_io.META_DTYPE: dtype.name.lower()})
    ShapeInferencePass()(model)
    return model


def write_vision_onnx(ckpt_dir: Path, out_dir: Path, options: NetworkOptions = NetworkOptions()) -> Path:
    """Build the vision graph of CKPT_DIR into OUT_DIR/vision.onnx beside (a link of) rank0.safetensors; returns
    its path. Written beside and renamed, as network/export.py writes model.onnx."""
    model = build_vision_encoder(ckpt_dir, options)  # fails on bad input before anything is written
    return write_graph(model, ckpt_dir, out_dir, io.VISION_MODEL)


def _embeddings(b: GraphBuilder, w: CheckpointWeights, pixels: ir.Value, spec: VisionSpec) -> ir.Value:
    """pixels [images, channels, size, size] -> [class; patches] + positions, [images, 1 + patches, hidden]; a tower
    without a class token (SigLIP): patches (their Conv with a bias) + positions, [images, patches, hidden]."""
    h, p = spec.hidden_size, spec.patch_size
    bias = () if spec.class_token else (w["vision.embed.patch.bias"],)
    patches = b.op("Conv", pixels, w["vision.embed.patch.weight"], *bias, kernel_shape=[p, p], strides=[p, p])
    patches = b.op("Reshape", patches, b.ints([0, h, spec.num_patches]))  # [images, hidden, patches]
    patches = b.op("Transpose", patches, perm=[0, 2, 1])  # [images, patches, hidden], row-major over the grid
    if not spec.class_token:
        return b.op("Add", patches, w["vision.embed.position.weight"])  # positions [patches, hidden], broadcast
    images = b.op("Shape", pixels, start=0, end=1)
    cls = b.op("Reshape", w["vision.embed.class"], b.ints([1, 1, h]))
    cls = b.op("Expand", cls, b.op("Concat", images, b.ints([1, h]), axis=0))  # [images, 1, hidden]
    x = b.op("Concat", cls, patches, axis=1)
    return b.op("Add", x, w["vision.embed.position.weight"])  # positions [1 + patches, hidden], broadcast


def _layer(b: GraphBuilder, w: CheckpointWeights, x: ir.Value, spec: VisionSpec, i: int) -> ir.Value:
    """A pre-norm CLIP encoder layer: x [images, tokens, hidden] -> the same shape."""
    p, h, heads, head_dim, eps = f"vision.layers.{i}.", spec.hidden_size, spec.num_heads, spec.head_dim, \
        spec.layer_norm_eps
    with b.scope("attn"):
        a = layer_norm(b, x, w[p + "attn_norm.weight"], w[p + "attn_norm.bias"], eps, name="attn_norm")
        qkv = linear(b, w, a, p + "attn.qkv", w[p + "attn.qkv.bias"])  # [images, tokens, 3 hidden]
        q, k, v = b.op_multi("Split", qkv, b.ints([h] * 3), axis=-1, num_outputs=3)
        q, k, v = (b.op("Transpose", b.op("Reshape", t, b.ints([0, 0, heads, head_dim])), perm=[0, 2, 1, 3])
                   for t in (q, k, v))  # [images, heads, tokens, head_dim]
        scores = b.op("MatMul", q, b.op("Transpose", k, perm=[0, 1, 3, 2]))  # [images, heads, tokens, tokens]
        scores = b.op("Mul", scores, b.const(head_dim ** -0.5))
        probs = b.op("Softmax", scores if b.dtype == FLOAT else b.cast(scores, FLOAT), axis=-1)
        a = b.op("MatMul", probs if b.dtype == FLOAT else b.cast(probs, b.dtype), v)  # [images, heads, tokens, hd]
        a = b.op("Reshape", b.op("Transpose", a, perm=[0, 2, 1, 3]), b.ints([0, 0, h]))
        a = linear(b, w, a, p + "attn.o", w[p + "attn.o.bias"])
    x = b.op("Add", x, a, name="attn_residual")
    with b.scope("mlp"):
        m = layer_norm(b, x, w[p + "mlp_norm.weight"], w[p + "mlp_norm.bias"], eps, name="mlp_norm")
        m = linear(b, w, m, p + "mlp.up", w[p + "mlp.up.bias"])  # [images, tokens, inter]
        m = _ACTIVATIONS[spec.activation](b, m)
        m = linear(b, w, m, p + "mlp.down", w[p + "mlp.down.bias"])
    return b.op("Add", x, m, name="mlp_residual")


def _mlp_projector(b: GraphBuilder, w: CheckpointWeights, features: ir.Value, spec: VisionSpec) -> ir.Value:
    """LLaVA's: fc2(act(fc1(features))), [images, tokens, features] -> [images, tokens, text hidden]."""
    bias = spec.projector_bias
    h = linear(b, w, features, "vision.projector.fc1", w["vision.projector.fc1.bias"] if bias else None)
    h = _ACTIVATIONS[spec.projector_activation](b, h)
    return linear(b, w, h, "vision.projector.fc2", w["vision.projector.fc2.bias"] if bias else None)


def _pool_norm_projector(b: GraphBuilder, w: CheckpointWeights, features: ir.Value, spec: VisionSpec) -> ir.Value:
    """Gemma 3's (Gemma3MultiModalProjector): the patch grid average-pooled to tokens_per_image cells, Gemma's
    RMSNorm (1 + w, in float32), a projection without bias; [images, patches, hidden] -> [images, tokens, text]."""
    side, k, h = spec.image_size // spec.patch_size, spec.pool_kernel, spec.hidden_size
    grid = b.op("Reshape", b.op("Transpose", features, perm=[0, 2, 1]), b.ints([0, h, side, side]))
    pooled = b.op("AveragePool", grid, kernel_shape=[k, k], strides=[k, k])  # [images, hidden, side/k, side/k]
    pooled = b.op("Transpose", b.op("Reshape", pooled, b.ints([0, h, spec.tokens_per_image])), perm=[0, 2, 1])
    normed = rms_norm(b, pooled, w["vision.projector.norm.weight"], spec.layer_norm_eps, offset=1.0, name="norm")
    return linear(b, w, normed, "vision.projector.proj")


def _pixel_shuffle_projector(b: GraphBuilder, w: CheckpointWeights, features: ir.Value,
                             spec: VisionSpec) -> ir.Value:
    """Idefics3's connector (Idefics3Connector.pixel_shuffle, then modality_projection without bias): each s x s
    neighbourhood of the patch grid folded into one token of s^2 x hidden features, in transformers' order;
    [images, patches, hidden] -> [images, patches / s^2, text hidden]."""
    side, s, h = spec.image_size // spec.patch_size, spec.scale_factor, spec.hidden_size
    # transformers: view [side, side/s, h*s], swap the two grid axes, view [side/s, side/s, h*s*s], swap them back
    x = b.op("Reshape", features, b.ints([0, side, side // s, h * s]))
    x = b.op("Transpose", x, perm=[0, 2, 1, 3])  # [images, side/s, side, h*s]
    x = b.op("Reshape", x, b.ints([0, side // s, side // s, h * s * s]))
    x = b.op("Transpose", x, perm=[0, 2, 1, 3])  # [images, side/s, side/s, h*s*s]
    x = b.op("Reshape", x, b.ints([0, spec.tokens_per_image, h * s * s]))
    return linear(b, w, x, "vision.projector.proj")


# VisionProjector -> its graph
_PROJECTORS = {"mlp": _mlp_projector, "pool_norm": _pool_norm_projector, "pixel_shuffle": _pixel_shuffle_projector}

# VisionActivation -> its ops (transformers' ACT2FN of the same name)
_ACTIVATIONS = {
    "quick_gelu": lambda b, x: b.op("Mul", x, b.op("Sigmoid", b.op("Mul", x, b.const(QUICK_GELU)))),
    "gelu": lambda b, x: b.op("Gelu", x),  # erf form
    "gelu_tanh": lambda b, x: b.op("Gelu", x, approximate="tanh"),
    "relu": lambda b, x: b.op("Relu", x),
    "silu": lambda b, x: b.op("Mul", x, b.op("Sigmoid", x)),
}

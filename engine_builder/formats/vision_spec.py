"""Vision-language models (LLaVA, Gemma 3, Idefics3): the vision tower, its projector, their tensors and the vision
graph's I/O.

A vision-language checkpoint is a decoder ModelConfig whose `vision` is set: the text decoder's tensors keep
their usual canonical names (the decoder graph and every runtime read them unchanged) and the vision tower and
the multi-modal projector sit beside them under `vision.*`. What the vision graph computes (CLIP, pre-norm):

    x = [class; patches(Conv P x P, stride P)] + position          [images, 1 + patches, hidden]
    hidden_states[0] = pre_norm(x)
    per layer i:  x += o(attention(attn_norm(x)));  x += down(act(up(mlp_norm(x))));  hidden_states[i + 1] = x
    f = concat(hidden_states[l] for l in feature_layers)[:, 1:]     (the class token cropped by the "default" strategy)
    image_features = projector.fc2(act(projector.fc1(f)))           [images, tokens_per_image, text hidden]

transformers' `get_image_features` (models/llava/modeling_llava.py) is the reference: `vision_feature_layer`
indexes hidden_states (negative from the end, -2 the output of the second-to-last layer), a list of them is
concatenated along the features. Layers past the deepest selected one, and the tower's post-norm (it feeds only
CLIP's pooled output), are not computed.

A SigLIP tower (Gemma 3's; transformers' models/siglip) has no class token and no pre-norm, a bias on its patch
convolution and a position per patch; Gemma 3 reads its last_hidden_state, the last layer's output through the
tower's post_layernorm (`post_norm`). Gemma 3's projector (`projector="pool_norm"`, Gemma3MultiModalProjector in
models/gemma3/modeling_gemma3.py; the reference is its `get_image_features`):

    x = [patches(Conv P x P + bias, stride P)] + position            [images, patches, hidden]
    per layer as CLIP's;  f = post_norm(hidden_states[-1])
    g = avg_pool(f as a side x side grid, kernel = stride = side / tokens_side)   [images, tokens_per_image, hidden]
    image_features = (rms_norm(g) * (1 + projector.norm)) @ projector.proj^T      [images, tokens_per_image, text]

Idefics3 (SmolVLM; models/idefics3/modeling_idefics3.py) has a SigLIP tower read through its post_layernorm, as
Gemma 3's, and a connector (`projector="pixel_shuffle"`): the patch grid's s x s neighbourhoods folded into the
features (pixel_shuffle by scale_factor s), then one linear without bias:

    f = post_norm(hidden_states[-1])                                  [images, patches, hidden]
    g = pixel_shuffle(f, s)                                          [images, patches / s^2, hidden * s^2]
    image_features = g @ projector.proj^T                            [images, tokens_per_image, text hidden]

Its processor cuts one image into tiles (`ImageTiling`): each tile, and the global image after them, is one image
for the graph, and the prompt lays them out as Idefics3Processor does (`prompt_layout="tile_grid"`).

The graph (network/vision_encoder.py):

    pixel_values    float32 [images, channels, image_size, image_size]   as the image processor makes them
    ->
    image_features  float32 [images, tokens_per_image, text hidden]     spliced in at the image-token positions

The image processor's config (`ImageProcessorSpec`: resize, crop, rescale, normalize) travels with the model, so
the runtime prepares pixels as the model's own processor does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, get_args

from engine_builder.util.errors import ConfigError

VisionTower = Literal["clip", "siglip"]  # clip: class token + pre-norm; siglip: neither, a patch bias
# mlp: llava's fc1 -> act -> fc2; pool_norm: Gemma 3's; pixel_shuffle: Idefics3's connector
VisionProjector = Literal["mlp", "pool_norm", "pixel_shuffle"]
# how a prompt lays out one image: tokens: its image tokens (between the start / end tokens when set); tile_grid:
# Idefics3Processor's grid, per tile <fake_token_around_image> <row_i_col_j> and the tile's image tokens, a "\n"
# after each row, then the global image as <fake_token_around_image> <global-img> tokens <fake_token_around_image>
PromptLayout = Literal["tokens", "tile_grid"]
ImageAttention = Literal["causal", "bidirectional"]  # how the decoder's prefill attends within one image's tokens
VisionActivation = Literal["quick_gelu", "gelu", "gelu_tanh", "relu", "silu"]
FeatureSelect = Literal["default", "full"]  # default: crop the class token; full: keep it
Resample = Literal["nearest", "lanczos", "bilinear", "bicubic", "box", "hamming"]  # PIL's filters

VISION_MODEL = "vision.onnx"  # in an engine dir, beside model.onnx; its weights in the same rank0.safetensors
VISION_TRT_MODEL = "vision.trt.onnx"  # target tensorrt: the vision graph in the engine's dtype, as TensorRT parsed it
VISION_ENGINE = "vision.engine"  # target tensorrt: its serialized TensorRT(-RTX) engine (formats/vision_engine.py)
PIXEL_VALUES = "pixel_values"
IMAGE_FEATURES = "image_features"
IMAGES = "images"  # the graph's dynamic batch axis: images per call

# transformers' OPENAI_CLIP_MEAN / OPENAI_CLIP_STD (CLIPImageProcessor's defaults)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
MAX_VISION_LAYERS = 64  # the converter's weight map lists the tower's layers up to this (CLIP-L: 24, ViT-H: 32)
MAX_TILES_PER_SIDE = 6  # Idefics3's tokenizer has <row_i_col_j> for i, j in 1..6 (Idefics3Processor's row_col_ids)


@dataclass(frozen=True)
class ImageTiling:
    """Idefics3's image splitting (Idefics3ImageProcessor, preprocessor_config.json): the image resized so its longer
    side is `longest_edge` (size, with do_resize; the shorter side kept in proportion, rounded up to even), then up
    to multiples of `tile_size` (max_image_size); cut into tile_size squares, row by row, followed by the whole
    image resized to one tile (the global image) when there is more than one tile. Without `split`
    (do_image_splitting false) the resized image is squashed to one tile."""

    longest_edge: int
    tile_size: int
    split: bool = True

    def max_tiles_per_side(self) -> int:
        """Rows (or columns) of tiles an image resized to longest_edge can make."""
        return -(-self.longest_edge // self.tile_size) if self.split else 0


@dataclass(frozen=True)
class ImageProcessorSpec:
    """The HF image processor's preprocessing (preprocessor_config.json), CLIPImageProcessor's defaults otherwise.

    In order: convert to RGB, pad to a square (llava's do_pad, filled with the mean colour), resize (the shorter
    side to `shortest_edge`, or to exactly `height` x `width`), center crop, rescale, normalize; channels first."""

    do_convert_rgb: bool = True
    do_pad: bool = False
    do_resize: bool = True
    shortest_edge: int | None = 224
    height: int | None = None  # with width: resize to exactly this size instead of by the shorter edge
    width: int | None = None
    resample: Resample = "bicubic"
    do_center_crop: bool = True
    crop_height: int = 224
    crop_width: int = 224
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, ...] = CLIP_MEAN
    image_std: tuple[float, ...] = CLIP_STD
    tiling: ImageTiling | None = None  # Idefics3: the resize and the tiles are its (no shortest_edge, size or crop)

    def validate(self, channels: int) -> None:
        where = "model config: vision.processor"
        if self.tiling is not None:
            t = self.tiling
            if t.tile_size < 1 or t.longest_edge < 1:
                raise ConfigError(f"{where}.tiling sizes must be >= 1, got longest_edge {t.longest_edge}, tile_size "
                                  f"{t.tile_size}")
            if (self.shortest_edge, self.height, self.width, self.do_center_crop, self.do_pad) != (
                    None, None, None, False, False):
                raise ConfigError(f"{where}: a tiled processor resizes by tiling alone; shortest_edge, height, width, "
                                  "do_center_crop and do_pad must be unset")
            if self.do_resize and t.max_tiles_per_side() > MAX_TILES_PER_SIDE:
                raise ConfigError(f"{where}.tiling: longest_edge {t.longest_edge} makes up to "
                                  f"{t.max_tiles_per_side()} tiles of {t.tile_size} px a side, above the "
                                  f"{MAX_TILES_PER_SIDE} the prompt's <row_i_col_j> tokens name")
        elif self.do_resize and (self.shortest_edge is None) == (self.height is None or self.width is None):
            raise ConfigError(f"{where}: a resize needs either shortest_edge or height and width, not both or neither")
        for name in ("shortest_edge", "height", "width", "crop_height", "crop_width"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{where}.{name} must be >= 1, got {value}")
        if self.resample not in get_args(Resample):
            raise ConfigError(f"{where}.resample {self.resample!r} is not one of {', '.join(get_args(Resample))}")
        if not (math.isfinite(self.rescale_factor) and self.rescale_factor > 0):
            raise ConfigError(f"{where}.rescale_factor must be a positive finite number, got {self.rescale_factor}")
        for name in ("image_mean", "image_std"):
            values = getattr(self, name)
            if len(values) != channels or not all(math.isfinite(v) for v in values):
                raise ConfigError(f"{where}.{name} needs {channels} finite values (one per channel), got {values}")
        if any(v <= 0 for v in self.image_std):
            raise ConfigError(f"{where}.image_std must be positive, got {self.image_std}")

    def output_size(self) -> tuple[int, int] | None:
        """(height, width) of the pixels it makes, when fixed (a crop, a resize to an exact size, a tile)."""
        if self.tiling is not None:
            return self.tiling.tile_size, self.tiling.tile_size
        if self.do_center_crop:
            return self.crop_height, self.crop_width
        if self.do_resize and self.height is not None and self.width is not None:
            return self.height, self.width
        return None


@dataclass(frozen=True)
class VisionSpec:
    """The vision tower (a ViT: CLIP or SigLIP), which of its hidden states feed the projector, the projector, the
    image token."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    patch_size: int
    image_size: int
    image_token_id: int  # the text token each image feature replaces (HF image_token_index)
    # image features per image (per tile with a tiled processor): patches, plus the class token with the "full"
    # strategy (mlp projector); the pooled grid's cells (pool_norm: Gemma 3's mm_tokens_per_image, a square dividing
    # the patch grid); patches / scale_factor^2 (pixel_shuffle: Idefics3's image_seq_len)
    tokens_per_image: int
    tower: VisionTower = "clip"
    num_channels: int = 3
    layer_norm_eps: float = 1e-5
    activation: VisionActivation = "quick_gelu"
    # HF vision_feature_layer: indices into hidden_states (0: the pre-normed embeddings, i: layer i's output,
    # negative from the end); one index or several whose features are concatenated
    feature_layers: tuple[int, ...] = (-2,)
    feature_select_strategy: FeatureSelect = "default"  # HF vision_feature_select_strategy
    post_norm: bool = False  # the features go through the tower's post_layernorm (SigLIP's last_hidden_state)
    projector: VisionProjector = "mlp"
    projector_activation: VisionActivation = "gelu"  # mlp only
    projector_bias: bool = True  # mlp only
    scale_factor: int = 1  # pixel_shuffle only: the side of the patch neighbourhoods folded into one token
    # the decoder's prefill over one image's tokens: causal (llava), or each of them sees the whole image (Gemma 3's
    # token_type_ids block mask: OR(causal, same image), inside the sliding window on local layers)
    image_attention: ImageAttention = "causal"
    # tokens the processor puts around each image's image tokens (Gemma 3's boi / eoi); None: none
    image_start_token_id: int | None = None
    image_end_token_id: int | None = None
    prompt_layout: PromptLayout = "tokens"  # tile_grid: Idefics3's (its other tokens come from the tokenizer)
    processor: ImageProcessorSpec = field(default_factory=ImageProcessorSpec)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def placeholder_token_id(self) -> int:
        """The token a prompt holds where an image goes, before the processor lays it out: Gemma 3's
        <start_of_image>, else the image token (llava's <image>)."""
        return self.image_start_token_id if self.image_start_token_id is not None else self.image_token_id

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def class_token(self) -> bool:
        """A class token before the patches (and a pre-norm after the embeddings): CLIP's; SigLIP has neither."""
        return self.tower == "clip"

    @property
    def num_positions(self) -> int:
        return self.num_patches + self.class_token

    @property
    def pool_kernel(self) -> int:
        """pool_norm: the average pool's kernel (and stride) over the patch grid's side."""
        return (self.image_size // self.patch_size) // math.isqrt(self.tokens_per_image)

    def max_graph_images(self) -> int:
        """The most images of the tower's size one image becomes: its tiles and the global image (Idefics3), else 1."""
        tiling = self.processor.tiling
        if self.prompt_layout != "tile_grid" or tiling is None:
            return 1
        side = tiling.max_tiles_per_side() if self.processor.do_resize else MAX_TILES_PER_SIDE
        return side * side + 1

    def max_image_tokens(self) -> int:
        """The most prompt tokens one image can become: its image tokens and the layout around them (Gemma 3's boi,
        eoi and "\n\n"s; Idefics3's tiles, each with its two tokens, the rows' "\n"s and the global image)."""
        tiling = self.processor.tiling
        if self.prompt_layout != "tile_grid" or tiling is None:
            return self.tokens_per_image + 4
        side = tiling.max_tiles_per_side() if self.processor.do_resize else MAX_TILES_PER_SIDE
        return self.max_graph_images() * (self.tokens_per_image + 2) + side + 2

    def expected_tokens(self) -> int:
        """What tokens_per_image must be (mlp): every patch, and the class token unless the strategy crops it."""
        return self.num_patches + (self.class_token and self.feature_select_strategy == "full")

    def hidden_state_indices(self) -> tuple[int, ...]:
        """feature_layers as non-negative indices into hidden_states (num_layers + 1 of them)."""
        return tuple(i if i >= 0 else self.num_layers + 1 + i for i in self.feature_layers)

    def layers_computed(self) -> int:
        """Tower layers the features need: up to the deepest selected hidden state."""
        return max(self.hidden_state_indices())

    def validate(self, vocab_size: int) -> None:
        where = "model config: vision"
        for name in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "patch_size", "image_size",
                     "num_channels", "tokens_per_image"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{where}.{name} must be >= 1, got {getattr(self, name)}")
        if self.num_layers > MAX_VISION_LAYERS:
            raise ConfigError(f"{where}.num_layers {self.num_layers} is above {MAX_VISION_LAYERS}, deeper than any "
                              "vision tower trtbuild reads")
        if self.hidden_size % self.num_heads:
            raise ConfigError(f"{where}.hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}")
        if self.image_size % self.patch_size:
            raise ConfigError(f"{where}.image_size {self.image_size} is not a multiple of patch_size "
                              f"{self.patch_size}")
        if not 0 <= self.image_token_id < vocab_size:
            raise ConfigError(f"{where}.image_token_id {self.image_token_id} is outside the vocabulary "
                              f"[0, {vocab_size})")
        if not (math.isfinite(self.layer_norm_eps) and self.layer_norm_eps > 0):
            raise ConfigError(f"{where}.layer_norm_eps must be a positive finite number, got {self.layer_norm_eps}")
        for name, value, kinds in (("tower", self.tower, VisionTower), ("projector", self.projector, VisionProjector),
                                   ("prompt_layout", self.prompt_layout, PromptLayout),
                                   ("image_attention", self.image_attention, ImageAttention),
                                   ("activation", self.activation, VisionActivation),
                                   ("projector_activation", self.projector_activation, VisionActivation),
                                   ("feature_select_strategy", self.feature_select_strategy, FeatureSelect)):
            if value not in get_args(kinds):
                raise ConfigError(f"{where}.{name} {value!r} is not one of {', '.join(get_args(kinds))}")
        if not self.feature_layers or not all(0 <= i <= self.num_layers for i in self.hidden_state_indices()):
            raise ConfigError(f"{where}.feature_layers {list(self.feature_layers)} must name hidden states of a "
                              f"{self.num_layers}-layer tower (0..{self.num_layers}, or -1..-{self.num_layers + 1})")
        for name in ("image_start_token_id", "image_end_token_id"):
            if (value := getattr(self, name)) is not None and not 0 <= value < vocab_size:
                raise ConfigError(f"{where}.{name} {value} is outside the vocabulary [0, {vocab_size})")
        if self.post_norm and (self.class_token or self.hidden_state_indices() != (self.num_layers,)):
            raise ConfigError(f"{where}.post_norm reads the last hidden state of a siglip tower only "
                              f"(feature_layers [-1]); got a {self.tower} tower, {list(self.feature_layers)}")
        if self.projector == "mlp" and self.tokens_per_image != self.expected_tokens():
            raise ConfigError(f"{where}.tokens_per_image {self.tokens_per_image} does not match {self.num_patches} "
                              f"patches with the {self.feature_select_strategy!r} strategy ({self.expected_tokens()})")
        if self.projector == "pool_norm":
            side, tokens_side = self.image_size // self.patch_size, math.isqrt(self.tokens_per_image)
            if (tokens_side ** 2 != self.tokens_per_image or side % tokens_side or self.class_token
                    or len(self.feature_layers) != 1):
                raise ConfigError(f"{where}.tokens_per_image {self.tokens_per_image} must be a square whose side "
                                  f"divides the {side}x{side} patch grid, pooled from one hidden state of a tower "
                                  f"without a class token (pool_norm projector)")
        if self.projector == "pixel_shuffle":
            side, s = self.image_size // self.patch_size, self.scale_factor
            if (s < 1 or side % s or self.tokens_per_image * s * s != side * side or self.class_token
                    or len(self.feature_layers) != 1):
                raise ConfigError(f"{where}: scale_factor {s} must divide the {side}x{side} patch grid into "
                                  f"tokens_per_image {self.tokens_per_image} cells, from one hidden state of a tower "
                                  f"without a class token (pixel_shuffle projector)")
        if (self.prompt_layout == "tile_grid") != (self.processor.tiling is not None):
            raise ConfigError(f"{where}: prompt_layout 'tile_grid' goes with a tiled processor (processor.tiling) and "
                              f"only with one; got {self.prompt_layout!r} and tiling {self.processor.tiling}")
        self.processor.validate(self.num_channels)
        if (size := self.processor.output_size()) is not None and size != (self.image_size, self.image_size):
            raise ConfigError(f"{where}.processor makes {size[0]}x{size[1]} images but the tower takes "
                              f"{self.image_size}x{self.image_size}; fix preprocessor_config.json's crop_size")


Shapes = dict[str, tuple[tuple[int, ...], tuple[int, ...] | None]]


def vision_shapes(spec: VisionSpec, text_hidden: int) -> Shapes:
    """The tower's and projector's canonical tensors -> (shape, rows of each fused part or None), in file order."""
    h, inter, p = spec.hidden_size, spec.intermediate_size, spec.patch_size
    shapes: Shapes = {"vision.embed.patch.weight": ((h, spec.num_channels, p, p), None)}  # a Conv of stride p
    if spec.class_token:  # CLIP: a class token, no patch bias, a pre-norm
        shapes["vision.embed.class"] = ((h,), None)
    else:  # SigLIP: a patch bias
        shapes["vision.embed.patch.bias"] = ((h,), None)
    shapes["vision.embed.position.weight"] = ((spec.num_positions, h), None)
    if spec.class_token:
        shapes |= {"vision.pre_norm.weight": ((h,), None), "vision.pre_norm.bias": ((h,), None)}
    for i in range(spec.num_layers):
        q = f"vision.layers.{i}."
        shapes |= {
            q + "attn_norm.weight": ((h,), None),
            q + "attn_norm.bias": ((h,), None),
            q + "attn.qkv.weight": ((3 * h, h), (h, h, h)),
            q + "attn.qkv.bias": ((3 * h,), (h, h, h)),
            q + "attn.o.weight": ((h, h), None),
            q + "attn.o.bias": ((h,), None),
            q + "mlp_norm.weight": ((h,), None),
            q + "mlp_norm.bias": ((h,), None),
            q + "mlp.up.weight": ((inter, h), None),
            q + "mlp.up.bias": ((inter,), None),
            q + "mlp.down.weight": ((h, inter), None),
            q + "mlp.down.bias": ((h,), None),
        }
    if spec.post_norm:
        shapes |= {"vision.post_norm.weight": ((h,), None), "vision.post_norm.bias": ((h,), None)}
    features = h * len(spec.feature_layers)
    if spec.projector == "pixel_shuffle":  # Idefics3: one linear without bias over the shuffled features
        shapes["vision.projector.proj.weight"] = ((text_hidden, features * spec.scale_factor ** 2), None)
        return shapes
    if spec.projector == "pool_norm":  # Gemma 3: its RMSNorm's weight (used as 1 + w), then [text, vision] (no bias)
        shapes["vision.projector.norm.weight"] = ((features,), None)
        shapes["vision.projector.proj.weight"] = ((text_hidden, features), None)
        return shapes
    shapes["vision.projector.fc1.weight"] = ((text_hidden, features), None)
    if spec.projector_bias:
        shapes["vision.projector.fc1.bias"] = ((text_hidden,), None)
    shapes["vision.projector.fc2.weight"] = ((text_hidden, text_hidden), None)
    if spec.projector_bias:
        shapes["vision.projector.fc2.bias"] = ((text_hidden,), None)
    return shapes

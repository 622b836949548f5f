"""A prompt with images, made ready for the step loop (the multimodal pipeline, as HF's LlavaProcessor and
get_image_features do it):

    prompt = ImagePrompts(engine).prepare(prompt_ids, images)    # -> ImagePrompt (runner/core/image_prompt.py)

1. the images are loaded (bounded, runner/vision/images.py) and preprocessed as the model's processor does (a tiled
   processor, Idefics3's, makes several images for the graph of one);
2. each image token in the prompt stands for one image, in order, and becomes its layout: tokens_per_image of
   them (Gemma 3's between its start and end tokens; Idefics3's per tile in its grid, runner/vision/tile_grid.py).
   A prompt that already holds every image's tokens is taken as it is; one with none gets the images first;
   the images of step 1 are encoded by the vision graph in one call;
3. the k-th image-token position takes the k-th feature row: the prefill splices them in (generate.py);
4. the prefix cache sees, at those positions, ids derived from a hash of the image's pixels instead of the image
   token, so a repeated image reuses its KV and two different images never share any; its features are kept too
   (an LRU by bytes), so it skips the vision graph as well.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from engine_builder.runner.core.image_prompt import ImagePrompt
from engine_builder.runner.engine import EngineDir
from engine_builder.runner.tunables import IMAGE_FEATURES_CACHE_BYTES
from engine_builder.runner.vision.image_limits import IMAGES_FLAG, ImageLimits
from engine_builder.runner.vision.image_processor import preprocess_tiles
from engine_builder.runner.vision.images import ImageSource, load_image
from engine_builder.runner.vision.tile_grid import TileTokens
from engine_builder.runner.vision.vision_session import VisionSession
from engine_builder.util.errors import InputError, UnsupportedError


class ImagePrompts:
    features_cache_bytes = IMAGE_FEATURES_CACHE_BYTES  # recent images' features kept

    def __init__(self, engine: EngineDir, limits: ImageLimits = ImageLimits(), threads: int | None = None,
                 bos_token_id: int | None = None, around: Sequence[int] = (),
                 tile_tokens: TileTokens | None = None) -> None:
        """around: the ids of the text Gemma3Processor puts either side of an image ("\n\n"); tile_tokens: the ids
        of Idefics3Processor's layout (a tile_grid engine's)."""
        self.bos_token_id, self.around, self.tile_tokens = bos_token_id, list(around), tile_tokens
        self.encoder = VisionSession(engine, threads)
        self.spec, self.limits, self.vocab = self.encoder.spec, limits, engine.model.vocab_size
        if self.spec.prompt_layout == "tile_grid" and tile_tokens is None:
            raise UnsupportedError(f"{engine.path} lays images out in Idefics3's tile grid: give ImagePrompts the "
                                   "tokenizer's ids (image_prompts_for)")
        if self.spec.image_attention == "bidirectional" and self.spec.tokens_per_image > engine.limits.max_input_len:
            raise UnsupportedError(f"an image is {self.spec.tokens_per_image} tokens, prefilled in one call, but "
                                   f"{engine.path} takes at most {engine.limits.max_input_len} (max_input_len); "
                                   "rebuild it with a larger --max-input-len")
        self._recent: OrderedDict[bytes, np.ndarray] = OrderedDict()  # pixels' sha256 -> features, least recent first
        self._recent_bytes = 0

    def prepare(self, prompt_ids: Sequence[int], images: Sequence[ImageSource]) -> ImagePrompt:
        spec, token = self.spec, self.spec.image_token_id
        if len(images) > self.limits.max_images:
            raise InputError(f"{len(images)} images in one request; at most {self.limits.max_images} are taken "
                             f"({IMAGES_FLAG})")
        tiled = [preprocess_tiles(load_image(image, self.limits), spec.processor) for image in images]
        pixels = [p for p, _ in tiled]  # per image [its images for the graph: tiles, global; 3, height, width]
        ids = self._expand(list(prompt_ids), [self._layout(p, grid) for p, grid in tiled])
        digests = [hashlib.sha256(p.tobytes()).digest() for p in pixels]
        features = self._features(pixels, digests)  # per image [its tokens, hidden]
        positions = np.flatnonzero(np.asarray(ids) == token).astype(np.int64)
        if len(positions) != sum(len(f) for f in features):  # a client's own ids laid out for other tiles
            raise InputError(f"the prompt holds {len(positions)} image tokens where its {len(images)} image(s) take "
                             f"{sum(len(f) for f in features)}; give one image token per image and let the model "
                             "lay them out")
        key, at = list(ids), 0
        for digest, f in zip(digests, features):
            first = self.vocab + (int.from_bytes(digest[:5], "little")) * len(f)  # never a token id
            for j in range(len(f)):
                key[positions[at + j]] = first + j
            at += len(f)
        return ImagePrompt(ids, positions, np.concatenate(features), key,
                           whole=spec.image_attention == "bidirectional")

    def _layout(self, pixels: np.ndarray, grid: tuple[int, int]) -> list[int]:
        """The ids one image becomes in the prompt, as the model's processor writes it: tokens_per_image image tokens
        (LlavaProcessor), between "\n\n" <start_of_image> and <end_of_image> "\n\n" (Gemma3Processor), or per tile
        in Idefics3Processor's grid."""
        spec = self.spec
        if spec.prompt_layout == "tile_grid":
            assert self.tile_tokens is not None
            return self.tile_tokens.layout(*grid, spec.image_token_id, spec.tokens_per_image)
        layout = [spec.image_token_id] * spec.tokens_per_image * len(pixels)
        if spec.image_start_token_id is not None:
            layout = [*self.around, spec.image_start_token_id, *layout, spec.image_end_token_id, *self.around]
        return layout

    def _features(self, pixels: list[np.ndarray], digests: list[bytes]) -> list[np.ndarray]:
        """The vision graph's features of each image ([its tokens, hidden]: every tile's in order), one call for
        those not seen lately: a repeated image (a conversation's next turn) skips the encoder as its KV skips the
        prefill (an LRU by bytes)."""
        found = {d: self._recent[d] for d in digests if d in self._recent}
        missing = {d: i for i, d in reversed(list(enumerate(digests))) if d not in found}  # an image's first index
        if missing:
            encoded = self.encoder.encode(np.concatenate([pixels[i] for i in missing.values()]))
            ends = np.cumsum([len(pixels[i]) for i in missing.values()])
            for d, f in zip(missing, np.split(encoded, ends[:-1])):
                found[d] = f.reshape(-1, f.shape[-1])
                self._remember(d, found[d])
        for d in found:
            if d in self._recent:
                self._recent.move_to_end(d)
        return [found[d] for d in digests]

    def _remember(self, digest: bytes, features: np.ndarray) -> None:
        self._recent[digest] = features
        self._recent_bytes += features.nbytes
        while self._recent_bytes > self.features_cache_bytes and len(self._recent) > 1:
            self._recent_bytes -= self._recent.popitem(last=False)[1].nbytes

    def _expand(self, ids: list[int], layouts: list[list[int]]) -> list[int]:
        """Each placeholder becomes its image's layout (_layout), in order; a prompt with none gets the images first
        (after its BOS), llava's "<image>\n{prompt}"."""
        spec, images = self.spec, len(layouts)
        tokens = sum(layout.count(spec.image_token_id) for layout in layouts)
        if ids.count(spec.image_token_id) == tokens and tokens > images:  # already laid out (a client's own ids)
            return ids
        found = ids.count(spec.placeholder_token_id)
        if found == 0 and spec.image_token_id not in ids:
            at = 1 if ids and ids[0] == self.bos_token_id else 0
            return [*ids[:at], *(t for layout in layouts for t in layout), *ids[at:]]
        if found != images:
            raise InputError(f"the prompt has {found} image placeholder(s) (token id {spec.placeholder_token_id}) for "
                             f"{images} image(s); put one in the prompt where each image goes, in order")
        out: list[int] = []
        queue = iter(layouts)
        for t in ids:
            out.extend(next(queue) if t == spec.placeholder_token_id else [t])
        return out

    def prepare_all(self, prompts: Sequence[Sequence[int]], images: Any) -> list[ImagePrompt | None]:
        """Per prompt, its ImagePrompt, or None for a prompt without images (which may hold no image token)."""
        out: list[ImagePrompt | None] = []
        for ids, given in zip(prompts, per_prompt(images, len(prompts))):
            if given:
                out.append(self.prepare(ids, given))
            else:
                refuse_image_tokens(ids, self.spec.image_token_id)
                out.append(None)
        return out


def per_prompt(images: Any, n: int) -> list[list[ImageSource]]:
    """LLM.generate's `images`: per prompt a list of images (or one image, or None); with one prompt, its list."""
    if n == 1 and not (isinstance(images, list | tuple) and images and isinstance(images[0], list | tuple | None)):
        images = [images]
    if not isinstance(images, list | tuple) or len(images) != n:
        raise InputError(f"give images as one list per prompt ({n} prompts), e.g. images=[[img], [], [img1, img2]]")
    return [[] if i is None else list(i) if isinstance(i, list | tuple) else [i] for i in images]


def refuse_image_tokens(ids: Sequence[int], token: int) -> None:
    """A prompt of a vision-language model with an image token but no image: HF refuses it too."""
    if token in ids:
        raise InputError(f"the prompt holds the image token (id {token}) but no image was given; pass the image "
                         "(images=..., --image) or take the token out")


def with_image_tokens(messages: Sequence[Mapping[str, Any]], images: int, token_text: str) -> list[dict[str, Any]]:
    """A conversation whose last user message gets one image token per image before its text ("<image>\n..."), as
    llava's chat format has it, unless the text already holds them."""
    out = [dict(m) for m in messages]
    for m in reversed(out):
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            if token_text not in m["content"]:
                m["content"] = f"{token_text}\n" * images + m["content"]
            return out
    raise InputError("images need a user message with text content to go with; add one")


def image_prompts_for(engine: EngineDir, tokenizer: Any, threads: int | None = None,
                      limits: ImageLimits = ImageLimits()) -> ImagePrompts:
    """The pipeline of an engine with its tokenizer's BOS, the text Gemma 3 puts around an image and the tokens of
    Idefics3's tile grid."""
    spec = engine.model.vision
    around = tokenizer("\n\n", add_special_tokens=False).input_ids if spec and spec.image_start_token_id else ()
    tiles = TileTokens.from_tokenizer(tokenizer) if spec and spec.prompt_layout == "tile_grid" else None
    return ImagePrompts(engine, limits, threads=threads, bos_token_id=tokenizer.bos_token_id, around=around,
                        tile_tokens=tiles)


def placeholder_text(engine: EngineDir, tokenizer: Any) -> str | None:
    """The text of the token that marks where an image goes in a prompt; None for a text-only engine."""
    spec = engine.model.vision
    return None if spec is None else tokenizer.convert_ids_to_tokens(spec.placeholder_token_id)

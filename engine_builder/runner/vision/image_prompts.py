"""A prompt with images, made ready for the step loop (the multimodal pipeline, as HF's LlavaProcessor and
get_image_features do it):

    prompt = ImagePrompts(engine).prepare(prompt_ids, images)    # -> ImagePrompt (runner/core/image_prompt.py)

1. each image token in the prompt stands for one image, in order, and becomes tokens_per_image of them (a
   prompt that already holds exactly tokens_per_image per image is taken as it is; one with none gets the
   images first);
2. the images are loaded (bounded, runner/vision/images.py), preprocessed as the model's processor does and
   encoded by the vision graph in one call;
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
from engine_builder.runner.vision.image_processor import preprocess
from engine_builder.runner.vision.images import ImageSource, load_image
from engine_builder.runner.vision.vision_session import VisionSession
from engine_builder.util.errors import InputError, UnsupportedError


class ImagePrompts:
    features_cache_bytes = IMAGE_FEATURES_CACHE_BYTES  # recent images' features kept

    def __init__(self, engine: EngineDir, limits: ImageLimits = ImageLimits(), threads: int | None = None,
                 bos_token_id: int | None = None, around: Sequence[int] = ()) -> None:
        """around: the ids of the text Gemma3Processor puts either side of an image ("\n\n")."""
        self.bos_token_id, self.around = bos_token_id, list(around)
        self.encoder = VisionSession(engine, threads)
        self.spec, self.limits, self.vocab = self.encoder.spec, limits, engine.model.vocab_size
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
        ids = self._expand(list(prompt_ids), len(images))
        pixels = [preprocess(load_image(image, self.limits), spec.processor) for image in images]
        digests = [hashlib.sha256(p.tobytes()).digest() for p in pixels]
        features = self._features(pixels, digests)  # [images, tokens_per_image, hidden]
        positions = np.flatnonzero(np.asarray(ids) == token).astype(np.int64)
        key = list(ids)
        for i, digest in enumerate(digests):
            first = self.vocab + (int.from_bytes(digest[:5], "little")) * spec.tokens_per_image  # never a token id
            for j, at in enumerate(positions[i * spec.tokens_per_image:(i + 1) * spec.tokens_per_image]):
                key[at] = first + j
        return ImagePrompt(ids, positions, features.reshape(-1, features.shape[-1]), key,
                           whole=spec.image_attention == "bidirectional")

    def _features(self, pixels: list[np.ndarray], digests: list[bytes]) -> np.ndarray:
        """The vision graph's features of each image, one call for those not seen lately: a repeated image (a
        conversation's next turn) skips the encoder as its KV skips the prefill (an LRU by bytes)."""
        found = {d: self._recent[d] for d in digests if d in self._recent}
        missing = {d: i for i, d in reversed(list(enumerate(digests))) if d not in found}  # an image's first index
        if missing:
            for d, f in zip(missing, self.encoder.encode(np.stack([pixels[i] for i in missing.values()]))):
                found[d] = f
                self._remember(d, f)
        for d in found:
            if d in self._recent:
                self._recent.move_to_end(d)
        return np.stack([found[d] for d in digests])

    def _remember(self, digest: bytes, features: np.ndarray) -> None:
        self._recent[digest] = features
        self._recent_bytes += features.nbytes
        while self._recent_bytes > self.features_cache_bytes and len(self._recent) > 1:
            self._recent_bytes -= self._recent.popitem(last=False)[1].nbytes

    def _expand(self, ids: list[int], images: int) -> list[int]:
        """Each placeholder becomes the image's layout, as the model's processor writes it: tokens_per_image image
        tokens (LlavaProcessor), or "\n\n", <start_of_image>, the image tokens, <end_of_image>, "\n\n"
        (Gemma3Processor); a prompt with none gets the images first (after its BOS), llava's "<image>\n{prompt}"."""
        spec, per = self.spec, self.spec.tokens_per_image
        if ids.count(spec.image_token_id) == images * per and per > 1:  # already laid out (a client's own ids)
            return ids
        layout = [spec.image_token_id] * per
        if spec.image_start_token_id is not None:
            layout = [*self.around, spec.image_start_token_id, *layout, spec.image_end_token_id, *self.around]
        found = ids.count(spec.placeholder_token_id)
        if found == 0 and spec.image_token_id not in ids:
            at = 1 if ids and ids[0] == self.bos_token_id else 0
            return [*ids[:at], *layout * images, *ids[at:]]
        if found != images:
            raise InputError(f"the prompt has {found} image placeholder(s) (token id {spec.placeholder_token_id}) for "
                             f"{images} image(s); put one in the prompt where each image goes, in order")
        out: list[int] = []
        for t in ids:
            out.extend(layout if t == spec.placeholder_token_id else [t])
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
    """The pipeline of an engine with its tokenizer's BOS and the text Gemma 3 puts around an image."""
    spec = engine.model.vision
    around = tokenizer("\n\n", add_special_tokens=False).input_ids if spec and spec.image_start_token_id else ()
    return ImagePrompts(engine, limits, threads=threads, bos_token_id=tokenizer.bos_token_id, around=around)


def placeholder_text(engine: EngineDir, tokenizer: Any) -> str | None:
    """The text of the token that marks where an image goes in a prompt; None for a text-only engine."""
    spec = engine.model.vision
    return None if spec is None else tokenizer.convert_ids_to_tokens(spec.placeholder_token_id)

"""What one request may hand the image pipeline, and the `trtbuild serve` flags that set it (no Pillow import here:
the CLI parses the flags before anything loads).

    --limit-mm-per-prompt '{"image": 4}'   images per request (vLLM's flag and JSON; other modalities only as 0)
    --max-image-bytes 20MiB                an encoded image (a data URL's decoded bytes, a file)
    --max-image-pixels 36000000            width x height, read from the header before any pixel is decoded

A refusal names the limit and its flag (runner/vision/images.py, image_prompts.py): a server's client gets it as a
400, and its operator knows what to raise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from engine_builder.util.byte_size import parse_byte_size
from engine_builder.util.errors import InputError

IMAGES_FLAG, BYTES_FLAG, PIXELS_FLAG = "--limit-mm-per-prompt", "--max-image-bytes", "--max-image-pixels"
# Pillow's own bound: Image.open refuses an image above twice its MAX_IMAGE_PIXELS (89,478,485 by default) before
# our header check runs, so a larger --max-image-pixels could never be met (tests/vision check the number)
PILLOW_MAX_PIXELS = 2 * 89_478_485


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int = 20 << 20  # an encoded image (a data URL's decoded bytes, a file)
    max_pixels: int = 6000 * 6000  # width x height, checked from the header before decoding
    max_images: int = 8  # per request; 0: no images (vLLM's {"image": 0})

    def __post_init__(self) -> None:
        if self.max_images < 0:
            raise InputError(f"{IMAGES_FLAG}'s image count must be >= 0 (0 takes no images), got {self.max_images}")
        if self.max_bytes < 1:
            raise InputError(f"{BYTES_FLAG} must be at least 1 byte, got {self.max_bytes}")
        if not 1 <= self.max_pixels <= PILLOW_MAX_PIXELS:
            raise InputError(f"{PIXELS_FLAG} must be in [1, {PILLOW_MAX_PIXELS}] (Pillow refuses larger images), "
                             f"got {self.max_pixels}")


def images_per_prompt(text: str) -> int:
    """--limit-mm-per-prompt's JSON ('{"image": 4}', as vLLM takes it) -> images per request."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict) or "image" not in value:
        raise InputError(f"{IMAGES_FLAG} {text!r} is not JSON with an \"image\" count; give e.g. "
                         f"{IMAGES_FLAG} '{{\"image\": 4}}'")
    for modality, count in value.items():
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise InputError(f"{IMAGES_FLAG}: {modality!r} must be a whole number >= 0, got {json.dumps(count)}")
        if modality != "image" and count:
            raise InputError(f"{IMAGES_FLAG}: this server takes images only; give {modality!r} 0 or leave it out")
    return value["image"]


def image_limits_from_flags(limit_mm_per_prompt: str | None, max_image_bytes: str | None,
                            max_image_pixels: int | None) -> ImageLimits:
    """The limits the serve flags set, each left out keeping its default; InputError (exit 2) for a bad value."""
    default = ImageLimits()
    return ImageLimits(
        max_bytes=default.max_bytes if max_image_bytes is None else parse_byte_size(max_image_bytes, BYTES_FLAG),
        max_pixels=default.max_pixels if max_image_pixels is None else max_image_pixels,
        max_images=default.max_images if limit_mm_per_prompt is None else images_per_prompt(limit_mm_per_prompt))

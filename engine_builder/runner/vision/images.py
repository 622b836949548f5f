"""Images in, bounded: what a request may hand the runtime, decoded by Pillow, refused in one line when it is not
an image, is truncated, or is larger than the limits (a decompression bomb is refused from its header, before any
pixel is decoded).

    image = load_image(source, ImageLimits())     # bytes, a path, a data: URL or a PIL image -> RGB PIL image

Remote URLs are refused: the runtime fetches nothing.
"""

from __future__ import annotations

import base64
import binascii
import io
from pathlib import Path
from typing import Any

from PIL import Image, UnidentifiedImageError

from engine_builder.runner.vision.image_limits import BYTES_FLAG, PIXELS_FLAG, ImageLimits
from engine_builder.util.errors import InputError

__all__ = ["ImageLimits", "ImageSource", "load_image"]

ImageSource = Any  # bytes | str (a path or a data: URL) | Path | PIL.Image.Image


def load_image(source: ImageSource, limits: ImageLimits) -> Image.Image:
    """The image as RGB, decoded; InputError naming what is wrong and the limit for anything else."""
    if isinstance(source, Image.Image):
        _check_pixels(source.size, limits, "the image")
        return _rgb(source, "the image")
    data, what = _read(source, limits)
    try:
        image = Image.open(io.BytesIO(data))  # reads the header only
    except Image.DecompressionBombError:  # Pillow's own bound, past twice its MAX_IMAGE_PIXELS
        raise InputError(f"{what} has more than {Image.MAX_IMAGE_PIXELS} pixels; at most {limits.max_pixels} "
                         f"pixels are taken ({PIXELS_FLAG}); downscale it") from None
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise InputError(f"{what} is not an image Pillow can read ({exc}); give a PNG, JPEG, WebP or GIF") from None
    _check_pixels(image.size, limits, what)
    try:
        image.load()
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise InputError(f"{what} could not be decoded ({exc}); it may be truncated or corrupt") from None
    return _rgb(image, what)


def _read(source: ImageSource, limits: ImageLimits) -> tuple[bytes, str]:
    if isinstance(source, bytes | bytearray | memoryview):
        data, what = bytes(source), "the image"
    elif isinstance(source, str) and source.startswith("data:"):
        data, what = _data_url(source, limits), "the data: URL's image"
    elif isinstance(source, str) and source.split(":", 1)[0].lower() in ("http", "https", "ftp", "file"):
        raise InputError(f"image URLs are not fetched ({source[:40]}...); send the image inline as a "
                         "data:image/...;base64,... URL, or give a local path to `trtbuild run --image`")
    elif isinstance(source, str | Path):
        path = Path(source)
        if not path.is_file():
            raise InputError(f"image {path} is not a file; give the path of a PNG, JPEG, WebP or GIF")
        if path.stat().st_size > limits.max_bytes:
            raise InputError(f"image {path} has {path.stat().st_size} bytes, above the limit of {limits.max_bytes} "
                             f"bytes ({BYTES_FLAG}); downscale it")
        data, what = path.read_bytes(), f"image {path}"
    else:
        raise InputError(f"an image must be bytes, a path, a data: URL or a PIL image, got {type(source).__name__}")
    if len(data) > limits.max_bytes:
        raise InputError(f"{what} has {len(data)} bytes, above the limit of {limits.max_bytes} bytes "
                         f"({BYTES_FLAG}); downscale it")
    return data, what


def _data_url(url: str, limits: ImageLimits) -> bytes:
    head, sep, payload = url.partition(",")
    if not sep or not head.startswith("data:image/") or not head.endswith(";base64"):
        raise InputError("an image data URL must look like data:image/png;base64,<base64 bytes>")
    if len(payload) > limits.max_bytes * 4 // 3 + 4:
        raise InputError(f"the data: URL's image is above the limit of {limits.max_bytes} bytes ({BYTES_FLAG}); "
                         "downscale it")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InputError("the data: URL's payload is not valid base64") from None


def _check_pixels(size: tuple[int, int], limits: ImageLimits, what: str) -> None:
    width, height = size
    if width < 1 or height < 1 or width * height > limits.max_pixels:
        raise InputError(f"{what} is {width}x{height} pixels; at most {limits.max_pixels} pixels are taken "
                         f"({PIXELS_FLAG}); downscale it")


def _rgb(image: Image.Image, what: str) -> Image.Image:
    """RGB, as transformers' convert_to_rgb: a transparent image composited on white."""
    if image.mode == "RGB":
        return image
    try:
        if "A" in image.getbands() or image.info.get("transparency") is not None:
            rgba = image.convert("RGBA")
            background = Image.new("RGBA", rgba.size, (255, 255, 255))
            return Image.alpha_composite(background, rgba).convert("RGB")
        return image.convert("RGB")
    except (OSError, ValueError) as exc:
        raise InputError(f"{what} in mode {image.mode} cannot be converted to RGB ({exc})") from None

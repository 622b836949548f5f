"""The model's image preprocessing, as its HF image processor does it (the PIL backend of transformers'
CLIPImageProcessor / LlavaImageProcessor), from the ImageProcessorSpec the converter kept:

    RGB -> pad to a square (do_pad: centred, the mean colour) -> resize (Pillow, the processor's filter) ->
    centre crop -> rescale -> normalize -> float32 [channels, height, width]

A tiled processor (Idefics3's, `ImageProcessorSpec.tiling`) makes several images of one: `preprocess_tiles`, the
cutting in runner/vision/image_tiles.py, each tile rescaled and normalized as above.

tests/vision/test_image_processor.py checks it against transformers' processors on the same images.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from engine_builder.formats.vision_spec import ImageProcessorSpec
from engine_builder.runner.vision.image_tiles import cut_tiles

RESAMPLE = {"nearest": Image.Resampling.NEAREST, "lanczos": Image.Resampling.LANCZOS,
            "bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC,
            "box": Image.Resampling.BOX, "hamming": Image.Resampling.HAMMING}


def preprocess(image: Image.Image, spec: ImageProcessorSpec) -> np.ndarray:
    """One RGB image -> pixel_values float32 [3, height, width]."""
    if spec.do_pad:
        image = _pad_to_square(image, spec.image_mean)
    if spec.do_resize:
        image = image.resize(_resized(image.size, spec)[::-1], RESAMPLE[spec.resample])
    pixels = np.asarray(image)  # [height, width, 3] uint8
    if spec.do_center_crop:
        pixels = _center_crop(pixels, spec.crop_height, spec.crop_width)
    return to_pixel_values(pixels, spec)


def preprocess_tiles(image: Image.Image, spec: ImageProcessorSpec) -> tuple[np.ndarray, tuple[int, int]]:
    """One RGB image -> (pixel_values float32 [images, 3, height, width], (rows, cols) of its tiles): the tiles row
    by row and then the global image with a tiled processor ((0, 0): the image is one tile), else the one image."""
    if spec.tiling is None:
        return preprocess(image, spec)[None], (0, 0)
    frames, grid = cut_tiles(image, spec.tiling, spec.do_resize, RESAMPLE[spec.resample])
    return np.stack([to_pixel_values(np.asarray(frame), spec) for frame in frames]), grid


def to_pixel_values(pixels: np.ndarray, spec: ImageProcessorSpec) -> np.ndarray:
    """uint8 [height, width, 3] -> rescaled, normalized float32 [3, height, width] (transformers' rescale in float64
    then float32, normalize in float32)."""
    out = pixels.astype(np.float64) * spec.rescale_factor if spec.do_rescale else pixels.astype(np.float64)
    out = out.astype(np.float32)
    if spec.do_normalize:
        out = (out - np.asarray(spec.image_mean, np.float32)) / np.asarray(spec.image_std, np.float32)
    return np.ascontiguousarray(out.transpose(2, 0, 1), np.float32)


def _resized(size: tuple[int, int], spec: ImageProcessorSpec) -> tuple[int, int]:
    """(height, width) after the resize: exactly height x width, or the shorter side to shortest_edge (the longer
    scaled and truncated, as transformers' get_resize_output_image_size)."""
    if spec.shortest_edge is None:
        return spec.height, spec.width
    width, height = size
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(spec.shortest_edge * long / short)
    return (new_long, spec.shortest_edge) if width <= height else (spec.shortest_edge, new_long)


def _pad_to_square(image: Image.Image, mean: tuple[float, ...]) -> Image.Image:
    width, height = image.size
    if width == height:
        return image
    side = max(width, height)
    square = Image.new("RGB", (side, side), tuple(int(m * 255) for m in mean))
    square.paste(image, ((side - width) // 2, (side - height) // 2))
    return square


def _center_crop(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """The centre height x width (top / left rounded down); an image smaller than that is first placed in zeros
    (offset rounded up), as transformers' center_crop."""
    h, w = pixels.shape[:2]
    top, left = (h - height) // 2, (w - width) // 2
    if top < 0 or left < 0:
        pad_top, pad_left = -(-(max(h, height) - h) // 2), -(-(max(w, width) - w) // 2)
        padded = np.zeros((max(h, height), max(w, width), pixels.shape[2]), pixels.dtype)
        padded[pad_top:pad_top + h, pad_left:pad_left + w] = pixels
        pixels, top, left = padded, max(0, top + pad_top), max(0, left + pad_left)
    return pixels[top:top + height, left:left + width]

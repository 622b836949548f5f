"""Idefics3's image splitting (transformers' Idefics3ImageProcessor, its PIL backend), from the ImageTiling the
converter kept: one image -> the tiles the vision graph encodes, as images of the tower's size.

    resize (do_resize): the longer side to longest_edge, the shorter in proportion, truncated, then rounded up to even
                        (never above 4096 px a side)
    split:              up to multiples of tile_size (the longer side rounded up, the shorter from the aspect ratio,
                        truncated, then rounded up), cut into tile_size squares row by row, then the whole image
                        resized to one tile (the global image); an image of one tile is that tile alone
    no split:           the image squashed to one tile

Every resize is Pillow's on the uint8 image, in the processor's filter, each from the previous one's output, as
transformers does; the rescale and normalize after it are image_processor.py's.
"""

from __future__ import annotations

import math

from PIL import Image

from engine_builder.formats.vision_spec import MAX_TILES_PER_SIDE, ImageTiling
from engine_builder.util.errors import InputError

MAX_IMAGE_SIZE = 4096  # transformers' MAX_IMAGE_SIZE for Idefics3: no side above it after the first resize


def cut_tiles(image: Image.Image, tiling: ImageTiling, do_resize: bool,
              resample: Image.Resampling) -> tuple[list[Image.Image], tuple[int, int]]:
    """(the images for the vision graph, (rows, cols) of tiles: (0, 0) when the image is one tile)."""
    if do_resize:
        image = _resize(image, _longest_edge_size(image.height, image.width, tiling.longest_edge), resample)
    tile = tiling.tile_size
    if not tiling.split:
        return [_resize(image, (tile, tile), resample)], (0, 0)
    image = _resize(image, _tile_multiple_size(image.height, image.width, tile), resample)
    if image.height <= tile and image.width <= tile:
        return [image], (0, 0)
    rows, cols = (image.height - tile) // tile + 1, (image.width - tile) // tile + 1
    if max(rows, cols) > MAX_TILES_PER_SIDE:
        raise InputError(f"a {image.width}x{image.height} image makes {rows}x{cols} tiles; the model's prompt names at "
                         f"most {MAX_TILES_PER_SIDE} a side: send a smaller image")
    tiles = [image.crop((c * tile, r * tile, (c + 1) * tile, (r + 1) * tile)) for r in range(rows) for c in range(cols)]
    return [*tiles, _resize(image, (tile, tile), resample)], (rows, cols)


def _resize(image: Image.Image, size: tuple[int, int], resample: Image.Resampling) -> Image.Image:
    """IMAGE at (height, width) SIZE (Pillow returns a copy when the size is the same)."""
    return image.resize((size[1], size[0]), resample)


def _longest_edge_size(height: int, width: int, longest: int) -> tuple[int, int]:
    """transformers' _resize_output_size_rescale_to_max_len, then _scale_below_upper_bound at MAX_IMAGE_SIZE."""
    aspect = width / height
    if width >= height:
        width = longest
        height = int(width / aspect)
        height += height % 2
    else:
        height = longest
        width = int(height * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    aspect = width / height
    if width >= height and width > MAX_IMAGE_SIZE:
        width, height = MAX_IMAGE_SIZE, int(MAX_IMAGE_SIZE / aspect)
    elif height > width and height > MAX_IMAGE_SIZE:
        height, width = MAX_IMAGE_SIZE, int(MAX_IMAGE_SIZE * aspect)
    return max(height, 1), max(width, 1)


def _tile_multiple_size(height: int, width: int, tile: int) -> tuple[int, int]:
    """transformers' resize_for_vision_encoder: both sides up to multiples of TILE, the shorter one from the aspect
    ratio of the longer one's new length."""
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    return height, width

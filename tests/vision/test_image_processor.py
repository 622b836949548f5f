"""The runtime's image preprocessing (runner/vision/image_processor.py) against transformers' own processors (their
PIL backends, what a Hugging Face user gets without torchvision) on the same images, and images refused in one line."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
from transformers.models.llava.image_processing_pil_llava import LlavaImageProcessorPil

from engine_builder.formats.vision_spec import ImageProcessorSpec
from engine_builder.runner.vision.image_limits import PILLOW_MAX_PIXELS
from engine_builder.runner.vision.image_processor import preprocess
from engine_builder.runner.vision.images import ImageLimits, load_image
from engine_builder.util.errors import InputError


def _image(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    bands = len(Image.new(mode, (1, 1)).getbands())
    pixels = rng.integers(0, 256, (height, width, bands), np.uint8)
    return Image.fromarray(pixels[..., 0] if bands == 1 else pixels, mode)


def _png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


# (width, height, mode): landscape, portrait, smaller than the crop, RGBA (composited on white), greyscale
IMAGES = [(64, 40, "RGB"), (33, 71, "RGB"), (20, 12, "RGB"), (50, 50, "RGBA"), (45, 30, "L")]
SPECS = [
    ImageProcessorSpec(shortest_edge=32, crop_height=32, crop_width=32),  # CLIP's recipe at a tiny size
    ImageProcessorSpec(shortest_edge=28, crop_height=24, crop_width=30, resample="bilinear"),
    ImageProcessorSpec(shortest_edge=None, height=36, width=36, do_center_crop=False, resample="lanczos"),
]


def _hf(spec: ImageProcessorSpec, pad: bool):
    size = {"shortest_edge": spec.shortest_edge} if spec.shortest_edge else {"height": spec.height,
                                                                               "width": spec.width}
    resample = {"bicubic": 3, "bilinear": 2, "lanczos": 1}[spec.resample]
    kwargs = dict(size=size, crop_size={"height": spec.crop_height, "width": spec.crop_width}, resample=resample,
                  do_center_crop=spec.do_center_crop, image_mean=list(spec.image_mean), image_std=list(spec.image_std))
    return LlavaImageProcessorPil(do_pad=True, **kwargs) if pad else CLIPImageProcessorPil(**kwargs)


@pytest.mark.parametrize("pad", [False, True], ids=["clip", "llava-pad"])
@pytest.mark.parametrize("spec", SPECS, ids=["clip-crop", "rect-crop", "exact-resize"])
def test_pixels_equal_transformers_processors(spec, pad):
    processor = _hf(spec, pad)
    spec = ImageProcessorSpec(**{**spec.__dict__, "do_pad": pad})
    for i, (width, height, mode) in enumerate(IMAGES):
        source = _image(width, height, mode, seed=i)
        want = processor(source, return_tensors="np")["pixel_values"][0]
        got = preprocess(load_image(_png(source), ImageLimits()), spec)
        assert got.dtype == np.float32 and got.shape == want.shape, (mode, got.shape, want.shape)
        np.testing.assert_allclose(got, want, atol=1e-6, err_msg=f"{width}x{height} {mode}")


def test_an_image_arrives_as_bytes_a_path_a_data_url_or_pil(tmp_path):
    image = _image(30, 20)
    path = tmp_path / "cat.png"
    path.write_bytes(_png(image))
    url = "data:image/png;base64," + base64.b64encode(_png(image)).decode()
    decoded = [np.asarray(load_image(s, ImageLimits())) for s in (_png(image), path, str(path), url, image)]
    for d in decoded:
        np.testing.assert_array_equal(d, np.asarray(image))


def test_bad_images_are_one_line_input_errors(tmp_path):
    limits = ImageLimits(max_bytes=20_000, max_pixels=100 * 100)
    png = _png(_image(30, 20))
    cases = {
        b"not an image at all": "not an image Pillow can read",
        png[:len(png) // 2]: "could not be decoded",
        _png(Image.new("RGB", (120, 90))): "120x90 pixels; at most 10000 pixels",  # refused from the header
        png + b"\0" * 20_000: "above the limit of 20000",
        "http://example.com/cat.png": "image URLs are not fetched",
        "data:image/png;base64,@@@": "not valid base64",
        "data:text/plain,hello": "must look like data:image/png;base64",
        str(tmp_path / "missing.png"): "is not a file",
        12: "must be bytes, a path, a data: URL or a PIL image",
    }
    for source, message in cases.items():
        with pytest.raises(InputError, match=message) as info:
            load_image(source, limits)
        assert "\n" not in str(info.value)


def test_a_decompression_bomb_is_refused_before_decoding():
    """A 20,000 x 20,000 PNG of 1-bit pixels is ~50 KB on disk and 1.2 GB decoded: refused from its header."""
    bomb = io.BytesIO()
    Image.new("1", (20_000, 20_000)).save(bomb, "PNG")
    with pytest.raises(InputError, match="pixels are taken"):
        load_image(bomb.getvalue(), ImageLimits())


def test_max_image_pixels_stops_where_pillow_refuses():
    """--max-image-pixels is bounded by Pillow's own refusal (twice Image.MAX_IMAGE_PIXELS), which Image.open raises
    before our header check: a larger limit could never be met."""
    assert PILLOW_MAX_PIXELS == 2 * Image.MAX_IMAGE_PIXELS
    ImageLimits(max_pixels=PILLOW_MAX_PIXELS)
    with pytest.raises(InputError, match="--max-image-pixels must be in"):
        ImageLimits(max_pixels=PILLOW_MAX_PIXELS + 1)

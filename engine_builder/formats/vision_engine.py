"""The vision graph's TensorRT engine: the manifest's `vision_engine` block (a vision-language build with target
tensorrt).

Beside the decoder's rank0.engine, `trtbuild build` parses `vision.trt.onnx` (the tower + projector in the engine's
dtype, formats/vision_spec.py) into `vision.engine`, with one optimization profile over images per call
(pixel_values' first axis) from 1 to the build's `limits.max_images`. Both files are verified files of the manifest
(their sha256 in `files`). Nothing runs it yet: the runtime encodes images with `vision.onnx` on onnxruntime
(runner/vision/vision_session.py), whatever the decoder's backend.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine_builder.formats.vision_spec import VISION_ENGINE, VISION_TRT_MODEL


@dataclass(frozen=True)
class VisionEngine:
    """What was built of the vision graph for TensorRT, and the images per call it takes."""

    dtype: str  # its activations' (the build's dtype, as the decoder engine's)
    images: tuple[int, int, int]  # images per call: the profile's (min, opt, max) of pixel_values' first axis
    engine_bytes: int
    build_seconds: float
    network_layer_types: dict[str, int]  # what the parser made: CONVOLUTION, NORMALIZATION, SOFTMAX...
    engine: str = VISION_ENGINE  # file names in the engine dir
    graph: str = VISION_TRT_MODEL

    def describe(self) -> str:
        """One line for `inspect`."""
        lo, opt, hi = self.images
        return (f"{self.engine} ({self.dtype}, {self.engine_bytes / 1e6:.1f} MB) from {self.graph}: {lo}..{hi} "
                f"images per call (optimized for {opt}), built in {self.build_seconds}s; images run on "
                f"vision.onnx (onnxruntime) until a TensorRT runtime binds it")

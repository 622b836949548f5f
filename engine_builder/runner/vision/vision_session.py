"""The vision graph (vision.onnx: the tower and projector, network/vision_encoder.py) on onnxruntime: pixel_values
in, the features each image's tokens take in the prompt out. It runs before the step loop, once per request's
images (the pipeline: runner/vision/image_prompt.py)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from engine_builder.formats.vision_spec import IMAGE_FEATURES, PIXEL_VALUES, VISION_MODEL
from engine_builder.runner.engine import EngineDir
from engine_builder.runner.ort_backend import session_options
from engine_builder.util.errors import UnsupportedError


class VisionSession:
    def __init__(self, engine: EngineDir, threads: int | None = None) -> None:
        path = engine.path / VISION_MODEL
        if engine.model.vision is None or not path.is_file():
            raise UnsupportedError(f"{engine.path} is not a vision-language engine (no {VISION_MODEL}); images "
                                   "need an engine built from a vision-language checkpoint (e.g. llava)")
        self.spec = engine.model.vision
        self.images_encoded = 0  # images run through the graph so far (a repeated one is not: image_prompts.py)
        options = session_options(engine.twin_dtype, threads)
        try:
            self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
            raise UnsupportedError(f"onnxruntime {ort.__version__} cannot load {path}: {str(exc).splitlines()[0]}; "
                                   "rebuild the engine dir with this trtbuild") from None

    def encode(self, pixel_values: np.ndarray) -> np.ndarray:
        """pixel_values float32 [images, channels, height, width] -> features [images, tokens_per_image, hidden]."""
        self.images_encoded += len(pixel_values)
        (features,) = self.session.run([IMAGE_FEATURES], {PIXEL_VALUES: np.ascontiguousarray(pixel_values,
                                                                                             np.float32)})
        return features

"""A prompt with its images' features, what the multimodal pipeline (runner/vision/image_prompts.py) hands the step
loop: the prefill splices the features in at their positions (generate.py), the prefix cache keys them by content."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ImagePrompt:
    ids: list[int]  # the prompt, each image token expanded to tokens_per_image
    positions: np.ndarray  # [k] int64: the prompt positions that take an image feature (k = images x tokens)
    embeds: np.ndarray  # [k, hidden] float32: the feature each takes
    key: list[int]  # ids for the prefix cache: image positions hold ids of the image's content hash

    def features_for(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """(offsets within [start, end), their features) of the image positions a prefill chunk feeds."""
        lo, hi = np.searchsorted(self.positions, [start, end])
        return self.positions[lo:hi] - start, self.embeds[lo:hi]

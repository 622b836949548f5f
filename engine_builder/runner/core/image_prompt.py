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
    # an image's tokens attend to each other both ways (Gemma 3): the decoder sees that only among the tokens of one
    # call, so a prefill chunk never ends inside an image (chunk_end)
    whole: bool = False

    def features_for(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """(offsets within [start, end), their features) of the image positions a prefill chunk feeds."""
        lo, hi = np.searchsorted(self.positions, [start, end])
        return self.positions[lo:hi] - start, self.embeds[lo:hi]

    def spans(self) -> list[tuple[int, int]]:
        """[start, end) of each image's run of positions."""
        ends = np.flatnonzero(np.diff(self.positions) != 1)  # last index of each run of image positions
        return [(int(self.positions[first]), int(self.positions[last]) + 1)
                for first, last in zip(np.r_[0, ends + 1], np.r_[ends, len(self.positions) - 1])]

    def chunk_end(self, start: int, end: int) -> int:
        """Where a prefill chunk [start, end) should end: END, or (whole images) off the middle of an image: back to
        its start when the chunk began before it, else on to its end."""
        if not self.whole:
            return end
        for a, b in self.spans():
            if a < end < b:
                return a if a > start else b
        return end

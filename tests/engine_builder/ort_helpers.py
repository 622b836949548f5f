"""Drive a decoder model.onnx in onnxruntime the way a runner would: static cache, prefill, decode."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from engine_builder.formats import graph_io as io

LEVELS = {"disable_all": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
          "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC}


@dataclass
class Sequences:
    """A batch's KV buffers (zero-filled, as graph_io asks) and how much of each is filled."""

    cache: dict[str, np.ndarray]
    lengths: np.ndarray  # [batch] int64


class OrtDecoder:
    def __init__(self, model_path: Path, level: str = "basic"):
        options = ort.SessionOptions()
        options.graph_optimization_level = LEVELS[level]
        options.intra_op_num_threads = 2
        self.session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
        self.past_inputs = [i for i in self.session.get_inputs() if i.name.startswith(("past_key.", "past_value."))]
        self.kv_dtype = {"tensor(float16)": np.float16, "tensor(int8)": np.int8}.get(self.past_inputs[0].type,
                                                                                     np.float32)
        self.num_layers = len(self.past_inputs) // 2
        meta = self.session.get_modelmeta().custom_metadata_map
        # longrope: growing past this length invalidates the cache (see decoder.py)
        self.reprefill_after = io.reprefill_after(meta)

    def empty(self, batch: int) -> Sequences:
        cache = {i.name: np.zeros([batch, *i.shape[1:]], self.kv_dtype) for i in self.past_inputs}
        return Sequences(cache, np.zeros(batch, np.int64))

    def run(self, seqs: Sequences, input_ids: np.ndarray, advance: np.ndarray | None = None,
            position_ids: np.ndarray | None = None) -> np.ndarray:
        """Feed input_ids [batch, seq] at each sequence's current length; returns the logits.

        advance[b] is how many of the fed tokens are real (the rest is right padding), default all.
        position_ids default to each token's cache slot.
        """
        input_ids = np.asarray(input_ids, np.int64)
        batch, seq = input_ids.shape
        positions = seqs.lengths[:, None] + np.arange(seq, dtype=np.int64)[None, :]
        if position_ids is not None:
            positions = np.asarray(position_ids, np.int64)
        feeds = {io.INPUT_IDS: input_ids, io.POSITION_IDS: positions, io.PAST_LENGTHS: seqs.lengths, **seqs.cache}
        outputs = self.session.run(None, feeds)
        names = [o.name for o in self.session.get_outputs()]
        for name, value in zip(names[1:], outputs[1:]):
            seqs.cache[name.replace("present_", "past_")] = value
        seqs.lengths = seqs.lengths + (np.full(batch, seq) if advance is None else np.asarray(advance))
        return outputs[0]

    def greedy(self, prompt: list[int], steps: int) -> tuple[list[int], list[np.ndarray]]:
        """Prefill PROMPT then decode STEPS tokens greedily: (new tokens, logits [vocab] per token)."""
        seqs = self.empty(1)
        logits = self.run(seqs, np.array([prompt]))[0, -1]
        tokens, all_logits = [], []
        for step in range(steps):
            all_logits.append(logits)
            tokens.append(int(np.argmax(logits)))
            if step + 1 == steps:
                break
            if self.reprefill_after is not None and seqs.lengths[0] == self.reprefill_after:
                seqs = self.empty(1)  # the next token crosses the switch: recompute every key
                logits = self.run(seqs, np.array([prompt + tokens]))[0, -1]
            else:
                logits = self.run(seqs, np.array([[tokens[-1]]]))[0, -1]
        return tokens, all_logits

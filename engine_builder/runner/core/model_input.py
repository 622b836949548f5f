"""One engine call as a flat batch of tokens: the contract between the loop and every backend.

vLLM v1 and TensorRT-LLM's PyTorch runtime hand their model the same shape: the new tokens of every
sequence back to back, each with its position, per-sequence block tables and context lengths, and the
flat indices whose logits are wanted. A paged backend (runner/torch_backend/) reads it as it is; a slot
engine (the onnxruntime twin and TensorRT graphs: [rows, seq] over a contiguous slot range) reads each
block table as its slot and each context length minus its new tokens as that slot's length
(`SlotRows`, below, is that reading).

The arrays are numpy on the host; a device backend copies them once per step (a few hundred bytes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ImageEmbeds:
    """A vision-language step's image features: the flat tokens that take one (image-token positions of a prompt
    chunk) and the feature each takes in place of its token's embedding (runner/vision/image_prompt.py)."""

    token_index: np.ndarray  # [k] int64: indices into ModelInput.token_ids
    embeds: np.ndarray  # [k, hidden] float32


@dataclass(frozen=True)
class DeviceTokens:
    """Token ids still on the backend's device: the previous step's samples, which the step takes without waiting
    for them to reach the host (async scheduling, runner/async_decode.py). token_ids[rows[i]] is source[index[i]];
    what token_ids holds at those rows is stale. Only a backend with `takes_device_tokens` accepts them."""

    rows: np.ndarray  # [m] int64: indices into ModelInput.token_ids
    source: Any  # [k] int64, a tensor on the backend's device
    index: np.ndarray  # [m] int64: indices into source


@dataclass(frozen=True)
class ModelInput:
    token_ids: np.ndarray  # [num_tokens] int64: every sequence's new tokens, back to back
    positions: np.ndarray  # [num_tokens] int64: each token's position in its sequence
    query_start: np.ndarray  # [num_seqs + 1] int64: sequence i: token_ids[query_start[i]:query_start[i + 1]]
    context_lens: np.ndarray  # [num_seqs] int64: positions each sequence holds once this step's tokens are written
    slots: np.ndarray  # [num_seqs] int64: the KV cache slot (the KV manager's sequence id) of each sequence
    logits_indices: np.ndarray  # [num_logits] int64: flat token indices whose logits come back, in this order
    images: ImageEmbeds | None = None  # a vision-language prefill: the features spliced in at image positions
    device_tokens: DeviceTokens | None = None  # ids to take from the device instead (async scheduling)

    @property
    def num_seqs(self) -> int:
        return len(self.slots)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def query_lens(self) -> np.ndarray:
        return np.diff(self.query_start)

    @property
    def seq_of_token(self) -> np.ndarray:
        """[num_tokens] int64: each token's sequence (its index among the step's sequences)."""
        return np.repeat(np.arange(self.num_seqs), self.query_lens)

    @classmethod
    def decode(cls, slots: np.ndarray, token_ids: np.ndarray, lengths: np.ndarray,
               device_tokens: DeviceTokens | None = None) -> ModelInput:
        """One token per sequence (token_ids [seqs] at slots' lengths [seqs]), each one's logits."""
        n = len(slots)
        at = np.arange(n, dtype=np.int64)
        return cls(token_ids=token_ids.astype(np.int64, copy=False), positions=lengths.astype(np.int64, copy=True),
                   query_start=np.arange(n + 1, dtype=np.int64), context_lens=lengths + 1,
                   slots=slots.astype(np.int64, copy=False), logits_indices=at, device_tokens=device_tokens)

    @classmethod
    def ragged(cls, slots: np.ndarray, tokens: list[np.ndarray], lengths: np.ndarray,
               images: ImageEmbeds | None = None) -> ModelInput:
        """Each sequence's tokens written at its slot's length; the logits of each one's last token. images: the
        features of image positions, their token_index into the tokens back to back."""
        lens = np.fromiter((len(t) for t in tokens), np.int64, len(tokens))
        start = np.zeros(len(tokens) + 1, np.int64)
        np.cumsum(lens, out=start[1:])
        seq_of = np.repeat(np.arange(len(tokens)), lens)
        positions = lengths[seq_of] + np.arange(int(start[-1]), dtype=np.int64) - start[seq_of]
        return cls(token_ids=np.concatenate(tokens).astype(np.int64, copy=False), positions=positions,
                   query_start=start, context_lens=lengths + lens, slots=slots.astype(np.int64, copy=False),
                   logits_indices=start[1:] - 1, images=images)

    @classmethod
    def rows(cls, first_slot: int, input_ids: np.ndarray, lengths: np.ndarray, logits: int = 1,
             images: ImageEmbeds | None = None) -> ModelInput:
        """The batch a slot engine's step over slots first_slot.. takes: input_ids [rows, seq] written at each
        row's length (lengths [rows]), the logits of each row's last `logits` positions (row-major)."""
        rows, seq = input_ids.shape
        offsets = np.arange(seq, dtype=np.int64)
        tail = min(seq, logits)
        last = (np.arange(rows, dtype=np.int64)[:, None] * seq + offsets[seq - tail:][None, :]).reshape(-1)
        return cls(token_ids=input_ids.reshape(-1).astype(np.int64, copy=False),
                   positions=(lengths[:, None] + offsets[None, :]).reshape(-1),
                   query_start=np.arange(rows + 1, dtype=np.int64) * seq,
                   context_lens=lengths + seq,
                   slots=np.arange(first_slot, first_slot + rows, dtype=np.int64),
                   logits_indices=last, images=images)


@dataclass(frozen=True)
class SlotRows:
    """A ModelInput as a slot engine's rectangular step: rows first_slot.. of width seq, and where each
    wanted logit lies in the engine's [rows, tail, vocab] output."""

    first_slot: int
    input_ids: np.ndarray  # [rows, seq] int64; rows no sequence holds ride along with token 0
    tail: int  # the engine must return each row's last `tail` positions
    row_of: np.ndarray  # [num_logits] row of each wanted logit
    tail_of: np.ndarray  # [num_logits] its index among the row's last `tail` positions
    whole: bool  # every row's last `tail` positions, row-major: the engine's logits as they are
    image_at: np.ndarray | None = None  # [k] where each of batch.images' features lies in input_ids, flattened

    @classmethod
    def of(cls, batch: ModelInput) -> SlotRows:
        """The rectangle: every sequence's query is one row (slot order), right-padded with 0 to the longest."""
        lens = batch.query_lens
        seq, n = int(lens.max()), batch.num_seqs
        first = int(batch.slots.min())
        li = batch.logits_indices
        image_at = None if batch.images is None else batch.images.token_index
        if (lens == seq).all() and (batch.slots == np.arange(first, first + n)).all():  # already a rectangle
            ids = batch.token_ids.reshape(n, seq)
            row_of, col_of = li // seq, li % seq
        else:
            ids = np.zeros((int(batch.slots.max()) - first + 1, seq), np.int64)
            row = batch.slots - first
            seq_of = np.repeat(np.arange(n), lens)
            col = np.arange(batch.num_tokens) - batch.query_start[seq_of]
            ids[row[seq_of], col] = batch.token_ids
            row_of, col_of = row[seq_of[li]], col[li]
            if image_at is not None:
                image_at = row[seq_of[image_at]] * seq + col[image_at]
        tail = int(seq - col_of.min()) if len(li) else 1
        tail_of = col_of - (seq - tail)
        natural = np.arange(len(ids) * tail)
        whole = len(li) == len(natural) and bool((row_of * tail + tail_of == natural).all())
        return cls(first, ids, tail, row_of, tail_of, whole, image_at)

"""Names and layouts of the decoder graph's inputs and outputs: the contract with the runner.

    input_ids        int64  [batch, seq]
    position_ids     int64  [batch, seq]          rotary positions (normally past_lengths[b] + t)
    past_lengths     int64  [batch]               valid cached tokens per sequence = KV write offset
    past_key.{i}     dtype  [batch, kv_heads, max_seq, head_dim]   static cache buffer, layer i
                                                                   (int8 with `convert --kv-cache int8`)
    past_value.{i}   dtype  [batch, kv_heads, max_seq, head_dim]
    ->
    logits           float32 [batch, 1, vocab]    last position ([batch, seq, vocab] with all_logits)
    present_key.{i}  dtype  [batch, kv_heads, max_seq, head_dim]   the whole updated buffer
    present_value.{i}

Token t of sequence b is written to cache slot past_lengths[b] + t and attends to slots
0..past_lengths[b] + t (minus those outside a sliding window). past_lengths[b] + seq must not
exceed max_seq. Slots beyond a sequence's length are masked but still multiplied by a zero
probability, so the runner must allocate the buffers zero-filled (NaN * 0 is NaN).
The semantics match TensorScatter-24 (write_indices = past_lengths, axis -2) and
Attention-24 (nonpad_kv_seqlen = past_lengths + seq), which later passes lower to.

Ragged batches: right-pad the shorter rows and advance each row's past_lengths by its real
token count only; the padding's cache slots stay masked until real tokens overwrite them.
Rope scaling that depends on the sequence length (longrope, dynamic NTK) takes it per row
as max(position_ids[b]) + 1, so give padding a position no larger than the row's last real
one (0 will do). With longrope, model.onnx metadata `trtbuild.reprefill_after` = N: when a
sequence grows past N tokens, its cached keys (rotated with the short table) are stale and
the whole sequence must be prefilled again, as transformers' phi3 generate does.
"""

from __future__ import annotations

INPUT_IDS = "input_ids"
POSITION_IDS = "position_ids"
PAST_LENGTHS = "past_lengths"
LOGITS = "logits"

# symbolic dims
BATCH = "batch"
SEQ = "seq"


def past_key(layer: int) -> str:
    return f"past_key.{layer}"


def past_value(layer: int) -> str:
    return f"past_value.{layer}"


def present_key(layer: int) -> str:
    return f"present_key.{layer}"


def present_value(layer: int) -> str:
    return f"present_value.{layer}"

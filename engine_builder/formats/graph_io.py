"""Names and layouts of the decoder graph's inputs and outputs: the contract with the runner.

    input_ids        int64  [batch, seq]
    position_ids     int64  [batch, seq]          rotary positions (normally past_lengths[b] + t)
    past_lengths     int64  [batch]               valid cached tokens per sequence = KV write offset
    past_key.{i}     dtype  [batch, kv_heads, max_seq, head_dim]   static cache buffer, layer i
                                                                   (int8 with `convert --kv-cache int8`)
    past_value.{i}   dtype  [batch, kv_heads, max_seq, head_dim]
    image_embeds     float32 [batch, seq, hidden]  vision models only (ModelConfig.vision set): the image features
                                                  at the image-token positions (anything finite elsewhere: zeros)
    image_mask       bool   [batch, seq]          vision models only: true where image_embeds replaces the token's
                                                  embedding (HF llava's masked_scatter); all false for text rows.
                                                  With VisionSpec.image_attention "bidirectional" (Gemma 3) each run
                                                  of true (one image) also attends both ways within itself, so an
                                                  image's tokens must all be in one call (network/masks.py)
    ->
    logits           float32 [batch, 1, vocab]    last position ([batch, seq, vocab] with all_logits;
                                                  [batch, min(seq, T), vocab] with metadata logits_tail = T > 1)
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

from dataclasses import dataclass

from engine_builder.formats.model_config import ModelConfig

INPUT_IDS = "input_ids"
POSITION_IDS = "position_ids"
PAST_LENGTHS = "past_lengths"
LOGITS = "logits"
# vision-language decoders (ModelConfig.vision set) only; a text model's graph has neither input
IMAGE_EMBEDS = "image_embeds"  # float32 [batch, seq, hidden]
IMAGE_MASK = "image_mask"  # bool [batch, seq]

# symbolic dims
BATCH = "batch"
SEQ = "seq"
LOGITS_SEQ = "logits_seq"  # min(seq, logits_tail)
INT64_MAX = (1 << 63) - 1  # Slice's "to the end"

# model.onnx metadata_props keys: what the emitter and the passes record, what the backends read
META_ARCHITECTURE = "trtbuild.architecture"
META_MAX_SEQ_LEN = "trtbuild.max_seq_len"
META_ALL_LOGITS = "trtbuild.all_logits"  # "true": logits for every position, [batch, seq, vocab]
META_DTYPE = "trtbuild.dtype"
# logits of the last min(seq, N) positions (absent: 1). A speculative verify step feeds the last token and
# k <= N - 1 drafts and reads every position's logits; a long prefill still computes the LM head N times only
META_LOGITS_TAIL = "trtbuild.logits_tail"
META_REPREFILL_AFTER = "trtbuild.reprefill_after"  # longrope: re-prefill a sequence past this many tokens
META_KV_UPDATE = "trtbuild.kv_update"  # in_place | copy: may present_* share past_*'s buffer
META_ORT_ACCURACY_LEVEL = "trtbuild.ort_accuracy_level"  # MatMulNBits accuracy_level the lowering chose
# "1": a step of several rows and several tokens over a non-empty cache runs one row per call (the onnxruntime
# twin's GroupQueryAttention without its fallback branch: passes/drop_ort_attention_fallback.py)
META_GQA_ROWS_PER_CALL = "trtbuild.gqa_rows_per_call"


def reprefill_after(metadata: dict[str, str]) -> int | None:
    """The longrope switch-over length recorded in a graph's metadata, None when it has none."""
    value = metadata.get(META_REPREFILL_AFTER)
    return int(value) if value is not None else None


def logits_tail(metadata: dict[str, str]) -> int:
    """How many trailing positions a step's logits cover (1 for graphs built before the key existed)."""
    if metadata.get(META_ALL_LOGITS) == "true":
        return 1 << 30  # every position
    return int(metadata.get(META_LOGITS_TAIL, "1"))


def past_key(layer: int) -> str:
    return f"past_key.{layer}"


def past_value(layer: int) -> str:
    return f"past_value.{layer}"


def present_key(layer: int) -> str:
    return f"present_key.{layer}"


def present_value(layer: int) -> str:
    return f"present_value.{layer}"


KV_ITEM_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1}


@dataclass(frozen=True)
class KVCacheLayout:
    """The static cache every layer's past_key/past_value (and present_*) tensor holds, per sequence slot:
    [batch, kv_heads, max_seq, head_dim], in the graph's activation dtype or int8 (`convert --kv-cache int8`).

    The emitter declares the graph's cache inputs from it and the runtime allocates its buffers from it,
    both from the same manifest fields, so neither reads the other's shapes."""

    num_layers: int
    kv_heads: int
    max_seq: int
    head_dim: int
    dtype: str  # float32 | float16 | bfloat16 | int8

    @classmethod
    def of(cls, model: ModelConfig, max_seq_len: int, dtype: str, kv_cache: str = "none") -> KVCacheLayout:
        """The layout of MODEL built for MAX_SEQ_LEN positions with activation DTYPE and KV_CACHE quantization."""
        return cls(model.num_layers, model.num_kv_heads, max_seq_len, model.head_dim,
                   "int8" if kv_cache == "int8" else dtype)

    def shape(self, batch: int | str) -> tuple[int | str, int, int, int]:
        return (batch, self.kv_heads, self.max_seq, self.head_dim)

    @property
    def bytes_per_token(self) -> int:
        """Keys and values of one position in every layer."""
        return 2 * self.num_layers * self.kv_heads * self.head_dim * KV_ITEM_BYTES[self.dtype]


# --- paged layout (`trtbuild build --kv-layout paged`) ---------------------------------------------
#
#     block_table          int64 [batch, max_blocks]                    pool block of each sequence's logical
#                                                                       block j (positions j*B .. j*B + B - 1)
#     kv_pool_key.{i}      dtype [kv_heads, num_blocks, block_size, head_dim]   every sequence's keys, layer i
#     kv_pool_value.{i}                                                         (head-major: network/paged_attention.py)
#     ->
#     present_pool_key.{i} dtype [kv_heads, num_blocks, block_size, head_dim]   the updated pool (bind it over
#     present_pool_value.{i}                                                    kv_pool_*: updated in place)
#
# Token t of sequence b sits at p = past_lengths[b] + t, is written to block block_table[b, p // B] at
# offset p % B, and attends to logical positions 0..p (of the max_blocks * B the table maps). max_blocks
# is dynamic: the runner passes as many columns as the longest row of the step needs, so a step reads
# only the blocks it uses. Unused table entries must name a block holding finite values (the runner
# keeps block 0 as a scratch block for them, and for rows that ride along idle); their positions are
# masked. num_blocks is dynamic: the runtime sizes the pool from its memory budget.

KV_LAYOUTS = ("slots", "paged")
BLOCK_TABLE = "block_table"
NUM_BLOCKS = "num_blocks"
POOL_BLOCK_AXIS = 1  # the pool's block axis (num_blocks, the dynamic one)
MAX_BLOCKS = "max_blocks"
META_KV_LAYOUT = "trtbuild.kv_layout"  # slots (absent) | paged
META_KV_BLOCK_SIZE = "trtbuild.kv_block_size"


def kv_pool_key(layer: int) -> str:
    return f"kv_pool_key.{layer}"


def kv_pool_value(layer: int) -> str:
    return f"kv_pool_value.{layer}"


def present_pool_key(layer: int) -> str:
    return f"present_pool_key.{layer}"


def present_pool_value(layer: int) -> str:
    return f"present_pool_value.{layer}"


@dataclass(frozen=True)
class PagedKVLayout:
    """The block pool every layer's kv_pool_key/kv_pool_value (and present_pool_*) tensor holds:
    [kv_heads, num_blocks, block_size, head_dim], num_blocks chosen at run time. Per head a block is one
    contiguous [block_size, head_dim] tile, and head-major, so the gathered cache comes out as
    [kv_heads, batch, max_blocks * block_size, head_dim], the order attention reads it in (no transpose copy:
    network/paged_attention.py)."""

    num_layers: int
    kv_heads: int
    block_size: int
    head_dim: int
    dtype: str  # float32 | float16 | bfloat16 | int8
    max_seq: int  # positions one sequence may hold (the build's max_seq_len)

    @classmethod
    def of(cls, model: ModelConfig, max_seq_len: int, dtype: str, kv_cache: str = "none",
           block_size: int = 16) -> PagedKVLayout:
        return cls(model.num_layers, model.num_kv_heads, block_size, model.head_dim,
                   "int8" if kv_cache == "int8" else dtype, max_seq_len)

    @property
    def max_blocks_per_seq(self) -> int:
        return -(-self.max_seq // self.block_size)

    def pool_shape(self, num_blocks: int | str) -> tuple[int, int | str, int, int]:
        return (self.kv_heads, num_blocks, self.block_size, self.head_dim)

    def max_pool_blocks(self, max_batch: int) -> int:
        """The pool size the TensorRT profile allows: max_batch full sequences, 4x over for cached prefixes."""
        return 4 * max_batch * self.max_blocks_per_seq + 1

    @property
    def bytes_per_block(self) -> int:
        """Keys and values of one block in every layer."""
        return 2 * self.num_layers * self.kv_heads * self.block_size * self.head_dim * KV_ITEM_BYTES[self.dtype]

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.kv_heads * self.head_dim * KV_ITEM_BYTES[self.dtype]


def save_with_metadata(model, path, props: dict[str, str]) -> None:
    """Save MODEL (an onnx.ModelProto loaded without its external data) to PATH with PROPS merged into its
    metadata: the graph file only, its tensors keep their external references."""
    import onnx

    merged = {p.key: p.value for p in model.metadata_props} | props
    del model.metadata_props[:]
    onnx.helper.set_model_props(model, merged)
    onnx.save(model, str(path))

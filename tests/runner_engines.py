"""Engine dirs for the runner tests: what they are built from and with which passes."""

from __future__ import annotations

from pathlib import Path

from engine_builder.build.pipeline import build
from engine_builder.formats.build_config import FUSIONS, BuildConfig, Limits, PassLists

SMOL_LIMITS = Limits(max_batch=4, max_input_len=128, max_seq_len=256)
# the onnxruntime lowering (com.microsoft GroupQueryAttention, shared past/present buffer) named
# explicitly, so both graph kinds stay covered whatever the default pass list becomes
GQA_PASSES = (*FUSIONS, "lower_ort_attention", "eliminate_dead_code")


# a chat template for the word tokenizer: every message's role and content, then the assistant's turn
TINY_CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }} {{ m['content'] }}\n{% endfor %}assistant"

def build_engine(ckpt: Path, out: Path, limits: Limits = SMOL_LIMITS, dtype: str = "float32",
                 ort_passes: tuple[str, ...] | None = None) -> Path:
    passes = PassLists(onnxruntime=ort_passes) if ort_passes else PassLists()
    build(ckpt, out, BuildConfig(targets=("onnxruntime",), dtype=dtype, limits=limits, passes=passes))
    return out


def build_paged_engine(ckpt: Path, out: Path, limits: Limits = SMOL_LIMITS, block: int = 16) -> Path:
    """The float32 twin with the paged KV layout (`build --kv-layout paged --kv-block-size BLOCK`)."""
    build(ckpt, out, BuildConfig(targets=("onnxruntime",), dtype="float32", kv_layout="paged", kv_block_size=block,
                                 limits=limits))
    return out


def add_word_tokenizer(hf_dir: Path, vocab_size: int) -> None:
    """A word-level tokenizer over "w0".."w{n-1}" (id i <-> "wi"), so a tiny random model has text."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="w1", eos_token="w2",
                                                pad_token="w0", unk_token="w0")
    fast.save_pretrained(hf_dir)

"""Hugging Face transformers as the numeric reference: greedy generation with per-step logits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import transformers


def load_hf(hf_dir: Path, dtype: torch.dtype = torch.float32, gguf_file: str | None = None) \
        -> transformers.PreTrainedModel:
    """HF_DIR's model, or the file GGUF_FILE in it (transformers dequantizes it)."""
    # a fresh model per reference run: dynamic rope keeps state between calls
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=dtype, attn_implementation="eager",
                                                              gguf_file=gguf_file)
    model.generation_config.eos_token_id = None  # random weights may emit EOS; we want every step
    return model.eval()


def hf_greedy(hf_dir: Path, prompt: list[int], steps: int, gguf_file: str | None = None) \
        -> tuple[list[int], list[np.ndarray]]:
    out = load_hf(hf_dir, gguf_file=gguf_file).generate(
        torch.tensor([prompt]), do_sample=False, max_new_tokens=steps, output_logits=True,
        return_dict_in_generate=True, pad_token_id=0)
    return out.sequences[0, len(prompt):].tolist(), [step[0].numpy() for step in out.logits]


def prompt_of(length: int, seed: int = 0, vocab: int = 320) -> list[int]:
    return np.random.default_rng(seed).integers(3, vocab, length).tolist()

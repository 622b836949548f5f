"""One registered file per architecture. Importing this package registers every one of them."""

from converters.archs import (  # noqa: F401
    bert,
    gemma2,
    gemma3,
    gpt2,
    gpt_neox,
    idefics3,
    llama,
    llava,
    mistral,
    mixtral,
    phi3,
    qwen2,
    qwen2_moe,
    qwen3,
    qwen3_moe,
)

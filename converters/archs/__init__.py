"""One registered file per architecture. Importing this package registers every one of them."""

from converters.archs import bert, gemma2, gemma3, gpt2, gpt_neox, llama, mistral, phi3, qwen2, qwen3  # noqa: F401

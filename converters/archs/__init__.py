"""One registered file per architecture. Importing this package registers every one of them."""

from converters.archs import gemma2, gemma3, llama, mistral, mixtral, phi3, qwen2, qwen2_moe, qwen3, qwen3_moe  # noqa: F401

"""HF safetensors / GGUF -> canonical checkpoint. Importing this package registers every architecture."""

from converters import gemma2, gemma3, llama, mistral, phi3, qwen2, qwen3  # noqa: F401
from converters.base import get_converter, register_converter, supported_model_types

__all__ = ["get_converter", "register_converter", "supported_model_types"]

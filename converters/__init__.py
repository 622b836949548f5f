"""HF safetensors / GGUF -> canonical checkpoint. Importing this package registers every architecture."""

from converters import archs  # noqa: F401
from converters.registry import get_converter, register_converter, supported_model_types

__all__ = ["get_converter", "register_converter", "supported_model_types"]

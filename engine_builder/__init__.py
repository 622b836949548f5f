"""trtbuild: ahead-of-time TensorRT engine builds for Hugging Face LLMs."""

__version__ = "0.1.0"

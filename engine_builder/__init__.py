"""trtbuild: ahead-of-time TensorRT engine builds for Hugging Face LLMs."""

from engine_builder.util.version import __version__

__all__ = ["LLM", "RequestOutput", "SamplingParams", "__version__"]


def __getattr__(name: str):
    # Lazy (PEP 562): `import engine_builder` stays cheap for the build side and the CLI.
    if name in ("LLM", "RequestOutput", "SamplingParams"):
        from engine_builder.runner import llm

        return getattr(llm, name)
    raise AttributeError(f"module 'engine_builder' has no attribute {name!r}")

"""trtbuild: ahead-of-time TensorRT engine builds for Hugging Face LLMs."""

__version__ = "0.1.0"

__all__ = ["LLM", "RequestOutput", "SamplingParams", "__version__"]


def __getattr__(name: str):
    # Lazy (PEP 562): `import engine_builder` stays cheap for the build side and the CLI, and
    # engine_builder.build imports __version__ from here without pulling in the runner.
    if name in ("LLM", "RequestOutput", "SamplingParams"):
        from engine_builder.runner import llm

        return getattr(llm, name)
    raise AttributeError(f"module 'engine_builder' has no attribute {name!r}")

"""trtbuild: ahead-of-time TensorRT engine builds for Hugging Face LLMs."""

from engine_builder.util.version import __version__

__all__ = ["LLM", "Embeddings", "RequestOutput", "SamplingParams", "TokenStream", "__version__"]


def __getattr__(name: str):
    # Lazy (PEP 562): `import engine_builder` stays cheap for the build side and the CLI.
    if name in ("LLM", "SamplingParams"):  # the generation facade (runner/llm.py)
        from engine_builder.runner import llm

        return getattr(llm, name)
    if name == "Embeddings":  # encoder engines' own entry point
        from engine_builder.runner import embeddings

        return embeddings.Embeddings
    if name in ("RequestOutput", "TokenStream"):  # what a request gives back
        from engine_builder.runner import outputs

        return getattr(outputs, name)
    raise AttributeError(f"module 'engine_builder' has no attribute {name!r}")

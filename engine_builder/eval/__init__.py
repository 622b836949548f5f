"""`trtbuild eval`: perplexity, KL divergence and top-1 agreement of an engine dir, and the recipe
fidelity gates built on them.

    from engine_builder.eval import evaluate
    result = evaluate("engine", reference="ckpt-fp32")      # EvalResult: ppl, kl, top1_agreement, ...
"""

__all__ = ["EvalResult", "evaluate"]


def __getattr__(name: str):
    # Lazy (PEP 562): the CLI imports eval's constants at startup without loading the runner
    if name in __all__:
        from engine_builder.eval import evaluation

        return getattr(evaluation, name)
    raise AttributeError(f"module 'engine_builder.eval' has no attribute {name!r}")

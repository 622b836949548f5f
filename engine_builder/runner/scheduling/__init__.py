"""Scheduling policy over a Generator: KV-block admission, growth, preemption, chunked and batched prefill.

The server's Executor (engine_builder/executor/) drives it from its thread; LLM.generate / stream / chat drive
it synchronously (block_admission.py). Both run the same step (engine_step.py), so a request's tokens do not
depend on which of the two ran it."""

"""`trtbuild serve`'s scheduling flags -> SchedulerConfig, with errors that name the flag."""

from __future__ import annotations

from engine_builder.executor.scheduler import SchedulerConfig
from engine_builder.util.errors import InputError


def scheduler_config(max_batch: int | None, max_queue: int, max_num_batched_tokens: int | None = None,
                     kv_budget_tokens: int | None = None) -> SchedulerConfig:
    for flag, value in (("--max-num-batched-tokens", max_num_batched_tokens), ("--kv-budget-tokens", kv_budget_tokens)):
        if value is not None and value < 1:
            raise InputError(f"{flag} must be >= 1, got {value}")
    if kv_budget_tokens is not None and kv_budget_tokens < SchedulerConfig.kv_block_tokens:
        raise InputError(f"--kv-budget-tokens {kv_budget_tokens} holds no {SchedulerConfig.kv_block_tokens}-token "
                         "block; give at least one engine's max_seq_len")
    return SchedulerConfig(max_batch=max_batch, max_queue=max_queue,
                           max_tokens_per_step=max_num_batched_tokens,
                           kv_budget_tokens=kv_budget_tokens)

"""`trtbuild serve`'s scheduling flags -> SchedulerConfig, with errors that name the flag."""

from __future__ import annotations

from engine_builder.formats.build_config import Limits
from engine_builder.runner.scheduling.scheduler import SchedulerConfig
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


def budget_total_tokens(limits: Limits, kv_budget_tokens: int, max_input_tokens: int | None) -> int | None:
    """The server's default max_total_tokens under a KV budget smaller than max_seq_len: what one request may hold
    (whole blocks), so a larger one gets 422 naming that limit; None (the engine's) when the budget is larger or
    would leave no room past the longest prompt."""
    cap = min(limits.max_seq_len, kv_budget_tokens // SchedulerConfig.kv_block_tokens * SchedulerConfig.kv_block_tokens)
    longest_prompt = max_input_tokens if max_input_tokens is not None else limits.max_input_len
    return cap if longest_prompt < cap < limits.max_seq_len else None

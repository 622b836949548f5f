"""The server's limits, fixed at start-up: what `trtbuild serve` flags set, checked against the engine."""

from __future__ import annotations

from dataclasses import dataclass

from engine_builder.formats.build_config import Limits
from engine_builder.util.errors import InputError

# Active generation requests (queued + running) the server accepts before it answers 429; a
# queue well beyond the engine's KV slots only adds latency, never throughput.
DEFAULT_MAX_CONCURRENT_REQUESTS = 128


@dataclass(frozen=True)
class ServerConfig:
    model_name: str  # what /v1/models lists and requests must name (when they name one)
    max_input_tokens: int  # longest prompt, in tokens
    max_total_tokens: int  # prompt + generated tokens of one request
    max_concurrent_requests: int = DEFAULT_MAX_CONCURRENT_REQUESTS
    api_key: str | None = None  # when set, every generation route needs `Authorization: Bearer <key>`

    @classmethod
    def for_engine(cls, limits: Limits, model_name: str, *, max_input_tokens: int | None = None,
                   max_total_tokens: int | None = None,
                   max_concurrent_requests: int = DEFAULT_MAX_CONCURRENT_REQUESTS,
                   api_key: str | None = None) -> ServerConfig:
        """Defaults from the engine's limits; a limit above the engine's is a user error (it could
        never be served), so it fails at start-up rather than on the first long request."""
        max_input = limits.max_input_len if max_input_tokens is None else max_input_tokens
        max_total = limits.max_seq_len if max_total_tokens is None else max_total_tokens
        if not 1 <= max_input <= limits.max_input_len:
            raise InputError(f"--max-input-tokens {max_input} must be in [1, {limits.max_input_len}] (the engine's "
                             "max_input_len); lower it or rebuild the engine with a larger --max-input-len")
        if not max_input < max_total <= limits.max_seq_len:
            raise InputError(f"--max-total-tokens {max_total} must be above --max-input-tokens {max_input} and at "
                             f"most {limits.max_seq_len} (the engine's max_seq_len); adjust it or rebuild the engine "
                             "with a larger --max-seq-len")
        if max_concurrent_requests < 1:
            raise InputError(f"--max-concurrent-requests must be >= 1, got {max_concurrent_requests}")
        if api_key is not None and not api_key.strip():
            raise InputError("--api-key is empty; give a non-empty key or leave the option out")
        if not model_name.strip():
            raise InputError("--model-name is empty; give a name clients will send as `model`")
        return cls(model_name, max_input, max_total, max_concurrent_requests, api_key)

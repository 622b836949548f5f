"""The server's limits, fixed at start-up: what `trtbuild serve` flags set, checked against the engine.

Every limit bounds what one request can make the server do (read, tokenize, compute, send back), so
hostile or careless input is refused at once with a status that names the limit (README "Limits and
security" lists them with their flags).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine_builder.formats.build_config import Limits
from engine_builder.runner.vision.image_limits import ImageLimits
from engine_builder.util.errors import InputError

# Active generation requests (queued + running) the server accepts before it answers 429; a
# queue well beyond the engine's KV slots only adds latency, never throughput.
DEFAULT_MAX_CONCURRENT_REQUESTS = 128
# Per client address no hard limit (429) by default: a benchmark or a proxy in front sends everything from one
# address. Fairness is on instead (--client-share, client_share.py): a client's requests beyond twice the batch
# wait for its own earlier ones, so one client flooding the server with streams (even ones it drops at once:
# each is a prefill) cannot queue ahead of every other client. On a public endpoint also set
# --max-concurrent-per-client.
# A request body larger than this gets 413 before it is read: 1 MiB holds far more prompt text than
# any engine's max_input_len (a 50 MB body once took 67 s and 13 GB to tokenize and refuse).
DEFAULT_MAX_REQUEST_BYTES = 1 << 20
# Seconds from admission to the end of a request; then it is cancelled (its KV slot freed) and
# answered 504, or its stream ends with a timeout event. Generous: long generations on a CPU are slow.
DEFAULT_REQUEST_TIMEOUT_S = 600.0
# Alternatives per generated token (TGI top_n_tokens, OpenAI top_logprobs / logprobs): OpenAI's cap.
# TGI's own default (--max-top-n-tokens 5) is lower; one cap for both APIs keeps them comparable.
DEFAULT_MAX_TOP_LOGPROBS = 20
# Stop sequences per request and characters per sequence: 4 is OpenAI's and TGI's limit.
DEFAULT_MAX_STOP_SEQUENCES = 4
DEFAULT_MAX_STOP_SEQUENCE_CHARS = 256
# Seconds one send of a response may wait on a client that reads nothing (server/stalled_clients.py): a
# client that reads at all, however slowly, unblocks it far sooner.
DEFAULT_STALLED_STREAM_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ServerConfig:
    model_name: str  # what /v1/models lists and requests must name (when they name one)
    max_input_tokens: int  # longest prompt, in tokens
    max_total_tokens: int  # prompt + generated tokens of one request
    max_concurrent_requests: int = DEFAULT_MAX_CONCURRENT_REQUESTS
    api_key: str | None = None  # when set, every generation route needs `Authorization: Bearer <key>`
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES  # request body size (413 above)
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT_S  # seconds per request (504 / timeout event)
    max_top_logprobs: int = DEFAULT_MAX_TOP_LOGPROBS  # top_n_tokens / top_logprobs / logprobs (refused above)
    max_stop_sequences: int = DEFAULT_MAX_STOP_SEQUENCES  # stop strings per request (refused above)
    max_stop_sequence_chars: int = DEFAULT_MAX_STOP_SEQUENCE_CHARS  # characters per stop string (refused above)
    max_concurrent_per_client: int | None = None  # active requests per client address (429 above); None: any
    # special tokens' text inside chat messages parsed as control tokens (a client can forge turns): off
    parse_chat_special_tokens: bool = False
    # seconds a response's send may wait on a client that reads nothing; then it is cancelled (stalled_clients.py)
    stalled_stream_timeout: float = DEFAULT_STALLED_STREAM_TIMEOUT_S
    # a client address's requests past the door at once; more wait for its own to end (client_share.py);
    # None: twice the executor's batch, 0: off
    client_share: int | None = None
    # a vision-language engine's images per request, bytes and pixels per image (--limit-mm-per-prompt,
    # --max-image-bytes, --max-image-pixels); a data URL also counts against max_request_bytes
    image_limits: ImageLimits = ImageLimits()

    def __post_init__(self) -> None:
        """The limits that do not depend on the engine (for_engine checks those that do)."""
        if self.max_concurrent_requests < 1:
            raise InputError(f"--max-concurrent-requests must be >= 1, got {self.max_concurrent_requests}")
        if self.max_concurrent_per_client is not None and self.max_concurrent_per_client < 1:
            raise InputError(f"--max-concurrent-per-client must be >= 1, got {self.max_concurrent_per_client}")
        if self.client_share is not None and self.client_share < 0:
            raise InputError(f"--client-share must be >= 0 (0 turns it off), got {self.client_share}")
        if self.api_key is not None and not self.api_key.strip():
            raise InputError("--api-key is empty; give a non-empty key or leave the option out")
        if not self.model_name.strip():
            raise InputError("--model-name is empty; give a name clients will send as `model`")
        if self.max_request_bytes < 1024:
            raise InputError(f"--max-request-bytes must be >= 1024 (a chat request's JSON needs room), got "
                             f"{self.max_request_bytes}")
        if not (math.isfinite(self.request_timeout) and self.request_timeout > 0):
            raise InputError(f"--request-timeout must be a number of seconds > 0, got {self.request_timeout}")
        for flag, value in (("--max-top-logprobs", self.max_top_logprobs),
                            ("--max-stop-sequences", self.max_stop_sequences)):
            if value < 0:
                raise InputError(f"{flag} must be >= 0 (0 turns the feature off), got {value}")
        if not (math.isfinite(self.stalled_stream_timeout) and self.stalled_stream_timeout > 0):
            raise InputError(f"--stalled-stream-timeout must be a number of seconds > 0, got "
                             f"{self.stalled_stream_timeout}")
        if self.max_stop_sequence_chars < 1:
            raise InputError(f"--max-stop-sequence-chars must be >= 1, got {self.max_stop_sequence_chars}")

    @classmethod
    def for_engine(cls, limits: Limits, model_name: str, *, max_input_tokens: int | None = None,
                   max_total_tokens: int | None = None,
                   max_concurrent_requests: int = DEFAULT_MAX_CONCURRENT_REQUESTS,
                   api_key: str | None = None, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                   request_timeout: float = DEFAULT_REQUEST_TIMEOUT_S,
                   max_top_logprobs: int = DEFAULT_MAX_TOP_LOGPROBS,
                   max_stop_sequences: int = DEFAULT_MAX_STOP_SEQUENCES,
                   max_stop_sequence_chars: int = DEFAULT_MAX_STOP_SEQUENCE_CHARS,
                   max_concurrent_per_client: int | None = None,
                   parse_chat_special_tokens: bool = False,
                   stalled_stream_timeout: float = DEFAULT_STALLED_STREAM_TIMEOUT_S,
                   client_share: int | None = None, image_limits: ImageLimits = ImageLimits()) -> ServerConfig:
        """Defaults from the engine's limits; a limit above the engine's is a user error (it could
        never be served), so it fails at start-up rather than on the first long request."""
        max_total = limits.max_seq_len if max_total_tokens is None else max_total_tokens
        # by default a prompt leaves room for one new token: an engine built with max_input_len == max_seq_len
        # (`build --max-seq-len 1024` keeps the default max_input_len 1024) serves, not refuses to start
        max_input = min(limits.max_input_len, max_total - 1) if max_input_tokens is None else max_input_tokens
        if not 1 <= max_input <= limits.max_input_len:
            raise InputError(f"--max-input-tokens {max_input} must be in [1, {limits.max_input_len}] (the engine's "
                             "max_input_len); lower it or rebuild the engine with a larger --max-input-len")
        if not max_input < max_total <= limits.max_seq_len:
            raise InputError(f"--max-total-tokens {max_total} must be above --max-input-tokens {max_input} and at "
                             f"most {limits.max_seq_len} (the engine's max_seq_len); adjust it or rebuild the engine "
                             "with a larger --max-seq-len")
        return cls(model_name, max_input, max_total, max_concurrent_requests, api_key, max_request_bytes,
                   request_timeout, max_top_logprobs, max_stop_sequences, max_stop_sequence_chars,
                   max_concurrent_per_client, parse_chat_special_tokens, stalled_stream_timeout, client_share,
                   image_limits)

"""ServerConfig.for_engine: serve's limits from the engine's, and the refusals that say what to do."""

from __future__ import annotations

import pytest

from engine_builder.formats.build_config import Limits
from engine_builder.server.config import ServerConfig
from engine_builder.util.errors import InputError


def test_an_engine_whose_prompts_may_fill_it_serves_with_room_for_one_token():
    # `build --max-seq-len 1024` keeps the default max_input_len 1024: serve refused to start on it
    config = ServerConfig.for_engine(Limits(max_batch=4, max_input_len=1024, max_seq_len=1024), "m")
    assert (config.max_input_tokens, config.max_total_tokens) == (1023, 1024)
    config = ServerConfig.for_engine(Limits(max_batch=4, max_input_len=1024, max_seq_len=2048), "m",
                                     max_total_tokens=600)
    assert (config.max_input_tokens, config.max_total_tokens) == (599, 600)
    with pytest.raises(InputError, match="--max-total-tokens 1024 must be above --max-input-tokens 1024"):
        ServerConfig.for_engine(Limits(max_batch=4, max_input_len=1024, max_seq_len=1024), "m", max_input_tokens=1024)

"""Server test fixtures: the SmolLM2 engine of tests/conftest.py behind a live `trtbuild serve`, and a
tiny random Llama engine (word tokenizer "w0".."w319", a chat template) for what needs no real model."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from live_server import live_server
from runner_engines import add_word_tokenizer, build_engine

from converters.convert import convert
from engine_builder.formats.build_config import Limits

TINY_LIMITS = Limits(max_batch=2, max_input_len=32, max_seq_len=96)
# enough of a chat template for /v1/chat/completions: one line per message, then the assistant's turn
TINY_CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }} {{ m['content'] }}\n{% endfor %}assistant"


@pytest.fixture(scope="module")
def server(smollm2_engine, request):
    """One server per test module; a module sets its flags with `SERVER_ARGS = (...)`."""
    args = getattr(request.module, "SERVER_ARGS", ())
    with live_server(smollm2_engine, *args) as s:
        yield s


@pytest.fixture(scope="session")
def tiny_serve_engine(tiny_model_dir, tmp_path_factory) -> Path:
    """A tiny random Llama engine (max_batch 2, max_input_len 32, max_seq_len 96), built in seconds."""
    root = tmp_path_factory.mktemp("tiny-serve")
    hf = root / "hf"
    shutil.copytree(tiny_model_dir("llama"), hf)
    add_word_tokenizer(hf, 320)
    (hf / "chat_template.jinja").write_text(TINY_CHAT_TEMPLATE)
    convert(hf, root / "ckpt", dtype="float32")
    return build_engine(root / "ckpt", root / "engine", TINY_LIMITS)


@pytest.fixture(scope="module")
def tiny_server(tiny_serve_engine, request):
    """A live `trtbuild serve` of the tiny engine; a module sets its flags with `SERVER_ARGS = (...)`."""
    args = getattr(request.module, "SERVER_ARGS", ())
    with live_server(tiny_serve_engine, *args) as s:
        yield s

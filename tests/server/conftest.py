"""Server test fixtures: the SmolLM2 engine and the tiny engine of tests/conftest.py, each behind a live
`trtbuild serve`."""

from __future__ import annotations

import pytest
from live_server import live_server


@pytest.fixture(scope="module")
def server(smollm2_engine, request):
    """One server per test module; a module sets its flags with `SERVER_ARGS = (...)`."""
    args = getattr(request.module, "SERVER_ARGS", ())
    with live_server(smollm2_engine, *args) as s:
        yield s


@pytest.fixture(scope="module")
def tiny_server(tiny_serve_engine, request):
    """A live `trtbuild serve` of the tiny engine; a module sets its flags with `SERVER_ARGS = (...)`."""
    args = getattr(request.module, "SERVER_ARGS", ())
    with live_server(tiny_serve_engine, *args) as s:
        yield s

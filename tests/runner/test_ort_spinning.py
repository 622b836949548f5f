"""runner/ort_spinning.py: onnxruntime's intra-op threads spin only when the machine has idle cores for them."""

from __future__ import annotations

import pytest

from engine_builder.runner.ort_backend import session_options
from engine_builder.runner.ort_spinning import ENV, allow_spinning, sessions_take_turns
from engine_builder.util.errors import InputError

KEY = "session.intra_op.allow_spinning"


def test_auto_spins_only_with_idle_cores(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert allow_spinning(2, load_average=0.3, cpus=16)[0]
    assert allow_spinning(2, load_average=0.0, cpus=2)[0]
    spin, why = allow_spinning(2, load_average=9.0, cpus=2)
    assert not spin and "load average 9.0" in why
    assert not allow_spinning(4, load_average=13.0, cpus=16)[0]  # 3 idle CPUs for 4 threads
    assert not allow_spinning(1, load_average=0.0, cpus=16)[0]  # a lone thread has nobody to wait for


@pytest.mark.parametrize(("value", "expected"), [("on", "1"), ("off", "0"), ("OFF", "0")])
def test_environment_overrides_and_reaches_the_session(monkeypatch, value, expected):
    monkeypatch.setenv(ENV, value)
    assert allow_spinning(2, load_average=100.0 if value == "on" else 0.0, cpus=2)[0] is (expected == "1")
    assert session_options("float32", threads=2).get_session_config_entry(KEY) == expected


def test_bad_environment_value_says_what_to_do(monkeypatch):
    monkeypatch.setenv(ENV, "sometimes")
    with pytest.raises(InputError, match="on, off, auto"):
        allow_spinning(2)


def _stops_after_run(options) -> bool:
    try:
        return options.get_session_config_entry("session.force_spinning_stop") == "1"
    except RuntimeError:  # onnxruntime's answer for a key never set: its default, spinning goes on
        return False


def test_sessions_that_take_turns_stop_spinning_after_a_run():
    assert not _stops_after_run(session_options("float32", threads=2))
    with sessions_take_turns():
        assert _stops_after_run(session_options("float32", threads=2))
        with sessions_take_turns(False):
            assert not _stops_after_run(session_options("float32", threads=2))
    assert not _stops_after_run(session_options("float32", threads=2))

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


def test_others_busy_counts_other_processes_not_ours():
    from engine_builder.runner import cpu_busy
    from engine_builder.runner.cpu_busy import CpuSample, others_busy

    hz = cpu_busy._HZ
    since = CpuSample(wall=100.0, busy=1000, own=200, cpus=2)
    # 1 s later: the CPUs ran 1.5 s of work, 0.5 s of it this process's: others kept 1.0 core busy
    now = CpuSample(wall=101.0, busy=1000 + int(1.5 * hz), own=200 + int(0.5 * hz), cpus=2)
    cores, window = others_busy(since, now)
    assert cores == pytest.approx(1.0) and window == pytest.approx(1.0)
    assert others_busy(since, CpuSample(100.05, 1010, 200, 2)) is None  # too short a window to tell
    assert others_busy(since, CpuSample(200.0, 9000, 200, 2)) is None  # older than the load average's minute
    assert others_busy(since, CpuSample(101.0, 1100, 200, 3)) is None  # another CPU set
    assert others_busy(None, now) is None


def test_auto_does_not_spin_beside_a_busy_process(monkeypatch):
    """A real process burning a core while the window runs: the cores it takes are not idle for our threads
    (other processes on this shared machine only add to what is measured)."""
    import os
    import subprocess
    import sys
    import time

    from engine_builder.runner.cpu_busy import others_busy_now

    monkeypatch.delenv(ENV, raising=False)
    threads = max(len(os.sched_getaffinity(0)), 2)  # every CPU: one busy core leaves too few
    burn = "import time\nend = time.time() + 1.2\nwhile time.time() < end: pass"
    burner = subprocess.Popen([sys.executable, "-c", burn])
    try:
        time.sleep(0.2)  # its interpreter started
        others_busy_now()  # the window starts here
        time.sleep(0.6)
        spin, why = allow_spinning(threads)
    finally:
        burner.wait()
    assert not spin and "other processes' CPU use over the last" in why, why


def test_a_second_session_counts_the_first_ones_spinning_threads(monkeypatch):
    """Measured decisions leave this process's own CPU time out, so the threads a session of this process was
    let spin are counted as busy for the next (on a claimed 64 CPUs: what others use here is at most the
    machine's own CPUs)."""
    import time

    from engine_builder.runner import ort_spinning
    from engine_builder.runner.cpu_busy import others_busy_now

    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(ort_spinning, "_spinning_in_process", 0)
    others_busy_now()
    time.sleep(0.25)  # a window long enough to be measured
    assert allow_spinning(40, cpus=64)[0]
    time.sleep(0.25)
    spin, why = allow_spinning(40, cpus=64)
    assert not spin and "plus 40 spinning threads" in why, why


def test_sessions_that_take_turns_both_spin(monkeypatch):
    """A speculative target and its draft stop spinning when their Run returns (sessions_take_turns), so
    neither takes the other's cores: the second is decided as the first was, and a later session that keeps
    spinning after its Runs does not count them."""
    import time

    from engine_builder.runner import ort_spinning
    from engine_builder.runner.cpu_busy import others_busy_now

    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(ort_spinning, "_spinning_in_process", 0)
    others_busy_now()
    with sessions_take_turns():
        for _ in range(2):
            time.sleep(0.25)  # a window long enough to be measured
            spin, why = allow_spinning(40, cpus=64)
            assert spin and "plus" not in why, why
    time.sleep(0.25)
    spin, why = allow_spinning(40, cpus=64)
    assert spin and "plus" not in why, why


def test_a_window_over_a_minute_is_measured_afresh(monkeypatch):
    """A session opened minutes after the previous one gets a fresh 0.1 s window, not the load average (which
    counts this process's own work of the last minute)."""
    from engine_builder.runner import cpu_busy

    stale = cpu_busy.sample()
    monkeypatch.setattr(cpu_busy, "_last", cpu_busy.CpuSample(stale.wall - 600.0, 0, 0, stale.cpus))
    measured = cpu_busy.others_busy_now()
    assert measured is not None and cpu_busy.BUSY_MIN_WINDOW_S <= measured[1] < 1.0, measured

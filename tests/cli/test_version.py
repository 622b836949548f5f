"""`trtbuild --version`: the version a bug report needs, the same one every checkpoint and manifest records."""

from __future__ import annotations

from cli_process import trtbuild

from engine_builder import __version__


def test_version_prints_and_exits_0():
    proc = trtbuild("--version", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"trtbuild {__version__}\n" and proc.stderr == ""

"""`trtbuild run | chat | serve` restart themselves once with glibc's malloc putting big buffers in huge pages.

glibc reads GLIBC_TUNABLES once, when a process starts, so the commands that decode execute themselves again
with `glibc.malloc.hugetlb=1` (glibc >= 2.35, Linux) before anything is imported. malloc then madvises
MADV_HUGEPAGE on its mappings, and onnxruntime's weight buffers (an int4 engine's MatMulNBits blocks: 78 MB of
SmolLM2's) sit in 2 MiB pages, so a decode step that streams them takes fewer TLB misses. Measured on the quiet
2-core EPYC (peers' int4 engine, batch 1, 128 tokens, 2 threads; README "Peak RSS and huge pages"): 175.9 / 167.8
/ 165.2 tok/s against 161.1 / 155.8 / 160.2 without, peak RSS 334 vs 332 MB; float32 (weights mapped from the
file): unchanged. The restart costs ~20 ms (a bare interpreter start). TRTBUILD_HUGE_PAGES=off keeps the process
as it starts; a GLIBC_TUNABLES of the user's own is left alone (and ends the restart: it is set afterwards).
"""

from __future__ import annotations

import os
import sys

from engine_builder.util import environment

COMMANDS = frozenset({"run", "chat", "serve"})
TUNABLE = "glibc.malloc.hugetlb=1"


def _glibc_has_hugetlb() -> bool:
    """glibc 2.35 or later (the hugetlb tunable's first release) on Linux."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()  # e.g. "glibc 2.36"; musl has none
        return name == "glibc" and tuple(int(x) for x in version.split(".")[:2]) >= (2, 35)
    except (ValueError, OSError, AttributeError):
        return False


def _is_the_command(argv: list[str]) -> bool:
    """The `trtbuild` console script or `python -m engine_builder.cli`, not a program that imports the CLI (while
    a -m package's __init__ runs, argv[0] is still "-m": the interpreter's own command line tells)."""
    started = getattr(sys, "orig_argv", [])
    module = started[started.index("-m") + 1:started.index("-m") + 2] if "-m" in started else []
    return module == ["engine_builder.cli"] or os.path.basename(argv[0] if argv else "") == "trtbuild"


def decoding_environment(environ: dict[str, str]) -> dict[str, str]:
    """ENVIRON as a decoding command runs with: the tunable added, unless TRTBUILD_HUGE_PAGES=off, a GLIBC_TUNABLES
    already there, or a C library without it (benchmarks/peers.py starts its workers of ours with it too)."""
    if "GLIBC_TUNABLES" in environ or environment.read("TRTBUILD_HUGE_PAGES", environ) == "off":
        return environ
    return {**environ, "GLIBC_TUNABLES": TUNABLE} if _glibc_has_hugetlb() else environ


def restart_with_huge_pages(argv: list[str] | None = None) -> None:
    """Replace this process by the same `trtbuild` command with GLIBC_TUNABLES set, when it is a decoding
    command and nothing says otherwise; returns (doing nothing) in every other case."""
    argv = sys.argv if argv is None else argv
    command = next((a for a in argv[1:] if not a.startswith("-")), None)  # after global options (-v, --debug)
    if command not in COMMANDS or not _is_the_command(argv):
        return
    environ = decoding_environment(dict(os.environ))
    if environ.get("GLIBC_TUNABLES") != os.environ.get("GLIBC_TUNABLES"):
        os.execve(sys.executable, [sys.executable, "-m", "engine_builder.cli", *argv[1:]], environ)

"""Every TRTBUILD_* environment variable trtbuild reads, in one table: its values, its default, what it changes.

A module reads its variable through `read(NAME)` (tests/architecture/test_layers.py checks that no other module
names a TRTBUILD_ variable to os.environ itself), so a bad value is refused the same way everywhere: one line
naming the variable and the values it takes (an InputError: exit 2 from the CLI). Switches take on / off (and 1 /
0, true / false), case-insensitive. docs' reference lists this table.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from engine_builder.util.errors import InputError

_ON, _OFF = ("on", "1", "true"), ("off", "0", "false")


@dataclass(frozen=True)
class Variable:
    name: str
    values: tuple[str, ...] | None  # the choices (lower case); None: free text, checked by its reader
    default: str | None  # what an unset or empty variable means
    what: str  # what it changes, for the docs and messages


VARIABLES: dict[str, Variable] = {v.name: v for v in (
    Variable("TRTBUILD_ORT_SPINNING", ("on", "off", "auto"), "auto",
             "onnxruntime's intra-op threads spin-wait between ops: auto decides from the other processes' CPU use"),
    Variable("TRTBUILD_HUGE_PAGES", ("on", "off"), "on",
             "run, chat and serve restart once with GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (weights in huge pages)"),
    Variable("TRTBUILD_TORCH_COMPILE", ("auto", "on", "off"), "auto",
             "the torch backend's layers through torch.compile: auto is on for a CUDA GPU, off on a CPU"),
    Variable("TRTBUILD_FUSED_DECODE", ("auto", "on", "off"), "auto",
             "the torch backend's steps of few tokens: auto runs a llama-shaped layer as six Triton launches on a "
             "CUDA GPU where a trial step says it is faster (fused_decode.py), on without the trial and also on a "
             "CPU under Triton's interpreter (TRITON_INTERPRET=1: tests), off through the compiled layer"),
    Variable("TRTBUILD_DIST_BACKEND", ("auto", "gloo", "nccl"), "auto",
             "the collectives of tp/pp ranks: auto is NCCL when every local rank has a GPU, else gloo"),
    Variable("TRTBUILD_MEMORY_GB", None, None,
             "the memory plans check against this many GB instead of this machine's RAM (plan for another)"),
    Variable("TRTBUILD_CACHE_DIR", None, None,
             "where run keeps the record of verified engine files (default $XDG_CACHE_HOME/trtbuild)"),
    Variable("TRTBUILD_TRITON_PYTHON_ENV", None, None,
             "the numpy 1.x environment of Triton's python-backend stub (default <venv>/triton-python-env)"),
    Variable("TRTBUILD_API_KEY", None, None, "serve and route answer only requests bearing this key (--api-key)"),
)}


def read(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """NAME's value in ENVIRON (default os.environ): one of its choices (lower case; a switch as on / off), its
    free text, or its default when unset or empty. InputError for a value outside its choices."""
    var = VARIABLES[name]  # KeyError: a variable missing from the table is a bug, not user input
    raw = (os.environ if environ is None else environ).get(name, "").strip()
    if not raw:
        return var.default
    if var.values is None:
        return raw
    value = raw.lower()
    if var.values == ("on", "off"):
        value = "on" if value in _ON else "off" if value in _OFF else value
    if value not in var.values:
        raise InputError(f"{name}={raw!r} is not one of {', '.join(var.values)}; unset it or pick one of those "
                          f"({var.what})")
    return value

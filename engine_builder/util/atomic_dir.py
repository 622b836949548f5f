"""Write a directory atomically: build it in a temp dir beside the target, rename at the end.

An interrupted or failed command (Ctrl-C included) leaves neither a half-written output
nor a stray temp dir, and with --force the old output survives until the new one is complete.

--force replaces only what the same command wrote before (a dir whose config.json carries the
command's schema, or an empty dir), never one of the command's own inputs or a dir around them.
Temp dirs are named `.<out>.tmp-<pid>-<random>`: one that a killed run left behind (its process is
gone) is removed by the next run writing beside it; a live process's is left alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from engine_builder.util.errors import InputError


def check_output_dir(out: Path, force: bool, inputs: Iterable[Path | str | None] = (),
                     replaces: str | None = None) -> None:
    """Refuse OUT when it cannot be written: it exists without FORCE, it is or holds or sits in one of
    INPUTS, or FORCE would delete something other than a previous output (a dir whose config.json has
    `"schema": REPLACES`, or an empty dir). REPLACES None skips that last check (a library caller's
    own scratch output)."""
    out = Path(out)
    check_apart(out, inputs)
    if out.exists() and not force:
        raise InputError(f"{out} already exists; pass --force to replace it or choose another path")
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} exists and is not a directory; remove it or choose another path")
    if out.exists() and replaces is not None and not _is_previous_output(out, replaces):
        raise InputError(f"{out} exists and is not a previous output of this command (no config.json with schema "
                         f"{replaces!r}); --force replaces only those: remove it yourself or choose another path")
    # a missing parent is made when the output is written (mkdir -p: `convert SRC build/ckpt` on a fresh clone)
    existing = next(p for p in (out.parent, *out.parent.parents) if p.exists())
    if not existing.is_dir():
        raise InputError(f"{existing} is not a directory, so {out} cannot be made under it; choose another path")


def check_apart(out: Path, inputs: Iterable[Path | str | None]) -> None:
    """OUT must not be an input, hold one, or lie inside one: replacing it would delete the input."""
    target = _real(out)
    for given in inputs:
        if given is None:
            continue
        source = _real(Path(given))
        if target == source:
            relation = "is"
        elif source.is_relative_to(target):
            relation = "contains"
        elif target.is_relative_to(source):
            relation = "is inside"
        else:
            continue
        raise InputError(f"output {out} {relation} input {given}; write the output somewhere outside the inputs "
                         f"(nothing was changed)")


def _real(path: Path) -> Path:
    """Absolute, symlinks and .. resolved (as far as the path exists)."""
    return Path(os.path.realpath(Path(path).expanduser()))


def _is_previous_output(out: Path, schema: str) -> bool:
    if not any(out.iterdir()):
        return True
    try:
        data = json.loads((out / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("schema") == schema


@contextlib.contextmanager
def atomic_output_dir(out: Path, force: bool = False, inputs: Iterable[Path | str | None] = (),
                      replaces: str | None = None) -> Iterator[Path]:
    out = Path(out).absolute()
    inputs = tuple(inputs)
    check_output_dir(out, force, inputs, replaces)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create {out.parent} ({exc.strerror}); choose another path") from None
    remove_stale_temp_dirs(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{os.getpid()}-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; the output should not be
    try:
        yield tmp
        if out.exists():
            # what is replaced is checked again: it may have changed while this command ran
            check_output_dir(out, force, inputs, replaces)
            # keep the old output until the new one is in place
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-{os.getpid()}-", dir=out.parent))
            os.rename(out, old / out.name)
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def remove_stale_temp_dirs(out: Path) -> list[Path]:
    """Remove the temp dirs beside OUT that runs now dead left (killed by SIGKILL, OOM, power loss)."""
    pattern = re.compile(rf"\.{re.escape(out.name)}\.(?:tmp|old)-(\d+)-[^/]+")
    removed = []
    try:
        entries = list(out.parent.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if match and entry.is_dir() and not entry.is_symlink() and not _alive(int(match.group(1))):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def _alive(pid: int) -> bool:
    """Is PID a running process? A reused PID reads as alive: its dir is then kept, never wrongly removed."""
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process
    return True

"""Write a directory atomically: build it in a temp dir beside the target, rename at the end.

An interrupted or failed command (Ctrl-C included) leaves neither a half-written output
nor a stray temp dir, and with --force the old output survives until the new one is complete.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from engine_builder.util.errors import InputError


def check_output_dir(out: Path, force: bool) -> None:
    if out.exists() and not force:
        raise InputError(f"{out} already exists; pass --force to replace it or choose another path")
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} exists and is not a directory; remove it or choose another path")
    if not out.parent.is_dir():
        raise InputError(f"parent dir {out.parent} does not exist; create it first")


@contextlib.contextmanager
def atomic_output_dir(out: Path, force: bool = False) -> Iterator[Path]:
    out = Path(out).absolute()
    check_output_dir(out, force)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; the output should not be
    try:
        yield tmp
        if out.exists():
            # keep the old output until the new one is in place
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.rename(out, old / out.name)
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

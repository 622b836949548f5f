"""`trtbuild verify`: is every file an engine dir's engine reads the one its build wrote (sha256 and size)?"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from engine_builder.cli.console import print_json, stderr, stdout
from engine_builder.util.errors import InputError


def verify(
    engine_dir: Annotated[Path, typer.Argument(help="Engine dir from `trtbuild build`.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print a machine-readable report.")] = False,
) -> None:
    """Hash every file the engine reads (weights, graphs, engines) and compare with the manifest; exit 2 on
    any changed, missing or unrecorded file. `run`, `serve` and `LLM()` run the same check at load.

    Example: trtbuild verify engine
    """
    from engine_builder.formats.manifest import EngineManifest
    from engine_builder.runner.engine_integrity import remember_verified, verify_engine_dir

    manifest = EngineManifest.load(engine_dir)
    total = sum(d.size for d in manifest.files)
    hashing = stderr.status(f"hashing {len(manifest.files)} files ({total / 1e6:.0f} MB)")
    with contextlib.nullcontext() if as_json else hashing:
        verdicts = verify_engine_dir(engine_dir, manifest)  # every file hashed, whatever any record says
    remember_verified(engine_dir, verdicts)  # all matched: the next load need not hash them again
    bad = [v for v in verdicts if not v.ok]
    if as_json:
        print_json({"path": str(engine_dir), "ok": not bad,
                    "files": [{"name": v.name, "status": v.status, "size": v.size, "recorded_size": v.recorded_size,
                               "sha256": v.sha256, "recorded_sha256": v.recorded_sha256} for v in verdicts]})
    else:
        table = Table("file", "bytes", "verdict", title=f"engine dir {engine_dir}")
        for v in verdicts:
            size = v.size if v.size is not None else v.recorded_size
            table.add_row(v.name, f"{size:,}" if size is not None else "", v.describe())
        stdout.print(table)
    if bad:
        raise InputError(f"{len(bad)} of {len(verdicts)} files in {engine_dir} differ from what the build wrote "
                         f"({', '.join(v.name for v in bad)}); rebuild with "
                         f"`trtbuild build <ckpt-dir> {engine_dir} --force`")
    if not as_json:
        stdout.print(f"ok: {len(verdicts)} files match the sha256 recorded by the build")


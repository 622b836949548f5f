"""The per-user record of engine files already hashed, so a load does no needless hashing (issue 16).

`trtbuild run` on SmolLM2 spent ~0.32 s of CPU hashing its 538 MB at every start. A load now skips a file
whose inode fingerprint (device, inode, size, mtime, ctime) is one a successful verification recorded,
with the sha256 the manifest wants. Why that is safe: any write, truncate, rename over, chmod or utime
sets ctime to the clock's time then, and no user can set ctime back; a replaced file is another inode.
A fingerprint is recorded only once its last change is SETTLED_NS in the past when hashed (so a write in
the same clock tick as the hash still moves ctime; engine_integrity._sha256).

Where: $TRTBUILD_CACHE_DIR, else $XDG_CACHE_HOME/trtbuild, else ~/.cache/trtbuild: per user, never the
engine dir (it may be read-only or shared). A record owned by another user or writable by others is
ignored; a missing, unreadable or unwritable one only means hashing again. `trtbuild verify` never reads
it (it always hashes every file), and records what it hashed when every file matched.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

from engine_builder.util import environment

Fingerprint = tuple[int, int, int, int, int]
RECORD_NAME = "verified-files.json"
MAX_ENTRIES = 512  # newest kept: a few dozen engine dirs' files
_SCHEMA = 1


def record_path() -> Path:
    explicit = environment.read("TRTBUILD_CACHE_DIR")
    if explicit:
        return Path(explicit) / RECORD_NAME
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trtbuild" / RECORD_NAME


def fingerprint(st: os.stat_result) -> Fingerprint:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def read_record() -> dict[Fingerprint, str]:
    """fingerprint -> sha256 of every file the record holds; {} when there is none to trust."""
    path = record_path()
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                return {}  # someone else could have written it
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("schema") != _SCHEMA or not isinstance(data.get("files"), list):
        return {}
    known: dict[Fingerprint, str] = {}
    for entry in data["files"]:
        if (isinstance(entry, list) and len(entry) == 6 and all(isinstance(n, int) for n in entry[:5])
                and isinstance(entry[5], str)):
            known[tuple(entry[:5])] = entry[5]  # type: ignore[assignment]
    return known


def add_to_record(hashed: dict[Fingerprint, str]) -> None:
    """Merge HASHED (fingerprint -> sha256, settled hashes only) into the record, newest last; best effort."""
    if not hashed:
        return
    known = read_record()
    if all(known.get(fp) == sha for fp, sha in hashed.items()):
        return  # nothing new: no write
    for fp in hashed:
        known.pop(fp, None)  # re-inserted last: the newest survive the cap
    known.update(hashed)
    files = [[*fp, sha] for fp, sha in list(known.items())[-MAX_ENTRIES:]]
    path = record_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".verified-", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:  # mkstemp: mode 0600, ours
                json.dump({"schema": _SCHEMA, "files": files}, f)
            os.replace(tmp, path)  # atomic: a concurrent reader sees the old or the new record
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError:
        pass  # a read-only home: the next load hashes again

"""Are the files an engine reads still the ones its build wrote? sha256 and size against the manifest.

`trtbuild run`, `serve`, `eval` and `LLM()` check this when they load an engine dir (runner/engine.py),
and `trtbuild verify` reports every file. A changed weight byte would otherwise give wrong text with
no error. What a load may skip: a file whose inode is unchanged (device, inode, size, mtime and ctime,
the last of which no user can set back) since this process hashed it, or since a successful verification
recorded it in the per-user record (runner/verified_record.py); a fingerprint is kept only when its last
change was long enough before the hash that a later write must move ctime. `trtbuild verify` skips nothing.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from engine_builder.formats.manifest import EngineManifest, FileDigest, check_file_names, verified_files
from engine_builder.runner.verified_record import Fingerprint, add_to_record, fingerprint, read_record
from engine_builder.util.errors import InputError
from engine_builder.util.file_hash import sha256_file

Status = Literal["ok", "modified", "missing", "unrecorded"]


@dataclass(frozen=True)
class FileVerdict:
    name: str
    status: Status  # unrecorded: a file of an engine-read kind that the build did not write
    size: int | None  # bytes now; None when missing
    recorded_size: int | None  # None when unrecorded
    sha256: str | None  # None when missing, or when the size alone showed the change
    recorded_sha256: str | None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def describe(self) -> str:
        if self.status == "ok":
            return "ok"
        if self.status == "missing":
            return "missing"
        if self.status == "unrecorded":
            return "not written by the build (not in the manifest)"
        if self.size != self.recorded_size:
            return f"modified: {self.size} bytes, the build wrote {self.recorded_size}"
        return f"modified: sha256 {self.sha256[:12]}..., the build wrote {self.recorded_sha256[:12]}..."


def verify_engine_dir(path: Path | str, manifest: EngineManifest | None = None,
                      threads: int | None = None, reuse: bool = False) -> list[FileVerdict]:
    """One verdict per file the manifest records, then per unrecorded file an engine would read;
    files are hashed in parallel (THREADS, default one per core). REUSE (loads): a file whose inode is
    unchanged since this process or a recorded verification hashed it is not hashed again."""
    path = Path(path)
    manifest = manifest if manifest is not None else EngineManifest.load(path)
    check_file_names(path, [d.name for d in manifest.files])  # again for a manifest not read by load()
    recorded = {d.name for d in manifest.files}
    extra = [FileVerdict(f.name, "unrecorded", f.stat().st_size, None, None, None)
             for f in verified_files(path) if f.name not in recorded]
    workers = max(1, min(len(manifest.files), threads or os.cpu_count() or 1))
    with ThreadPoolExecutor(workers, thread_name_prefix="verify") as pool:
        checked = list(pool.map(lambda d: _verdict(path, d, reuse), manifest.files))
    return checked + extra


def remember_verified(path: Path, verdicts: list[FileVerdict]) -> None:
    """After a verification where every file matched: add the files hashed in this process to the per-user
    record, so the next load skips them while their inodes stay unchanged."""
    if not all(v.ok for v in verdicts):
        return
    hashed: dict[Fingerprint, str] = {}
    for v in verdicts:
        try:
            key = fingerprint(os.stat(Path(path) / v.name))
        except OSError:
            continue
        with _lock:
            sha = _hashed.get(key)  # only settled fingerprints, hashed as they are now
        if sha is not None and sha == v.recorded_sha256:
            hashed[key] = sha
    add_to_record(hashed)


def check_engine_files(path: Path, manifest: EngineManifest) -> None:
    """verify_engine_dir for a load: an InputError naming the first bad file and the fix."""
    verdicts = verify_engine_dir(path, manifest, reuse=True)
    _refuse(path, verdicts)
    remember_verified(path, verdicts)


class PendingCheck:
    """check_engine_files split in two, so the hashing overlaps a load (issue 16's cold start: 0.37 s of
    sha256 over SmolLM2's 538 MB, while onnxruntime creates its session and the tokenizer loads).

    Constructing it checks what a stat shows (a missing, resized or unrecorded file is refused here, at
    once) and starts hashing in a background thread; hashlib releases the GIL, so the hashing runs beside
    the load on another core. `result()` waits for the hashes and raises check_engine_files' error; a
    loader calls it before it returns, so nothing is generated from a changed file."""

    def __init__(self, path: Path, manifest: EngineManifest) -> None:
        self._path, self._manifest = Path(path), manifest
        check_file_names(self._path, [d.name for d in manifest.files])
        recorded = {d.name for d in manifest.files}
        stat_only = [_stat_verdict(self._path, d) for d in manifest.files]
        stat_only += [FileVerdict(f.name, "unrecorded", f.stat().st_size, None, None, None)
                      for f in verified_files(self._path) if f.name not in recorded]
        _refuse(self._path, [v for v in stat_only if v is not None])
        self._result: list[FileVerdict] | None = None
        self._thread = threading.Thread(target=self._hash, name="verify", daemon=True)
        self._thread.start()

    def _hash(self) -> None:
        self._result = verify_engine_dir(self._path, self._manifest, reuse=True)

    def result(self) -> None:
        self._thread.join()
        if self._result is None:  # the thread died (an OSError reading a file): check again here, raising it
            self._result = verify_engine_dir(self._path, self._manifest, reuse=True)
        _refuse(self._path, self._result)
        remember_verified(self._path, self._result)


def _stat_verdict(engine_dir: Path, digest: FileDigest) -> FileVerdict | None:
    """The verdict a stat alone gives (missing, another size), else None: the bytes decide."""
    try:
        size = os.stat(engine_dir / digest.name).st_size
    except FileNotFoundError:
        return FileVerdict(digest.name, "missing", None, digest.size, None, digest.sha256)
    if size != digest.size:
        return FileVerdict(digest.name, "modified", size, digest.size, None, digest.sha256)
    return None


def _refuse(path: Path, verdicts: list[FileVerdict]) -> None:
    bad = [v for v in verdicts if not v.ok]
    if bad:
        first = bad[0]
        more = f" (and {len(bad) - 1} more file(s))" if len(bad) > 1 else ""
        raise InputError(f"{path / first.name} is {first.describe()}{more}: the engine dir changed after it was "
                         f"built; rebuild it with `trtbuild build <ckpt-dir> {path} --force` "
                         f"(`trtbuild verify {path}` lists every file)")


# --- hashing, with the per-process record of files already hashed ------------------------------

_SETTLED_NS = 2_000_000_000  # a file changed less than 2 s before its hash is hashed again next time
_hashed: dict[Fingerprint, str] = {}  # inode fingerprint -> sha256, hashed by this process
_recorded: dict[Fingerprint, str] | None = None  # the per-user record, read once per process when a load needs it
_lock = threading.Lock()


def _verdict(engine_dir: Path, digest: FileDigest, reuse: bool = False) -> FileVerdict:
    file = engine_dir / digest.name
    try:
        before = os.stat(file)
    except FileNotFoundError:
        return FileVerdict(digest.name, "missing", None, digest.size, None, digest.sha256)
    if before.st_size != digest.size:  # no need to read a byte
        return FileVerdict(digest.name, "modified", before.st_size, digest.size, None, digest.sha256)
    sha = _sha256(file, before, reuse)
    status: Status = "ok" if sha == digest.sha256 else "modified"
    return FileVerdict(digest.name, status, before.st_size, digest.size, sha, digest.sha256)


def _sha256(file: Path, before: os.stat_result, reuse: bool) -> str:
    global _recorded
    key = fingerprint(before)
    if reuse:
        with _lock:
            if _recorded is None:
                _recorded = read_record()
            known = _hashed.get(key) or _recorded.get(key)
        if known is not None:
            return known
    sha = sha256_file(file)
    after = os.stat(file)
    # Any later write, truncate, utime or chmod sets ctime to the clock's time then: once the last change
    # is well in the past, an unchanged fingerprint means unchanged bytes.
    if fingerprint(after) == key and time.time_ns() - after.st_ctime_ns > _SETTLED_NS:
        with _lock:
            _hashed[key] = sha
    return sha

"""The engine dir and its manifest (config.json): what `trtbuild build` writes and every reader loads.

    engine-dir/
      config.json        EngineManifest: versions, model, build config, pass report, hashes, cost
      model.onnx         the onnxruntime twin (always written): numerics and CPU runs
      model.trt.onnx     the graph TensorRT parsed (kept to rebuild or refit without re-running passes)
      rank0.engine       serialized TensorRT(-RTX) engine (target tensorrt)
      rank0.safetensors  the checkpoint's weights, which both graphs reference: the engine dir's own
                         copy (a reflink where the filesystem allows), never a link to the checkpoint
      vision.onnx        vision-language models: the vision tower + projector (formats/vision_spec.py)
      vision.trt.onnx    and with target tensorrt: that graph in the engine's dtype, as TensorRT parsed it,
      vision.engine      and its TensorRT(-RTX) engine, a profile over images per call (formats/vision_engine.py)
      tokenizer files, generation_config.json

`files` records the sha256 and size of every file the engine reads (`verified_files`, as
the build left them); runner/engine_integrity.py checks them at load and in `trtbuild verify`.

Kept import-light (no onnx, no numpy): `trtbuild run` and `inspect` read it before anything heavy.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine_builder.formats.build_config import BuildConfig
from engine_builder.formats.checkpoint import CONFIG_FILE, SourceFingerprint
from engine_builder.formats.dataclass_io import from_dict
from engine_builder.formats.model_config import ModelConfig
from engine_builder.formats.ort_prepacked import PREPACKED_MODEL
from engine_builder.formats.parallel_mapping import ParallelMapping
from engine_builder.formats.quantization import Quantization
from engine_builder.formats.vision_engine import VisionEngine
from engine_builder.formats.vision_spec import VISION_MODEL, VISION_TRT_MODEL
from engine_builder.util.errors import ConfigError, InputError
from engine_builder.util.file_hash import sha256_files

ENGINE_SCHEMA = "trtbuild.engine"
ENGINE_SCHEMA_VERSION = 2  # 2: the model block nests the BlockSpec (model_config.py)
ORT_MODEL = "model.onnx"  # the onnxruntime twin
TRT_MODEL = "model.trt.onnx"  # the graph TensorRT parsed
GENERATION_CONFIG = "generation_config.json"
# An engine manifest is a few KB (SmolLM2's: 7.5 KB, most of it the pass report); anything near this is not one
MAX_MANIFEST_BYTES = 4 << 20


def engine_file(rank: int = 0) -> str:
    """The serialized TensorRT engine of RANK."""
    return f"rank{rank}.engine"


ENGINE_FILE = engine_file(0)


def verified_files(engine_dir: Path) -> list[Path]:
    """The files an engine reads, as present in ENGINE_DIR: its weights, both graphs and the external data
    beside them (model.onnx.data...), the serialized engines (a vision model's vision.engine too), a vision model's
    vision.onnx and vision.trt.onnx. Tokenizer and config files are not among them."""
    def read_by_the_engine(name: str) -> bool:
        return (name in (ORT_MODEL, TRT_MODEL, PREPACKED_MODEL, VISION_MODEL, VISION_TRT_MODEL)
                or name.endswith((".onnx.data", ".engine"))
                or (name.startswith("rank") and name.endswith((".safetensors", ".onnx"))))  # + tp/pp segments

    return sorted(f for f in Path(engine_dir).iterdir() if f.is_file() and read_by_the_engine(f.name))


def check_file_names(engine_dir: Path, names: list[str]) -> None:
    """Every file a manifest names is a plain name of a file inside ENGINE_DIR: no `..`, no separator, no
    absolute path, no symbolic link out of the dir. A manifest naming `../../x` had `verify` hash another
    dir's file (and print a prefix of its hash) and `run` load weights from there; a build only ever
    records its own files, so anything else is a tampered or foreign manifest: InputError."""
    where = Path(engine_dir) / CONFIG_FILE
    rebuild = f"rebuild the engine dir (`trtbuild build <ckpt-dir> {engine_dir} --force`)"
    root = Path(engine_dir).resolve()
    for name in names:
        if (not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name
                or Path(name).is_absolute()):
            raise InputError(f"{where} names the file {name!r}, which is not a plain file name inside the engine "
                             f"dir (a build records only its own files: a tampered or foreign manifest); {rebuild}")
        file = Path(engine_dir) / name
        if file.is_symlink() and file.resolve().parent != root:
            raise InputError(f"{file} is a symbolic link out of the engine dir (the manifest records only the "
                             f"dir's own files); {rebuild}")


@dataclass(frozen=True)
class FileDigest:
    """One file the engine reads, as the build wrote it."""

    name: str  # relative to the engine dir
    size: int
    sha256: str


def file_digests(engine_dir: Path) -> tuple[FileDigest, ...]:
    """What the manifest's `files` records: every verified file of ENGINE_DIR, hashed (in parallel)."""
    paths = verified_files(engine_dir)
    return tuple(FileDigest(p.name, p.stat().st_size, sha) for p, sha in zip(paths, sha256_files(paths)))


@dataclass(frozen=True)
class Versions:
    trtbuild: str
    onnxruntime: str | None = None
    tensorrt: dict[str, str] | None = None  # {"flavour", "trt_version"} when an engine was built


@dataclass(frozen=True)
class CheckpointSummary:
    """The checkpoint an engine was built from (None for `build --onnx`)."""

    dtype: str
    quantization: Quantization
    source: SourceFingerprint


@dataclass(frozen=True)
class OrtQuantization:
    """How the onnxruntime twin computes quantized linears: MatMulNBits' accuracy_level (0 float
    activations, exact; 4 int8 activations, faster), None when nothing was lowered."""

    scheme: str = "none"
    kv_cache: str = "none"
    onnxruntime_accuracy_level: int | None = None


@dataclass(frozen=True)
class SourceOnnx:
    """The exported graph of `trtbuild build --onnx`."""

    name: str
    sha256: str


@dataclass(frozen=True)
class BuildCost:
    build_seconds: float
    peak_rss_bytes: int


@dataclass(frozen=True)
class EngineManifest:
    versions: Versions
    build: BuildConfig
    targets: tuple[str, ...]
    passes: dict[str, list[dict[str, Any]]]  # target -> per-pass {name, matches, ...} in run order
    graph_hashes: dict[str, str]  # target -> sha256 of the graph file
    cost: BuildCost
    files: tuple[FileDigest, ...]  # every file the engine reads (verified_files), checked at load
    model: ModelConfig | None = None  # None for `build --onnx`: the exporter's graph carries no config
    checkpoint: CheckpointSummary | None = None
    source_onnx: SourceOnnx | None = None
    tensorrt: dict[str, Any] | None = None  # the TensorRT build report: flavour, version, targets, profiles...
    quantization: OrtQuantization | None = None
    fidelity: dict[str, Any] | None = None  # figures of a recipe's fidelity gate
    dtype_choice: str | None = None  # why build.dtype / build.twin_dtype are what they are (build/dtype_choice.py)
    mapping: ParallelMapping | None = None  # tp/pp engine dirs: rank{i}.<segment>.onnx per rank (parallel_mapping.py)
    vision_engine: VisionEngine | None = None  # a vision model built for tensorrt: vision.engine (vision_engine.py)
    schema: str = ENGINE_SCHEMA
    schema_version: int = ENGINE_SCHEMA_VERSION

    @property
    def twin_dtype(self) -> str:
        """The onnxruntime twin's compute and KV-cache dtype (older manifests: the engine's)."""
        return self.build.twin_dtype or self.build.dtype

    @property
    def checkpoint_quantization(self) -> Quantization:
        """The checkpoint's quantization block; the unquantized default for `build --onnx` dirs."""
        return self.checkpoint.quantization if self.checkpoint else Quantization()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, engine_dir: Path) -> None:
        (Path(engine_dir) / CONFIG_FILE).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, engine_dir: Path) -> EngineManifest:
        """The manifest of ENGINE_DIR, or an InputError naming the fix; nothing else is read."""
        path = Path(engine_dir)
        rebuild = f"build one with `trtbuild build <ckpt-dir> {path}`"
        if not path.exists():
            raise InputError(f"engine dir {path} does not exist; {rebuild}")
        manifest_path = path / CONFIG_FILE
        if not path.is_dir() or not manifest_path.is_file():
            raise InputError(f"{path} is not an engine dir (no config.json); {rebuild}")
        size = manifest_path.stat().st_size
        if size > MAX_MANIFEST_BYTES:  # checked before reading: a 50 MB file once took 1.4 GB to parse
            raise InputError(f"{manifest_path} is {size} bytes, more than any engine manifest ({MAX_MANIFEST_BYTES}); "
                             "it is not one trtbuild wrote: rebuild the engine dir")
        try:
            data = json.loads(manifest_path.read_text())
        except (OSError, ValueError, RecursionError) as exc:  # RecursionError: nesting deeper than Python's stack
            reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            raise InputError(f"{manifest_path} is not valid JSON ({reason}); rebuild the engine dir") from None
        if not isinstance(data, dict) or data.get("schema") != ENGINE_SCHEMA:
            raise InputError(f"{path} is not a trtbuild engine dir (config.json schema is not {ENGINE_SCHEMA!r}; "
                             f"a checkpoint dir?); {rebuild}")
        rebuild = f"rebuild it with this version of trtbuild: `trtbuild build <ckpt-dir> {path} --force`"
        if data.get("schema_version") != ENGINE_SCHEMA_VERSION:
            raise InputError(f"{path} has engine schema {data.get('schema_version')}, this trtbuild reads "
                             f"{ENGINE_SCHEMA_VERSION}; {rebuild}")
        try:
            manifest = from_dict(cls, data, where="engine manifest")
            manifest.build.validate()  # the limits every runtime reads are checked here, once
            if manifest.model is not None:
                manifest.model.validate()
        except (ConfigError, TypeError, ValueError, KeyError) as exc:
            message = str(exc).replace("\n", " ")
            raise InputError(f"{manifest_path} (engine schema {ENGINE_SCHEMA_VERSION}) is incomplete or from "
                             f"another trtbuild ({message}); {rebuild}") from None
        # before any command reads or hashes a file it names (verify, run, serve, inspect all load here)
        check_file_names(path, [d.name for d in manifest.files])
        return manifest


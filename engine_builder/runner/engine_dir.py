"""An engine dir as the runner sees it: the manifest, the limits it was built for, its tokenizer.

Everything a user can get wrong about the directory (missing, not an engine dir, built by a
newer trtbuild, a file deleted) is an InputError naming the fix, raised before any session or
engine is created.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from engine_builder.build_config import Limits
from engine_builder.config import ModelConfig, from_dict
from engine_builder.engine_dir import load_manifest
from engine_builder.engine_files import ENGINE_FILE, ORT_MODEL
from engine_builder.errors import ConfigError, InputError

GENERATION_CONFIG = "generation_config.json"


@dataclass(frozen=True)
class EngineDir:
    path: Path
    model: ModelConfig
    limits: Limits  # max_batch (KV slots), max_input_len (longest prompt), max_seq_len (KV positions)
    dtype: str  # float32 | float16 | bfloat16: the graph's KV cache and activation dtype
    targets: tuple[str, ...]
    tensorrt: dict[str, Any] | None  # the manifest's "tensorrt" block (flavour, version, targets, profiles)
    manifest: dict[str, Any]

    @classmethod
    def load(cls, path: Path | str) -> EngineDir:
        path = Path(path)
        manifest = load_manifest(path)
        manifest_path = path / "config.json"
        try:
            model = from_dict(ModelConfig, manifest["model"], where="engine manifest model")
            build = manifest["build"]
            limits = from_dict(Limits, build["limits"], where="engine manifest limits")
            dtype = str(build["dtype"])
        except (KeyError, TypeError, ConfigError) as exc:
            raise InputError(f"{manifest_path} is incomplete or from another trtbuild ({exc}); "
                             "rebuild the engine dir") from None
        if not (path / ORT_MODEL).is_file():
            raise InputError(f"{path / ORT_MODEL} is missing (every engine dir carries its onnxruntime twin); "
                             "rebuild the engine dir")
        return cls(path=path, model=model, limits=limits, dtype=dtype,
                   targets=tuple(manifest.get("targets", ())), tensorrt=manifest.get("tensorrt"),
                   manifest=manifest)

    @property
    def onnx_path(self) -> Path:
        return self.path / ORT_MODEL

    @property
    def engine_path(self) -> Path:
        return self.path / ENGINE_FILE

    @cached_property
    def generation_config(self) -> dict[str, Any]:
        """The checkpoint's generation_config.json ({} when it had none)."""
        file = self.path / GENERATION_CONFIG
        if not file.is_file():
            return {}
        try:
            data = json.loads(file.read_text())
        except (OSError, ValueError) as exc:
            raise InputError(f"{file} is not valid JSON ({exc}); fix or delete it") from None
        return data if isinstance(data, dict) else {}

    @cached_property
    def graph_metadata(self) -> dict[str, str]:
        """model.onnx's metadata_props (trtbuild.reprefill_after, trtbuild.kv_update...), graph only."""
        import onnx

        model = onnx.load(str(self.onnx_path), load_external_data=False)
        return {p.key: p.value for p in model.metadata_props}

    def load_tokenizer(self) -> Any:
        """The HF fast tokenizer saved beside the engine (tokenizer.json, chat template...)."""
        if not (self.path / "tokenizer.json").is_file() and not (self.path / "tokenizer_config.json").is_file():
            raise InputError(f"{self.path} has no tokenizer files; the checkpoint lacked them: copy the model's "
                             "tokenizer.json / tokenizer_config.json into the engine dir")
        return load_tokenizer(self.path)


def load_tokenizer(path: Path) -> Any:
    """The HF fast tokenizer saved in PATH (an engine or checkpoint dir); a one-line error if it cannot load."""
    from transformers import AutoTokenizer  # seconds to import: only when a tokenizer is needed

    try:
        return AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot load the tokenizer in {path}: {exc}".replace("\n", " ")) from None

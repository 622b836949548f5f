"""An engine dir as the runner sees it: the typed manifest, the limits it was built for, its tokenizer.

Everything a user can get wrong about the directory (missing, not an engine dir, built by a
newer trtbuild, a file deleted or changed since the build) is an InputError naming the fix,
raised before any session or engine is created. The manifest's own checks (schema, limits) live in formats/manifest.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from engine_builder.formats.build_config import Limits
from engine_builder.formats.graph_io import KVCacheLayout, PagedKVLayout
from engine_builder.formats.manifest import ENGINE_FILE, GENERATION_CONFIG, ORT_MODEL, EngineManifest
from engine_builder.formats.memory_plan import check_engine_memory
from engine_builder.formats.model_config import ModelConfig
from engine_builder.runner.engine_integrity import PendingCheck, check_engine_files
from engine_builder.util.errors import InputError


@dataclass(frozen=True)
class EngineDir:
    path: Path
    manifest: EngineManifest

    # verify="overlap": the hashing still running (engine_integrity.PendingCheck); wait_verified() ends it
    pending: PendingCheck | None = field(default=None, compare=False, repr=False)

    @classmethod
    def load(cls, path: Path | str, verify: bool | Literal["overlap"] = True) -> EngineDir:
        """The engine dir at PATH. verify (default): every file the engine reads must have the sha256 and
        size its build recorded (engine_integrity.py; about 0.7 s per GB); False skips that for trusted
        fast starts. "overlap": sizes are checked now, the sha256 in a background thread while the caller
        loads the engine, and the caller must call wait_verified() before generating (LLM() does)."""
        path = Path(path)
        manifest = EngineManifest.load(path)
        if manifest.model is None:
            raise InputError(f"{path} was built from an exported ONNX graph (`trtbuild build --onnx`), which carries "
                             "no model config to generate with; build from a checkpoint: "
                             f"`trtbuild build <ckpt-dir> {path} --force`")
        if manifest.mapping is None and not (path / ORT_MODEL).is_file():  # tp/pp dirs: a graph per segment
            raise InputError(f"{path / ORT_MODEL} is missing (every engine dir carries its onnxruntime twin); "
                             "rebuild the engine dir")
        if verify == "overlap":
            return cls(path=path, manifest=manifest, pending=PendingCheck(path, manifest))
        if verify:
            check_engine_files(path, manifest)
        return cls(path=path, manifest=manifest)

    def check_host_memory(self) -> None:
        """Refuse (ConfigError, the figures and the fix) what the engine's weights, KV cache and activations need
        in this machine's RAM when that is more than it has: the onnxruntime twin's check, made before its
        session allocates anything. A backend on a GPU (TensorRT, torch) keeps them in device memory instead."""
        quant = self.manifest.checkpoint_quantization
        check_engine_memory(self.model, self.limits, self.manifest.build.dtype, quant.kv_cache, quant.weight_bits,
                            what=f"engine dir {self.path}")

    def wait_verified(self) -> None:
        """After load(verify="overlap"): wait for the hashes; an InputError naming the changed file."""
        if self.pending is not None:
            self.pending.result()

    @property
    def model(self) -> ModelConfig:
        assert self.manifest.model is not None  # load() refuses a manifest without one
        return self.manifest.model

    @property
    def limits(self) -> Limits:
        """max_batch (KV slots), max_input_len (longest prompt), max_seq_len (KV positions)."""
        return self.manifest.build.limits

    @property
    def dtype(self) -> str:
        """float32 | float16 | bfloat16: the graph's KV cache and activation dtype."""
        return self.manifest.build.dtype

    @property
    def twin_dtype(self) -> str:
        """The onnxruntime twin's activation and KV-cache dtype (float32 by default on CPUs without fast
        float16, while the TensorRT engine keeps float16: build/dtype_choice.py)."""
        return self.manifest.twin_dtype

    @property
    def twin_kv_layout(self) -> KVCacheLayout:
        """The cache model.onnx takes."""
        kv_cache = self.manifest.checkpoint_quantization.kv_cache
        return KVCacheLayout.of(self.model, self.limits.max_seq_len, self.twin_dtype, kv_cache)

    @property
    def kv_layout_kind(self) -> str:
        """slots | paged (`build --kv-layout`; older manifests: slots)."""
        return self.manifest.build.kv_layout

    @property
    def twin_paged_layout(self) -> PagedKVLayout:
        """The block pool model.onnx takes when kv_layout_kind is paged."""
        kv_cache = self.manifest.checkpoint_quantization.kv_cache
        return PagedKVLayout.of(self.model, self.limits.max_seq_len, self.twin_dtype, kv_cache,
                                self.manifest.build.kv_block_size)

    @property
    def targets(self) -> tuple[str, ...]:
        return self.manifest.targets

    @property
    def tensorrt(self) -> dict[str, Any] | None:
        """The manifest's TensorRT build report (flavour, version, targets, profiles)."""
        return self.manifest.tensorrt

    @property
    def kv_layout(self) -> KVCacheLayout:
        """The cache the graph takes, from the same manifest fields the emitter built it from."""
        kv_cache = self.manifest.checkpoint_quantization.kv_cache
        return KVCacheLayout.of(self.model, self.limits.max_seq_len, self.dtype, kv_cache)

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
        """model.onnx's metadata_props (formats/graph_io.py's META_* keys), graph only."""
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
    """The HF fast tokenizer saved in PATH (an engine or checkpoint dir); a one-line error if it cannot load.

    Where transformers' wrapper adds nothing to the tokenizers.Tokenizer in tokenizer.json, that Tokenizer
    itself behind the same interface (runner/fast_tokenizer.py: no transformers import, ~0.5-0.9 s of
    `trtbuild run`'s cold start, issue 16); else transformers' own class."""
    from engine_builder.runner.fast_tokenizer import GENERIC_CLASSES, FastTokenizer, eligible

    try:
        fast = eligible(Path(path))
        if fast is not None:
            return FastTokenizer(Path(path), *fast)
        try:
            generic = (Path(path) / "tokenizer.json").is_file() and json.loads(
                (Path(path) / "tokenizer_config.json").read_text()).get("tokenizer_class") in GENERIC_CLASSES
        except (OSError, ValueError, AttributeError):
            generic = False
        if generic:
            from transformers.tokenization_utils_tokenizers import TokenizersBackend

            return TokenizersBackend.from_pretrained(str(path))
        from transformers import AutoTokenizer  # seconds to import: only when a tokenizer is needed

        return AutoTokenizer.from_pretrained(str(path))
    # the files are the user's: a malformed one surfaces as whatever its parser raises (transformers: KeyError for a
    # tokenizer.json without "added_tokens", tokenizers: Exception), each a one-line refusal, not a traceback
    except Exception as exc:  # noqa: BLE001
        raise InputError(f"cannot load the tokenizer in {path}: {type(exc).__name__}: {exc}; restore the model's "
                         "tokenizer files (tokenizer.json, tokenizer_config.json) or convert again".replace("\n", " ")
                         ) from None

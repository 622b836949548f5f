"""A GGUF file as a `Source`: Hugging Face tensor names, float32 weights, an HF tokenizer.

We lean on the two libraries that already know the format rather than re-deriving it:
  - `transformers` turns GGUF metadata into an HF config and an HF tokenizer (its GGUF loader is
    what `from_pretrained(dir, gguf_file=...)` uses, so our output matches that reference);
  - `gguf` (llama.cpp's own package) reads the tensors, dequantizes every block format, and holds
    the HF <-> GGUF tensor name table, which we invert over the HF model's parameter names.
The only thing re-implemented is the per-tensor fix-up llama.cpp applies on export (see
`_FIXUPS`); it mirrors transformers' legacy GGUF loader exactly, and the tests hold us to it.
"""

from __future__ import annotations

import functools
import json
import mmap
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from converters.registry import TensorInfo
from engine_builder.util.errors import InputError, UnsupportedError

Fixup = Callable[[str, np.ndarray, dict[str, Any]], np.ndarray]

# Keys `save_pretrained` copies from the loading call into tokenizer_config.json; they describe
# how *we* loaded the GGUF, not the tokenizer, and would mislead whoever loads the saved copy.
_LOADER_ONLY_KEYS = ("is_local", "local_files_only")


def _unpermute_qk(name: str, w: np.ndarray, cfg: dict[str, Any]) -> np.ndarray:
    """Undo llama.cpp's rotary re-ordering of Q and K rows (its `LlamaModel.permute`).

    Same arithmetic as transformers' `LlamaTensorProcessor._reverse_permute_weights`, so the
    result is bit-identical to `from_pretrained(..., gguf_file=...)`.
    """
    if ".attn_q." in name:
        n_head = cfg.get("num_attention_heads")
    elif ".attn_k." in name:
        n_head = cfg.get("num_key_value_heads")
    else:
        return w
    if n_head is None:  # transformers leaves the tensor alone then; so do we
        return w
    # rows are [n_head, 2, head_dim/2] (halves interleaved); HF wants [n_head, head_dim/2, 2]
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def _unoffset_norms(name: str, w: np.ndarray, cfg: dict[str, Any]) -> np.ndarray:
    # llama.cpp stores gemma-style RMSNorm weights as 1 + w; HF keeps w and adds the 1 at runtime
    return w - 1 if "norm.weight" in name else w


# GGUF general.architecture -> fix-up, for every architecture transformers' legacy loader
# post-processes with a per-tensor, shape-preserving TensorProcessor. An architecture that
# transformers processes in some other way is refused (see `_check_architecture`).
_FIXUPS: dict[str, Fixup] = {
    "llama": _unpermute_qk,
    "gemma2": _unoffset_norms,
    "gemma3": _unoffset_norms,
    "nemotron": _unoffset_norms,
}

# Tensors llama.cpp precomputes from the rope config; HF recomputes them from config.json, but
# transformers' GGUF config reader drops the scaling they encode, so a file with them would
# silently get the wrong rotary frequencies.
_ROPE_TABLES = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")


class GGUFSource:
    kind = "gguf"

    def __init__(self, path: Path):
        self.path = Path(path)
        # Only the reader's tensor table is kept: its parsed metadata (one numpy array per vocab
        # entry and merge) costs ~150 MB for a 49k vocab and is freed when __init__ returns.
        reader = _open_reader(self.path)
        arch = _field(reader, "general.architecture")
        if not isinstance(arch, str):
            raise InputError(f"{self.path} has no general.architecture in its metadata; "
                             f"re-export it with llama.cpp's convert_hf_to_gguf.py")
        self.architecture = arch
        self._fixup = _check_architecture(self.path, arch)
        # transformers' legacy GGUF config reader maps no rope.scaling.* key, so a scaled-rope
        # file would silently get plain rope; refuse it instead
        if (scaling := _field(reader, f"{arch}.rope.scaling.type")) not in (None, "none"):
            raise UnsupportedError(f"{self.path.name} uses {scaling!r} rope scaling, which transformers' GGUF "
                                   f"config reader drops; convert from the original HF checkpoint instead")
        _check_dequantizable(self.path, reader)

        raw_config = _transformers_config(self.path, reader)
        self._special_ids = {k: raw_config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")
                             if raw_config.get(k) is not None}
        self._raw_config = raw_config
        self.hf_config, hf_names = _hf_config_and_names(self.path, raw_config)

        gguf_to_hf = _gguf_to_hf_names(arch, raw_config.get("num_hidden_layers", 0), hf_names)
        self._tensors: dict[str, Any] = {}  # HF name -> gguf ReaderTensor (a view of the memmap)
        for t in reader.tensors:
            if t.name in _ROPE_TABLES:
                raise UnsupportedError(
                    f"{self.path} stores rope scaling as tensor {t.name!r}, which transformers' GGUF "
                    f"config reader drops; convert from the original HF checkpoint instead")
            if (hf := gguf_to_hf.get(t.name)) is None:
                raise UnsupportedError(
                    f"GGUF tensor {t.name!r} in {self.path.name} has no counterpart in "
                    f"{self.hf_config['architectures'][0]}; this {arch} variant is not supported, "
                    f"convert from the original HF checkpoint instead")
            self._tensors[hf] = t
        # the file mapping every tensor is a view of: its pages are dropped after each tensor
        self._mapping = getattr(reader.data, "_mmap", None)
        # ggml lists dims fastest-first; torch/HF order is the reverse: [out, in] for a Linear
        self._infos = {hf: TensorInfo(tuple(int(d) for d in reversed(t.shape.tolist())), "float32")
                       for hf, t in self._tensors.items()}

    def tensor_infos(self) -> dict[str, TensorInfo]:
        return self._infos

    def load(self, name: str) -> torch.Tensor:
        from gguf.quants import dequantize

        t = self._tensors[name]
        w = self._fixup(t.name, dequantize(t.data, t.tensor_type), self._raw_config)
        # An owned, writable float32 copy: F32 tensors come back as read-only views of the memmap.
        out = torch.from_numpy(np.require(w, np.float32, ["C", "W", "O"]))
        self._drop_pages()
        return out

    def block_types(self) -> dict[str, str]:
        """HF name -> the ggml type it is stored as ("F32", "Q4_1", "Q8_0", ...)."""
        return {hf: t.tensor_type.name for hf, t in self._tensors.items()}

    def load_blocks(self, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A Q4_0/Q4_1/Q4_K tensor's blocks as they are: (codes int8 [out, in], scale f32 [out, in/32],
        offset f32 [out, in/32]), rows in HF order (converters/quantize/gguf_blocks.py)."""
        from converters.sources.gguf_codes import decode

        t = self._tensors[name]
        # blocks run along the inputs, so the fix-up's row permutation applies to each part alike
        parts = tuple(np.ascontiguousarray(self._fixup(t.name, a, self._raw_config))
                      for a in decode(np.asarray(t.data), t.tensor_type.name))
        self._drop_pages()
        return parts

    def _drop_pages(self) -> None:
        """Pages read through the mapping count as ours until dropped: without this, RSS grows to the
        file's size over a conversion (they stay in the page cache either way)."""
        if self._mapping is not None:
            self._mapping.madvise(mmap.MADV_DONTNEED)

    def raw_range(self, name: str) -> None:
        return None  # every GGUF tensor is dequantized, never copied as stored

    def files(self) -> list[Path]:
        return [self.path]

    def write_tokenizer(self, out_dir: Path) -> list[str]:
        """tokenizer.json, tokenizer_config.json, chat_template.jinja and generation_config.json."""
        from transformers import AutoTokenizer, GenerationConfig

        out_dir = Path(out_dir)
        try:
            with _isolated_dir(self.path) as (folder, name):
                tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        except (ValueError, KeyError, TypeError, NotImplementedError) as exc:
            raise UnsupportedError(f"transformers cannot build a tokenizer from {self.path.name} ({exc}); "
                                   f"convert from the original HF checkpoint instead") from exc
        # HF repos state the context length here; transformers' GGUF path leaves "unbounded"
        if (ctx := self.hf_config.get("max_position_embeddings")) is not None:
            tok.model_max_length = ctx
        written = {Path(p).name for p in tok.save_pretrained(out_dir) if Path(p).is_file()}
        config_path = out_dir / "tokenizer_config.json"
        if config_path.is_file():
            tok_config = json.loads(config_path.read_text())
            for key in _LOADER_ONLY_KEYS:
                tok_config.pop(key, None)
            config_path.write_text(json.dumps(tok_config, indent=2, ensure_ascii=False) + "\n")
        # The GGUF's special ids are the only generation defaults it carries.
        GenerationConfig(**self._special_ids).save_pretrained(out_dir)
        written.add("generation_config.json")
        return sorted(written)


def _open_reader(path: Path) -> Any:
    """gguf.GGUFReader over `path`, with every failure turned into an InputError."""
    if not path.is_file():
        raise InputError(f"{path} does not exist or is not a file; pass the path of a .gguf file")
    size = path.stat().st_size
    hint = "re-download it or re-export it with llama.cpp's convert_hf_to_gguf.py"
    try:
        reader = _fast_reader_class()(path, "r")
    except OSError as exc:
        raise InputError(f"cannot read {path} ({exc.strerror or exc}); check the path and permissions") from exc
    except Exception as exc:  # the parser meets untrusted bytes: any failure means a bad file
        with open(path, "rb") as f:
            what = "is truncated or corrupt" if f.read(4) == b"GGUF" else "is not a GGUF file (no GGUF magic)"
        raise InputError(f"{path} {what} ({type(exc).__name__}: {exc}); {hint}") from exc
    for t in reader.tensors:
        # GGUFReader slices its memmap without bounds checks; today a short slice fails its reshape
        # above, but do not rely on that to catch a cut file
        if t.data_offset + t.n_bytes > size or t.data.nbytes != t.n_bytes:
            raise InputError(f"{path} is truncated or corrupt: tensor {t.name!r} ends at byte "
                             f"{t.data_offset + t.n_bytes}, the file has {size}; {hint}")
    return reader


def _field(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def _check_architecture(path: Path, arch: str) -> Fixup:
    from gguf import MODEL_ARCH_NAMES
    from transformers.integrations.gguf import GGUF_ARCHS
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES, TENSOR_PROCESSORS

    # GGUF_ARCHS go through transformers' newer packed-weights loader (hybrid/conv models), whose
    # transforms we do not mirror; a TENSOR_PROCESSORS entry we have no fix-up for would be
    # silently wrong. Everything else transformers loads with plain renaming. (The legacy list
    # also holds non-arch keys such as "general"; gguf's arch names filter those out.)
    supported = sorted(a for a in GGUF_SUPPORTED_ARCHITECTURES
                       if a in MODEL_ARCH_NAMES.values() and a not in GGUF_ARCHS
                       and (a not in TENSOR_PROCESSORS or a in _FIXUPS))
    if arch not in supported:
        raise UnsupportedError(f"{path.name}: GGUF architecture {arch!r} is not supported; supported: "
                               f"{', '.join(supported)}. Convert from the original HF checkpoint instead")
    return _FIXUPS.get(arch, lambda name, w, cfg: w)


def _check_dequantizable(path: Path, reader: Any) -> None:
    """Refuse up front a tensor type gguf cannot dequantize in numpy, rather than mid-conversion."""
    from gguf import GGML_QUANT_SIZES
    from gguf.quants import dequantize

    for qtype in {t.tensor_type for t in reader.tensors}:
        try:  # one all-zero block of that type is the cheapest honest probe
            dequantize(np.zeros((1, GGML_QUANT_SIZES[qtype][1]), np.uint8), qtype)
        except (NotImplementedError, KeyError, ValueError) as exc:
            raise UnsupportedError(f"{path.name} holds {qtype.name} tensors, which the gguf package "
                                   f"cannot dequantize; re-quantize it (e.g. Q8_0 or Q4_K)") from exc


def _transformers_config(path: Path, reader: Any) -> dict[str, Any]:
    """The config dict transformers' legacy GGUF loader derives from the metadata, read from READER (our parse
    of PATH) rather than a second parse of the file."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    try:
        with _parsed_once(path, reader):
            return load_gguf_checkpoint(str(path), return_tensors=False)["config"]
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise InputError(f"{path} has incomplete or inconsistent GGUF metadata ({exc}); "
                         f"re-export it with llama.cpp's convert_hf_to_gguf.py") from exc


@functools.cache
def _fast_reader_class() -> type:
    """gguf.GGUFReader slicing a plain ndarray view of its memmap instead of the memmap itself.

    The reader slices the file for every metadata value: ~500,000 slices for a 49k vocab and its merges. A slice
    of an np.memmap runs memmap's Python-level __getitem__ and __array_finalize__; one of a plain view of the
    same mapping does not, and holds the same bytes. Parsing SmolLM2's GGUF took 2.9-3.4 s with the stock reader
    and 0.7-1.1 s with this one (same fields, parts, types and tensors; tests/converters/test_gguf_source.py).
    `reader.data` stays the memmap (GGUFSource drops its pages through it)."""
    import numpy.typing as npt
    from gguf import GGUFReader

    class FastGGUFReader(GGUFReader):
        def _get(self, offset: int, dtype: npt.DTypeLike, count: int = 1,
                 override_order: Any = None) -> npt.NDArray[Any]:
            plain = self.__dict__.get("_plain")
            if plain is None:
                plain = self._plain = self.data.view(np.ndarray)
            count = int(count)
            arr = plain[offset:offset + np.dtype(dtype).itemsize * count].view(dtype=dtype)[:count]
            return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

    return FastGGUFReader


@contextmanager
def _parsed_once(path: Path, reader: Any) -> Iterator[None]:
    """While it lasts, gguf.GGUFReader(PATH) is READER: transformers' loader opens the file with its own
    GGUFReader, which re-parsed every vocab entry and merge that READER already holds (3.5 s of the 11 s
    `trtbuild plan` took on SmolLM2's GGUF, and ~100 MB more peak RSS). Any other path still gets a reader of
    its own; a thread asking for one meanwhile gets it from this function, not the class (convert and plan open
    their source on one thread)."""
    import gguf

    stock = gguf.GGUFReader
    target = Path(path).resolve()

    def open_reader(p: Any, *args: Any, **kwargs: Any) -> Any:
        return reader if Path(p).resolve() == target else stock(p, *args, **kwargs)

    gguf.GGUFReader = open_reader
    try:
        yield
    finally:
        gguf.GGUFReader = stock


def _hf_config_and_names(path: Path, raw: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A config.json-style dict, and the HF model's parameter names (from a meta-device model)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.for_model(**raw)
        with torch.device("meta"):  # names and shapes only: allocates nothing
            model = AutoModelForCausalLM.from_config(config)
    except (ValueError, KeyError, TypeError) as exc:
        raise UnsupportedError(f"{path.name}: transformers has no causal-LM class for model_type "
                               f"{raw.get('model_type')!r} ({exc})") from exc
    hf = {k: v for k, v in config.to_dict().items() if not k.startswith("_")}
    hf["architectures"] = hf.get("architectures") or [type(model).__name__]
    # dequantized weights are float32; both spellings, for readers of either transformers era
    hf["dtype"] = hf["torch_dtype"] = "float32"
    return hf, list(model.state_dict())


def _gguf_to_hf_names(arch: str, num_layers: int, hf_names: list[str]) -> dict[str, str]:
    """Invert gguf's HF -> GGUF name table over this model's own parameter names.

    Like transformers' `get_gguf_hf_weights_map`, a name is also tried with leading module
    prefixes stripped (its recursion into submodules); the shallowest match wins.
    """
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    # `_check_architecture` already made sure gguf knows this arch name
    arch_id = next(k for k, v in MODEL_ARCH_NAMES.items() if v == arch)
    name_map = get_tensor_name_map(arch_id, num_layers)
    best: dict[str, tuple[int, str]] = {}
    for hf in hf_names:
        stem, suffix = hf, ""
        if hf.endswith((".weight", ".bias")):
            stem, suffix = hf.rsplit(".", 1)
            suffix = "." + suffix
        parts = stem.split(".")
        for depth in range(len(parts)):
            if (gguf_name := name_map.get_name(".".join(parts[depth:]))) is not None:
                key = gguf_name + suffix
                if key not in best or depth < best[key][0]:
                    best[key] = (depth, hf)
                break
    return {g: hf for g, (_, hf) in best.items()}


class _isolated_dir:
    """A private dir holding only a link to the GGUF, so transformers cannot pick up a stray
    tokenizer.json / tokenizer_config.json that happens to sit next to the file."""

    def __init__(self, path: Path):
        self.path = path.resolve()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    def __enter__(self) -> tuple[str, str]:
        self._tmp = tempfile.TemporaryDirectory(prefix="trtbuild-gguf-")
        link = Path(self._tmp.name) / self.path.name
        try:
            link.symlink_to(self.path)
        except OSError:  # no symlinks here (some Windows setups): fall back to the real dir
            return str(self.path.parent), self.path.name
        return self._tmp.name, self.path.name

    def __exit__(self, *exc: object) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()

"""Checkpoint weights as ONNX external data pointing into rank0.safetensors, bytes never read.

A safetensors file is an 8-byte little-endian header length, a JSON header, then raw
row-major tensor bytes; tensor t lives at file offset 8 + header_len + data_offsets[0].
ONNX external data (location, offset, length) can address exactly that, so model.onnx
stays a few hundred KB and the weights are never copied, converted or even loaded here.
Quantized linears (converters/quantize/FORMAT.md) are read the same way: packed int4 bytes
become an ONNX INT4/UINT4 tensor of the unpacked shape at the same offset.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import onnx_ir as ir

from engine_builder.formats.checkpoint import WEIGHTS_FILE, expected_shapes
from engine_builder.formats.model_config import ModelConfig
from engine_builder.formats.quant_layout import FLOATS, StoredLayout, check_scheme, kv_cache_layout, quantized_layout
from engine_builder.formats.quantization import Quantization
from engine_builder.network.builder import GraphBuilder
from engine_builder.util.errors import InputError, UnsupportedError

# quantized linears add I8, U8 (packed int4) and F8_E4M3 (converters/quantize/FORMAT.md)
_ST_DTYPES = {"F32": ir.DataType.FLOAT, "F16": ir.DataType.FLOAT16, "BF16": ir.DataType.BFLOAT16,
              "I8": ir.DataType.INT8, "U8": ir.DataType.UINT8, "F8_E4M3": ir.DataType.FLOAT8E4M3FN}


@dataclass(frozen=True)
class StoredTensor:
    name: str
    dtype: ir.DataType
    shape: tuple[int, ...]
    offset: int  # absolute byte offset in the file
    length: int


def read_safetensors_index(path: Path) -> dict[str, StoredTensor]:
    """Name -> where the tensor's bytes are, from the header alone."""
    try:
        with open(path, "rb") as f:
            header_len = int.from_bytes(f.read(8), "little")
            if not 2 <= header_len <= 100_000_000:
                raise ValueError(f"implausible header length {header_len}")
            header = json.loads(f.read(header_len))
        size = path.stat().st_size
    except (OSError, ValueError) as exc:
        raise InputError(f"{path} is not a readable safetensors file ({exc}); re-run `trtbuild convert`") from exc
    data_start = 8 + header_len
    index = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        if meta["dtype"] not in _ST_DTYPES:
            raise UnsupportedError(
                f"{path.name}: tensor {name!r} is {meta['dtype']}; the network builder reads "
                f"{'/'.join(_ST_DTYPES)} tensors only; re-run `trtbuild convert`")
        begin, end = meta["data_offsets"]
        if data_start + end > size:
            raise InputError(f"{path} is truncated ({name!r} ends past the end of the file); "
                             f"re-run `trtbuild convert`")
        index[name] = StoredTensor(name, _ST_DTYPES[meta["dtype"]], tuple(meta["shape"]),
                                   data_start + begin, end - begin)
    return index


class CheckpointWeights:
    """Canonical weight name -> graph value (an external initializer, cast to the compute dtype)."""

    def __init__(self, ckpt_dir: Path, cfg: ModelConfig, b: GraphBuilder, quantization: Quantization = Quantization(),
                 file: str = WEIGHTS_FILE, shapes: dict[str, tuple[int, ...]] | None = None):
        """FILE and SHAPES: another rank's file and what it holds (tp/pp shards, converters/parallel_shard.py)."""
        self.ckpt_dir = Path(ckpt_dir)
        self.quantization = quantization
        self.file = file
        self._b = b
        self._index = read_safetensors_index(self.ckpt_dir / file)
        self._values: dict[str, ir.Value] = {}
        self._layouts: dict[str, StoredLayout] = {}
        self._check(cfg, shapes)

    def _check(self, cfg: ModelConfig, expected: dict[str, tuple[int, ...]] | None) -> None:
        check_scheme(self.quantization)
        shapes = dict(expected) if expected is not None else \
            {name: shape for name, (shape, _) in expected_shapes(cfg).items()}
        if cfg.tie_word_embeddings and "lm_head" in self.quantization.quantized:
            shapes["lm_head.weight"] = (cfg.vocab_size, cfg.hidden_size)  # FORMAT.md: stored beside embed
        for prefix in self.quantization.quantized:
            if prefix + ".weight" not in shapes:
                raise InputError(f"config.json's quantization lists {prefix!r}, which is not a linear of this "
                                 f"model; re-run `trtbuild convert --quant`")
            self._layouts |= quantized_layout(self.quantization, prefix, *shapes.pop(prefix + ".weight"))
        self._layouts |= kv_cache_layout(self.quantization, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)
        for name, shape in shapes.items():
            self._expect(name, FLOATS, shape)
        for name, layout in self._layouts.items():
            self._expect(name, layout.stored, layout.shape)

    def _expect(self, name: str, dtypes: tuple[ir.DataType, ...], shape: tuple[int, ...]) -> None:
        stored = self._index.get(name)
        if stored is None:
            raise InputError(f"{self.ckpt_dir / self.file} has no tensor {name!r} that its "
                             f"config.json requires; re-run `trtbuild convert`")
        if stored.shape != shape:
            raise InputError(f"{name!r} has shape {list(stored.shape)} but config.json implies "
                             f"{list(shape)}; re-run `trtbuild convert`")
        if stored.dtype not in dtypes:
            raise InputError(f"{name!r} is {stored.dtype.name} but config.json implies "
                             f"{' or '.join(d.name for d in dtypes)}; re-run `trtbuild convert`")

    def __getitem__(self, name: str) -> ir.Value:
        """A float tensor in the compute dtype."""
        if name not in self._values:
            value = self._initializer(name)
            if value.dtype != self._b.dtype:
                # e.g. a bfloat16 checkpoint run in float32 on onnxruntime
                with self._b.scope(name, absolute=True):  # wherever the first use happens to be
                    value = self._b.cast(value, self._b.dtype)
            self._values[name] = value
        return self._values[name]

    def stored(self, name: str) -> ir.Value:
        """A quantized tensor as stored, never cast: packed int4 bytes seen as INT4/UINT4 [out, in]."""
        if name not in self._values:
            layout = self._layouts[name]
            self._values[name] = self._initializer(name, layout.view, layout.view_shape)
        return self._values[name]

    def _initializer(self, name: str, view: ir.DataType | None = None,
                     view_shape: tuple[int, ...] | None = None) -> ir.Value:
        s = self._index[name]
        dtype, shape = view or s.dtype, ir.Shape(view_shape or s.shape)
        tensor = ir.ExternalTensor(self.file, s.offset, s.length, dtype, shape=shape, name=name,
                                   base_dir=self.ckpt_dir)
        return self._b.initializer(ir.Value(name=name, shape=shape, type=ir.TensorType(dtype), const_value=tensor))


def link_weights(ckpt_dir: Path, out_dir: Path, *, own_copy: bool = False) -> Path:
    """Put the checkpoint's rank0.safetensors into out_dir; returns its path there.

    onnxruntime and TensorRT refuse external data outside the model's own dir and onnxruntime
    refuses symlinks, so the file must really be in out_dir. own_copy=True (engine dirs) gives it
    its own inode, so a later in-place edit of the checkpoint can neither change nor truncate what
    an engine reads (onnxruntime maps external data): a reflink (copy-on-write, no space, instant)
    where the filesystem allows (btrfs, XFS, bcachefs, ZFS 2.2+), else a streamed copy. Otherwise
    (scratch dirs that die with the command) a hard link, costing nothing, or a copy across filesystems.
    """
    src, dst = Path(ckpt_dir) / WEIGHTS_FILE, Path(out_dir) / WEIGHTS_FILE
    if dst.exists() and os.path.samefile(src, dst):
        if not own_copy:
            return dst
        dst.unlink()  # a link from an earlier call: replace it by a copy
    tmp = dst.with_name(f".{WEIGHTS_FILE}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        if own_copy:
            _clone_or_copy(src, tmp)
        else:
            try:
                os.link(src, tmp)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                shutil.copyfile(src, tmp)  # streamed in chunks, never whole in memory
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    return dst


_FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)


def _clone_or_copy(src: Path, dst: Path) -> None:
    """DST as a reflink of SRC where the filesystem supports it, else a streamed copy (copy_file_range
    in the kernel where it can)."""
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        try:
            import fcntl

            fcntl.ioctl(fout.fileno(), _FICLONE, fin.fileno())
            return
        except (ImportError, OSError):  # EOPNOTSUPP, EXDEV, EINVAL...: no reflink here, copy
            pass
    shutil.copyfile(src, dst)

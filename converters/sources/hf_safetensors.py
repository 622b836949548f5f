"""An HF model dir: config.json and *.safetensors (single or sharded with model.safetensors.index.json)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

from converters.registry import TensorInfo
from converters.sources.source import _torch_dtype_name, safetensors_header
from converters.sources.tokenizer_files import checked_tokenizer_files
from engine_builder.util.errors import InputError
from engine_builder.util.input_files import MAX_CONFIG_BYTES, MAX_INDEX_BYTES, read_json_object


class HFSafetensorsSource:
    kind = "hf-safetensors"

    def __init__(self, root: Path):
        self.root = root
        config_path = root / "config.json"
        if not config_path.is_file():
            raise InputError(f"{root} has no config.json; pass the dir that holds config.json and *.safetensors")
        self.hf_config = read_json_object(config_path, MAX_CONFIG_BYTES,
                                          "restore the model's own config.json (re-download it)")
        # checked now: convert copies them as they are, and run would be the first to load them
        self._tokenizer_files = checked_tokenizer_files(root)
        self._shards = self._find_shards()
        # name -> (shard, absolute byte offset, byte count); headers only, no tensor data read
        self._ranges: dict[str, tuple[Path, int, int]] = {}
        self._infos: dict[str, TensorInfo] = {}
        for shard in self._shards:
            header_len, header = safetensors_header(shard)
            for name, meta in header.items():
                if name == "__metadata__":
                    continue
                start, end = meta["data_offsets"]
                self._ranges[name] = (shard, 8 + header_len + start, end - start)
                self._infos[name] = TensorInfo(tuple(meta["shape"]), _torch_dtype_name(meta["dtype"]))

    def _find_shards(self) -> list[Path]:
        index = self.root / "model.safetensors.index.json"
        if index.is_file():
            fix = "restore the model's own index (re-download it)"
            weight_map = read_json_object(index, MAX_INDEX_BYTES, fix).get("weight_map")
            if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
                raise InputError(f"{index} is not a valid safetensors index (no \"weight_map\" of tensor name -> "
                                 f"file name); {fix}")
            shards = sorted({self.root / f for f in weight_map.values()})
            if missing := [s.name for s in shards if not s.is_file()]:
                raise InputError(f"{index} names missing shard(s) {', '.join(missing)}; re-download them")
            return shards
        shards = sorted(self.root.glob("*.safetensors"))
        if shards:
            return shards
        pickles = sorted(p.name for p in self.root.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
        if pickles:
            raise InputError(
                f"{self.root} holds only pickle checkpoints ({', '.join(pickles[:2])}), which trtbuild "
                f"never unpickles; re-save as safetensors: "
                f"AutoModelForCausalLM.from_pretrained(dir).save_pretrained(dir2, safe_serialization=True)")
        raise InputError(f"{self.root} has no *.safetensors files; pass an HF model dir with weights")

    def tensor_infos(self) -> dict[str, TensorInfo]:
        return self._infos

    def load(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        # A fresh mapping per tensor: get_tensor copies out of the mapping, and closing it
        # drops the mapped pages from our RSS, so peak memory stays near one tensor.
        with safe_open(self._ranges[name][0], framework="pt") as f:
            return f.get_tensor(name)

    def raw_range(self, name: str) -> tuple[Path, int, int] | None:
        return self._ranges[name]

    def files(self) -> list[Path]:
        return [self.root / "config.json", *self._shards]

    def write_tokenizer(self, out_dir: Path) -> list[str]:
        for name in self._tokenizer_files:
            (out_dir / name).write_bytes((self.root / name).read_bytes())
        return list(self._tokenizer_files)

"""`convert --tp N --pp M`: split a converted checkpoint's rank0.safetensors into one file per rank.

The rules (which rows / columns each rank keeps) are formats/parallel_mapping.py's; this module only
slices tensors by them. It runs on the finished float checkpoint inside convert's temp dir, so an
interrupted convert still leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from engine_builder.formats.checkpoint import CONFIG_FILE, WEIGHTS_FILE, CheckpointConfig, expected_shapes, weights_file
from engine_builder.formats.model_config import ModelConfig
from engine_builder.formats.parallel_mapping import ParallelMapping


def rank_shapes(cfg: ModelConfig, mapping: ParallelMapping, rank: int) -> dict[str, tuple[int, ...]]:
    """What rank{rank}.safetensors holds, name -> shape."""
    local = {name: shape for name, (shape, _) in expected_shapes(mapping.local_model(cfg)).items()}
    return mapping.rank_tensors(cfg, rank, local)


def shard_tensor(name: str, full: torch.Tensor, cfg: ModelConfig, mapping: ParallelMapping,
                 tp_rank: int) -> torch.Tensor:
    """Rank tp_rank's piece of tensor NAME (canonical name, checkpoint layout [out, in])."""
    tp, hd = mapping.tp, cfg.head_dim
    if name.endswith(("attn.qkv.weight", "attn.qkv.bias")):
        heads = cfg.num_heads // tp
        q = full[tp_rank * heads * hd:(tp_rank + 1) * heads * hd]
        kv_first, kv_count = mapping.first_kv_head(cfg, tp_rank), mapping.kv_heads(cfg)
        k_rows = slice(cfg.q_dim + kv_first * hd, cfg.q_dim + (kv_first + kv_count) * hd)
        v_rows = slice(cfg.q_dim + cfg.kv_dim + kv_first * hd, cfg.q_dim + cfg.kv_dim + (kv_first + kv_count) * hd)
        return torch.cat([q, full[k_rows], full[v_rows]])
    if name.endswith("attn.o.weight"):  # row-parallel: its heads' input columns
        cols = cfg.q_dim // tp
        return full[:, tp_rank * cols:(tp_rank + 1) * cols]
    if name.endswith(("mlp.gate_up.weight", "mlp.shared.gate_up.weight")):  # column-parallel: gate's slice, up's
        return _gate_up_slice(full, full.shape[0] // 2, tp, tp_rank)
    if name.endswith(("mlp.down.weight", "mlp.shared.down.weight")):  # row-parallel: its input columns
        part = full.shape[1] // tp
        return full[:, tp_rank * part:(tp_rank + 1) * part]
    if name.endswith("mlp.experts.gate_up.weight"):  # [E * 2I, H]: each expert's gate/up, as above
        experts = cfg.block.mlp.num_experts
        return torch.cat([_gate_up_slice(e, cfg.intermediate_size, tp, tp_rank) for e in full.chunk(experts)])
    if name.endswith("mlp.experts.down.weight"):  # [E * H, I]: each expert's input columns
        part = cfg.intermediate_size // tp
        return full[:, tp_rank * part:(tp_rank + 1) * part]
    if name in ("embed.weight", "lm_head.weight"):  # vocab-parallel rows
        rows = cfg.vocab_size // tp
        return full[tp_rank * rows:(tp_rank + 1) * rows]
    return full  # norms, an MoE's router and shared-expert gate: replicated


def _gate_up_slice(full: torch.Tensor, inter: int, tp: int, tp_rank: int) -> torch.Tensor:
    """Rows [gate; up] of width INTER each -> this rank's inter/tp rows of gate, then of up."""
    part = inter // tp
    gate, up = full[:inter], full[inter:]
    return torch.cat([gate[tp_rank * part:(tp_rank + 1) * part], up[tp_rank * part:(tp_rank + 1) * part]])


def shard_checkpoint(ckpt_dir: Path, mapping: ParallelMapping) -> None:
    """Rewrite checkpoint dir CKPT_DIR (a float checkpoint) as rank{i}.safetensors + the mapping in config.json."""
    ckpt_dir = Path(ckpt_dir)
    config = CheckpointConfig.load(ckpt_dir)
    cfg = config.model
    full_path = ckpt_dir / WEIGHTS_FILE
    staged = ckpt_dir / ".full.safetensors"
    full_path.rename(staged)  # rank0.safetensors becomes rank 0's shard
    counts = []
    with safe_open(str(staged), framework="pt") as full:
        for rank in range(mapping.world_size):
            shapes = rank_shapes(cfg, mapping, rank)
            tensors = {}
            for name, shape in shapes.items():
                piece = shard_tensor(name, full.get_tensor(name), cfg, mapping, mapping.tp_rank(rank))
                assert tuple(piece.shape) == shape, (name, tuple(piece.shape), shape)  # the rules above vs the contract
                tensors[name] = piece.contiguous()
            save_file(tensors, str(ckpt_dir / weights_file(rank)), metadata={"format": "pt"})
            counts.append(len(tensors))
    staged.unlink()
    config = dataclasses.replace(config, mapping=mapping, num_tensors=counts[0])
    (ckpt_dir / CONFIG_FILE).write_text(config.to_json())

"""The memory an engine's config implies, weighed against this machine before anything is allocated.

A model config and engine limits fix what building and running an engine holds in memory: the
weights (from the model dims), the KV cache (`KVCacheLayout.bytes_per_token` x max_batch x
max_seq_len) and, roughly, the activations of the largest prefill (max_batch x max_input_len tokens
attending over max_seq_len positions). `check_engine_memory` refuses a plan over this machine's RAM
(or TRTBUILD_MEMORY_GB, to plan for a larger one) in one line with the figures, so an absurd
`--set limits.max_seq_len=1000000000` fails in milliseconds instead of after tens of GB of allocation.
`trtbuild build` and the backends that hold the engine in this machine's RAM call it (EngineDir.check_host_memory:
the onnxruntime twin, its tp/pp ranks, the torch backend on a CPU; one on a GPU keeps its KV in device memory);
`ModelConfig.validate` bounds the dims themselves (what `convert`, which streams tensors, relies on).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from engine_builder.formats.build_config import Limits
from engine_builder.formats.checkpoint import expected_shapes, linear_prefixes
from engine_builder.formats.graph_io import KV_ITEM_BYTES, KVCacheLayout
from engine_builder.formats.model_config import ModelConfig
from engine_builder.util import environment
from engine_builder.util.errors import ConfigError

MEMORY_ENV = "TRTBUILD_MEMORY_GB"  # overrides the RAM found here: plan for the machine that will run the engine
GB = 1e9


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes, each figure rounded up rather than down."""

    weights: int
    kv_cache: int
    activations: int
    kv_bytes_per_token: int
    limits: Limits

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.activations

    def describe(self) -> str:
        lim = self.limits
        return (f"{self.total / GB:.1f} GB (weights {self.weights / GB:.1f} GB, KV cache {self.kv_cache / GB:.1f} GB "
                f"= {self.kv_bytes_per_token} bytes/token x max_batch {lim.max_batch} x max_seq_len "
                f"{lim.max_seq_len}, activations ~{self.activations / GB:.1f} GB)")


def parameter_counts(model: ModelConfig) -> tuple[int, int]:
    """(parameters in linears, other parameters) of MODEL: the checkpoint's own tensors (checkpoint.py)."""
    linears = {prefix + ".weight" for prefix in linear_prefixes(model)}
    counts = [0, 0]
    for name, (shape, _) in expected_shapes(model).items():
        counts[name not in linears] += math.prod(shape)
    return counts[0], counts[1]


def plan_engine(model: ModelConfig, limits: Limits, dtype: str, kv_cache: str = "none",
                weight_bits: int | None = None) -> MemoryPlan:
    """What an engine of MODEL with LIMITS holds while it runs: weights in DTYPE (linears in WEIGHT_BITS
    when quantized), its KV cache, and the activations of one full prefill."""
    model.validate()
    limits.validate()
    item = KV_ITEM_BYTES.get(dtype, 4)  # activations and float weights: the graph dtype's width
    linear, other = parameter_counts(model)
    weights = -(-linear * weight_bits // 8) if weight_bits else linear * item
    weights += other * item
    layout = KVCacheLayout.of(model, limits.max_seq_len, dtype, kv_cache)
    kv = layout.bytes_per_token * limits.max_batch * limits.max_seq_len
    tokens = limits.max_batch * limits.max_input_len
    # an MoE prefill runs every expert on every token (network/moe.py's dense form)
    experts = model.block.mlp.num_experts if model.block.mlp.kind == "moe" else 1
    per_token = 4 * model.hidden_size + model.q_dim + 2 * model.kv_dim + 2 * model.intermediate_size * experts
    activations = (tokens * per_token * item
                   + limits.max_batch * (model.num_heads + 1) * limits.max_input_len * limits.max_seq_len * item
                   + limits.max_batch * model.vocab_size * 4  # float32 logits of the last positions
                   + 2 * limits.max_seq_len * model.head_dim * 4)  # rotary tables
    return MemoryPlan(weights, kv, activations, layout.bytes_per_token, limits)


def machine_memory() -> tuple[int, str]:
    """(bytes, where the figure comes from): TRTBUILD_MEMORY_GB, else the smaller of RAM and a cgroup limit."""
    given = environment.read(MEMORY_ENV)
    if given:
        try:
            value = float(given)
        except ValueError:
            value = -1.0
        if not value > 0 or value == float("inf"):
            raise ConfigError(f"{MEMORY_ENV}={given!r} is not a positive number of GB; unset it or pass e.g. 64")
        return int(value * GB), f"{MEMORY_ENV}={given}"
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit() and int(limit) < ram:
            return int(limit), "this container's memory limit"
    except OSError:
        pass
    return ram, "this machine's RAM"


def check_engine_memory(model: ModelConfig, limits: Limits, dtype: str, kv_cache: str = "none",
                        weight_bits: int | None = None, what: str = "the engine") -> MemoryPlan:
    """The plan of `plan_engine`, or a ConfigError naming its figures when it exceeds this machine."""
    plan = plan_engine(model, limits, dtype, kv_cache, weight_bits)
    budget, source = machine_memory()
    if plan.total > budget:
        raise ConfigError(f"{what} needs about {plan.describe()}, more than {source} ({budget / GB:.1f} GB); lower "
                          f"limits.max_seq_len / max_batch / max_input_len, or set {MEMORY_ENV} to plan for the "
                          f"machine that will run it")
    return plan

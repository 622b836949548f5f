"""fuse_qkv: the q, k and v projections of a layer become one MatMul and a Split."""

from __future__ import annotations

from passes.base import register_pass
from passes.parallel_matmul import ParallelMatMulPass


@register_pass
class FuseQKV(ParallelMatMulPass):
    name = "fuse_qkv"
    description = "three MatMuls sharing an input (q/k/v) -> one MatMul + Split"
    fan_out = 3
    what = "qkv"

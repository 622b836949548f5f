"""Graph rewrite passes. Importing this package registers every pass (file name == pass name)."""

from passes import (  # noqa: F401
    drop_ort_attention_fallback,
    eliminate_dead_code,
    fold_constants,
    fuse_attention,
    fuse_attention_softcap,
    fuse_gate_up,
    fuse_kv_cache_update,
    fuse_qkv,
    fuse_rms_norm,
    fuse_rotary,
    lower_ort_attention,
    lower_ort_matmul_transb,
    lower_ort_matmulnbits,
    lower_ort_matmulnbits_draft,
    lower_ort_matmulnbits_exact,
    lower_ort_moe,
    lower_ort_norms,
    lower_ort_paged_attention,
    remove_redundant_ops,
)
from passes.base import Pass, PassManager, PassResult, get_pass, register_pass, registered_passes

__all__ = ["Pass", "PassManager", "PassResult", "get_pass", "register_pass", "registered_passes"]

"""The model for steps of few tokens (decode, speculative verify, a short prefill): each layer as six Triton
launches, where the compiled layer is ~10 at batch 1 by the last profile's kernel names (decode_linear_triton.py
says which).

    [add + norm + qkv]  rotary + KV write  attention  [o]  [add + norm + gate_up + silu * up]  [down]

and the head as one more ([add + final norm + lm_head]). The same deferred residual as the model's layer: a layer
takes the stream and the last layer's branch and returns its own pair (model.py _decoder_layer).

Only the llama-shaped layer, which every model that decodes launch-bound on a GPU here has (SmolLM2, Llama 3,
Mistral, Qwen 2 and 3): RMSNorm without an offset, a sequential residual without sandwich norms, a dense gated
silu MLP, no final logit softcap, one rank (Qwen 3's q/k norms are the KV write's). `unsupported` names what a
model has beyond that; it then runs the compiled layer for every step, as before.
"""

from __future__ import annotations

import copy

import torch


def unsupported(model) -> str | None:
    """Why MODEL's layers cannot run as fused_layer, or None where they can."""
    cfg = model.cfg
    spec = cfg.block
    reasons = {
        "tensor parallel": model.tp is not None,
        f"{spec.norm.kind}": spec.norm.kind != "rms_norm",
        "a norm weight offset (gemma)": bool(spec.norm.weight_offset),
        f"the {spec.residual.layout} residual": spec.residual.layout != "sequential",
        "sandwich norms": spec.residual.post_attention_norm or spec.residual.post_mlp_norm,
        f"the {spec.mlp.kind} {spec.mlp.activation} MLP": spec.mlp.kind != "gated" or spec.mlp.activation != "silu",
        "a final logit softcap": bool(cfg.final_logit_softcap),
    }
    found = [what for what, present in reasons.items() if present]
    return ", ".join(found) or None


def fused_layer(model, x: torch.Tensor, last: torch.Tensor, w, table, cos_sin, window: int | None,
                k_pool: torch.Tensor, v_pool: torch.Tensor, kv, image_ids: torch.Tensor | None = None):
    """model._decoder_layer's contract (x, last -> this layer's stream and branch) in six launches."""
    from engine_builder.runner.torch_backend.decode_linear_triton import decode_linear  # Triton: not for unsupported()

    eps = model.cfg.block.norm.eps
    qkv, x = decode_linear(x, w.attn.qkv, w.attn.qkv_bias, residual=last, norm_weight=w.attn_norm.weight, eps=eps)
    out = model._attend(qkv, w.attn, table, cos_sin, window, k_pool, v_pool, kv, image_ids)
    h, _ = decode_linear(out.flatten(-2), w.attn.o, w.attn.o_bias)
    act, x = decode_linear(x, w.mlp.up, w.mlp.up_bias, residual=h, norm_weight=w.mlp_norm.weight, eps=eps, gated=True)
    branch, _ = decode_linear(act, w.mlp.down, w.mlp.down_bias)
    return x, branch


def fused_logits(model, h: torch.Tensor, branch: torch.Tensor, logits_indices: torch.Tensor) -> torch.Tensor:
    """model._logits' contract: the last layer's pair [T, hidden] -> logits [N, vocab] float32."""
    from engine_builder.runner.torch_backend.decode_linear_triton import decode_linear

    logits, _ = decode_linear(h[logits_indices], model.lm_head, residual=branch[logits_indices],
                              norm_weight=model.final_norm.weight, eps=model.cfg.block.norm.eps)
    return logits.float()


class FusedDecode:
    """MODEL with its layers and head as fused_layer and fused_logits, for steps of at most
    decode_linear_triton.MAX_ROWS tokens; called as the model is. MODEL must be supported (unsupported() is None)."""

    def __init__(self, model) -> None:
        self.model = copy.copy(model)  # the same weight tensors; the model itself keeps its own layer
        self.model.kv_attention = None  # the model's kv_write and attention, one launch each

        def layer(*args, **kwargs):
            return fused_layer(self.model, *args, **kwargs)

        def logits(*args):
            return fused_logits(self.model, *args)

        self.model.decoder_layer, self.model.logits = layer, logits

    def __call__(self, *args, **kwargs) -> torch.Tensor:
        return self.model(*args, **kwargs)

"""Tiny llama GGUF files written in code (gguf.GGUFWriter), with the metadata transformers' GGUF
readers need, for the GGUF source and `convert --quant gguf` tests."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize

# 256 wide everywhere so that the 256-element K-quant / ternary blocks fit every matrix
HIDDEN, HEADS, KV_HEADS, FFN, VOCAB, LAYERS = 256, 4, 2, 512, 128, 2
HEAD_DIM = HIDDEN // HEADS


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute: what GGUFSource has to undo."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_weights(rng: np.random.Generator, ternary: bool) -> dict[str, np.ndarray]:
    """HF-named, HF-oriented float32 weights of an untied tiny llama."""
    shapes = {"model.embed_tokens.weight": (VOCAB, HIDDEN), "lm_head.weight": (VOCAB, HIDDEN),
              "model.norm.weight": (HIDDEN,)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (HIDDEN,), p + "post_attention_layernorm.weight": (HIDDEN,),
                   p + "self_attn.q_proj.weight": (HIDDEN, HIDDEN),
                   p + "self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
                   p + "self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
                   p + "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
                   p + "mlp.gate_proj.weight": (FFN, HIDDEN), p + "mlp.up_proj.weight": (FFN, HIDDEN),
                   p + "mlp.down_proj.weight": (HIDDEN, FFN)}
    out = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            out[name] = (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        elif ternary:  # TQ1_0/TQ2_0 only represent {-d, 0, d} per block
            out[name] = (0.5 * rng.integers(-1, 2, shape)).astype(np.float32)
        else:
            out[name] = rng.standard_normal(shape).astype(np.float32)
    return out


GGUF_NAME = {"model.embed_tokens.weight": "token_embd.weight", "lm_head.weight": "output.weight",
             "model.norm.weight": "output_norm.weight"} | {
    f"model.layers.{i}.{hf}.weight": f"blk.{i}.{g}.weight" for i in range(LAYERS) for hf, g in [
        ("input_layernorm", "attn_norm"), ("post_attention_layernorm", "ffn_norm"),
        ("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"), ("self_attn.v_proj", "attn_v"),
        ("self_attn.o_proj", "attn_output"), ("mlp.gate_proj", "ffn_gate"), ("mlp.up_proj", "ffn_up"),
        ("mlp.down_proj", "ffn_down")]}


def n_head_if_permuted(hf_name: str) -> int | None:
    return HEADS if "q_proj" in hf_name else KV_HEADS if "k_proj" in hf_name else None


def write_tiny_llama(path: Path, tensors: dict[str, tuple[np.ndarray, Q]], arch: str = "llama",
                     rope_scaling: gguf.RopeScalingType | None = None, tokenizer: bool = False) -> Path:
    """A GGUF with the llama.* metadata transformers' GGUF config reader needs; `tensors` maps
    GGUF name -> (stored array, as gguf.quants.quantize returns it, and its ggml type).

    tokenizer: add a word-level BPE vocabulary ("<unk>", "<s>", "</s>", "w3", ...; no merges), so
    `trtbuild convert` can write a tokenizer for the file."""
    w = gguf.GGUFWriter(path, arch)
    w.add_name("tiny test llama")
    w.add_block_count(LAYERS)
    w.add_context_length(512)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(VOCAB)  # with it, transformers' config reader needs no tokenizer.ggml.tokens
    if rope_scaling is not None:
        w.add_rope_scaling_type(rope_scaling)
        w.add_rope_scaling_factor(4.0)
    if tokenizer:
        w.add_tokenizer_model("gpt2")
        w.add_token_list(["<unk>", "<s>", "</s>", *(f"w{i}" for i in range(3, VOCAB))])
        w.add_token_types([gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL] * (VOCAB - 3))
        w.add_token_scores([0.0] * VOCAB)
        w.add_token_merges([])
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
    for name, (data, qtype) in tensors.items():
        w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tiny_gguf(path: Path, types: dict[str, Q], default: Q = Q.Q4_1, tied: bool = False) -> Path:
    """A tiny llama GGUF (with a tokenizer) whose 2-D tensors are stored as `types` says (by GGUF name,
    else `default`), from the same random weights every time, scaled by 1/sqrt(inputs) as a trained
    model's are, so activations and logits stay near 1 through the layers. tied: no output.weight (the
    head multiplies by token_embd, as SmolLM2's)."""
    stored = {}
    for hf, w in hf_weights(np.random.default_rng(11), ternary=False).items():
        if tied and hf == "lm_head.weight":
            continue
        w = w / np.sqrt(w.shape[1]) if w.ndim == 2 else w
        if (n_head := n_head_if_permuted(hf)) is not None:
            w = llama_cpp_permute(w, n_head)
        name = GGUF_NAME[hf]
        qtype = Q.F32 if w.ndim == 1 else types.get(name, default)
        if qtype == Q.Q4_K:  # gguf cannot quantize K-quants in numpy
            stored[name] = (random_q4_k(w.shape, np.random.default_rng(len(stored)), np.abs(w).mean()), qtype)
        else:
            stored[name] = (w if qtype == Q.F32 else quantize(w, qtype), qtype)
    return write_tiny_llama(path, stored, tokenizer=True)


def random_q4_k(shape: tuple[int, int], rng: np.random.Generator, magnitude: float) -> np.ndarray:
    """Valid Q4_K rows, uint8 [out, in/256 * 144], whose weights are about `magnitude`: fp16 d and dmin
    near magnitude / (63 * 7.5) (so that 6-bit scales and mins of up to 63 and codes of up to 15 give
    weights of that size), random scale/min bytes and codes."""
    out, inp = shape
    blocks = out * inp // 256
    d = (magnitude / (63 * 7.5) * rng.uniform(0.5, 1.5, (blocks, 2))).astype(np.float16)  # d, dmin
    raw = np.concatenate([d.view(np.uint8), rng.integers(0, 256, (blocks, 12 + 128), np.uint8)], axis=1)
    return raw.reshape(out, -1)

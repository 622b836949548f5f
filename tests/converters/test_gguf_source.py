"""GGUFSource against the references: transformers' GGUF loader and gguf's own dequantizer.

The real SmolLM2 GGUF pins names, shapes, Q/K un-permutation and the tokenizer to what
`from_pretrained(dir, gguf_file=...)` produces; tiny GGUFs written here cover every block
format the gguf package knows, and the bad-input cases.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize
from tiny_gguf import GGUF_NAME, HEAD_DIM, hf_weights, llama_cpp_permute, n_head_if_permuted, write_tiny_llama
from transformers import AutoModelForCausalLM, AutoTokenizer

from converters.sources.gguf import GGUFSource, _open_reader, _parsed_once
from engine_builder.util.errors import InputError, TrtbuildError, UnsupportedError

# ---------------------------------------------------------------- the real model


@pytest.fixture(scope="module")
def smollm2_source(smollm2_gguf: Path) -> GGUFSource:
    return GGUFSource(smollm2_gguf)


@pytest.fixture(scope="module")
def hf_reference_state(hf_smollm2) -> dict[str, torch.Tensor]:
    return hf_smollm2[0].state_dict()  # transformers' own GGUF loader, float32 (tests/conftest.py)


def test_smollm2_tensors_equal_transformers_gguf_loader(smollm2_source, hf_reference_state):
    infos = smollm2_source.tensor_infos()
    ref = hf_reference_state
    # SmolLM2 ties embeddings: the file has no output.weight, so we expose no lm_head
    assert smollm2_source.hf_config["tie_word_embeddings"] is True
    assert set(ref) - set(infos) == {"lm_head.weight"}
    assert set(infos) <= set(ref)
    assert len(infos) == 2 + 30 * 9  # embed, final norm, 9 tensors per layer
    for name, info in infos.items():
        got = smollm2_source.load(name)
        assert got.dtype == torch.float32 and info.dtype == "float32"
        assert tuple(got.shape) == info.shape == tuple(ref[name].shape), name
        diff = (got - ref[name]).abs().max().item()
        assert diff <= 1e-6, f"{name}: max abs diff {diff}"


def test_smollm2_hf_config(smollm2_source):
    cfg = smollm2_source.hf_config
    assert cfg["model_type"] == "llama" and cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"],
            cfg["num_key_value_heads"], cfg["vocab_size"]) == (30, 576, 9, 3, 49152)
    assert cfg["dtype"] == "float32"
    json.dumps(cfg)  # config.json-ready: plain JSON values only
    assert smollm2_source.files() == [smollm2_source.path]
    assert smollm2_source.kind == "gguf"


def test_our_reader_parses_what_gguf_s_own_reader_does(smollm2_gguf):
    """The reader slicing a plain view of the memmap (`trtbuild plan`'s speed) sees the same file."""
    ours, stock = _open_reader(smollm2_gguf), gguf.GGUFReader(smollm2_gguf)
    assert isinstance(ours, gguf.GGUFReader) and isinstance(ours.data, np.memmap)
    assert list(ours.fields) == list(stock.fields)
    for key, field in stock.fields.items():
        mine = ours.fields[key]
        assert (mine.offset, mine.types, mine.data, len(mine.parts)) == (
            field.offset, field.types, field.data, len(field.parts)), key
        for a, b in zip(mine.parts, field.parts):
            assert a.dtype == b.dtype and np.array_equal(a, b), key
    assert ours.data_offset == stock.data_offset and len(ours.tensors) == len(stock.tensors)
    for a, b in zip(ours.tensors, stock.tensors):
        assert (a.name, a.tensor_type, a.data_offset, a.n_bytes) == (b.name, b.tensor_type, b.data_offset, b.n_bytes)
        assert np.array_equal(a.shape, b.shape) and np.array_equal(a.data, b.data), a.name


def test_the_file_is_parsed_once_and_configured_as_transformers_does(tmp_path, monkeypatch):
    """transformers' config reader is handed our parse instead of opening the file again (it re-parsed every
    vocab entry and merge: 3.5 s of `trtbuild plan` on SmolLM2); the config is the one it derives on its own."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    stored = {GGUF_NAME[hf]: (w, Q.F32) for hf, w in hf_weights(np.random.default_rng(0), False).items()}
    path = write_tiny_llama(tmp_path / "tiny.gguf", stored, tokenizer=True)
    reference = load_gguf_checkpoint(str(path), return_tensors=False)["config"]
    other = write_tiny_llama(tmp_path / "other.gguf", stored)
    parses = []
    stock_init = gguf.GGUFReader.__init__

    def counting_init(self, path, *args, **kwargs):
        parses.append(Path(path).name)
        stock_init(self, path, *args, **kwargs)

    monkeypatch.setattr(gguf.GGUFReader, "__init__", counting_init)
    source = GGUFSource(path)
    assert parses == ["tiny.gguf"] and source._raw_config == reference
    assert gguf.GGUFReader.__name__ == "GGUFReader"  # given back once the config is read
    with _parsed_once(path, "our parse"):  # only that file's: another path still gets a reader of its own
        assert gguf.GGUFReader(path) == "our parse" and isinstance(gguf.GGUFReader(other), gguf.gguf_reader.GGUFReader)


SAMPLES = [
    "The capital of France is Paris.",
    "Où est la bibliothèque ? Élève, garçon, naïve, façade.",
    "Grüße aus München! Die Straße ist schön, äöü ÄÖÜ ß.",
    "机器学习是人工智能的一个分支。",
    "東京は日本の首都です。カタカナとひらがな。",
    "مرحبا بالعالم، كيف حالك؟",
    "Emoji: 😀🚀👩‍💻🇫🇷 ✓ — “quotes” …",
    "def f(x):\n    if x:\n        return x  # comment\n\treturn None\n\n\n   trailing   ",
    "  leading spaces and <|im_start|> a special token in text <|im_end|>",
]


@pytest.fixture(scope="module")
def tokenizers_pair(smollm2_source, smollm2_gguf, module_tmp_factory):
    out = module_tmp_factory.mktemp("tok")
    written = smollm2_source.write_tokenizer(out)
    ours = AutoTokenizer.from_pretrained(out)
    ref = AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)
    return out, written, ours, ref


def test_tokenizer_ids_and_roundtrip_match_gguf_reference(tokenizers_pair):
    _, _, ours, ref = tokenizers_pair
    for text in SAMPLES:
        ids = ours(text)["input_ids"]
        assert ids == ref(text)["input_ids"], text
        assert ours.decode(ids) == text
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id) == (
        ref.bos_token_id, ref.eos_token_id, ref.pad_token_id)
    # byte-level BPE: no unknown pieces for any of the scripts above
    assert ours.unk_token_id not in ours("".join(SAMPLES))["input_ids"]


def test_chat_template_survives_save(tokenizers_pair, smollm2_gguf):
    out, _, ours, ref = tokenizers_pair
    template = gguf.GGUFReader(smollm2_gguf).fields["tokenizer.chat_template"].contents()
    assert ours.chat_template == template
    messages = [{"role": "system", "content": "Tu es un assistant."},
                {"role": "user", "content": "Quelle est la capitale de la France ?"},
                {"role": "assistant", "content": "Paris."},
                {"role": "user", "content": "Und von Deutschland? 🇩🇪"}]
    for msgs in (messages, messages[1:2]):
        text = ours.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        assert text == ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        assert text.endswith("<|im_start|>assistant\n")
        assert ours(text)["input_ids"] == ref(text)["input_ids"]


def test_written_tokenizer_files(tokenizers_pair, smollm2_gguf):
    out, written, _, _ = tokenizers_pair
    assert written == sorted(os.listdir(out))
    assert {"tokenizer.json", "tokenizer_config.json", "generation_config.json"} <= set(written)
    reader = gguf.GGUFReader(smollm2_gguf)
    meta = {k: reader.fields[f"tokenizer.ggml.{k}"].contents()
            for k in ("bos_token_id", "eos_token_id", "padding_token_id")}
    gen = json.loads((out / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"], gen["pad_token_id"]) == (
        meta["bos_token_id"], meta["eos_token_id"], meta["padding_token_id"]) == (1, 2, 2)
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    assert "is_local" not in tok_config and tok_config["model_max_length"] == 8192


# ---------------------------------------------------------------- tiny GGUFs, every block format

def _supports(op, qtype: Q) -> bool:
    try:
        op(np.zeros((1, 256), np.float32) if op is quantize else np.zeros((1, GGML_QUANT_SIZES[qtype][1]),
                                                                           np.uint8), qtype)
        return True
    except NotImplementedError:
        return False


# max |dequant - original| / max |original| per type; generous but each far below "not decoded"
QUANTIZABLE_TOLERANCE = {Q.F32: 0.0, Q.F16: 1e-3, Q.BF16: 1e-2, Q.Q8_0: 0.01, Q.Q5_1: 0.05, Q.Q5_0: 0.06,
                         Q.Q4_1: 0.1, Q.Q4_0: 0.12, Q.MXFP4: 0.35, Q.TQ1_0: 0.01, Q.TQ2_0: 0.01}
DEQUANT_ONLY = sorted((q for q in Q if q not in QUANTIZABLE_TOLERANCE and _supports(dequantize, q)),
                      key=lambda q: q.value)


def test_gguf_package_still_quantizes_the_types_we_test():
    assert all(_supports(quantize, q) for q in QUANTIZABLE_TOLERANCE)
    assert {Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K} <= set(DEQUANT_ONLY)


@pytest.mark.parametrize("qtype", list(QUANTIZABLE_TOLERANCE), ids=lambda q: q.name)
def test_quantized_tensors_dequantize_like_gguf(qtype: Q, tmp_path):
    originals = hf_weights(np.random.default_rng(qtype.value), ternary=qtype in (Q.TQ1_0, Q.TQ2_0))
    stored: dict[str, tuple[np.ndarray, Q]] = {}
    for hf, w in originals.items():
        if (n_head := n_head_if_permuted(hf)) is not None:
            w = llama_cpp_permute(w, n_head)
        # llama.cpp keeps 1-D norms in F32 whatever the file type
        stored[GGUF_NAME[hf]] = (w, Q.F32) if w.ndim == 1 else (quantize(w, qtype), qtype)
    source = GGUFSource(write_tiny_llama(tmp_path / f"tiny-{qtype.name}.gguf", stored))

    assert set(source.tensor_infos()) == set(originals)  # untied: lm_head.weight is exposed
    tol = QUANTIZABLE_TOLERANCE[qtype]
    for hf, original in originals.items():
        got = source.load(hf)
        assert got.dtype == torch.float32 and tuple(got.shape) == original.shape == source.tensor_infos()[hf].shape
        data, stored_type = stored[GGUF_NAME[hf]]
        expected = dequantize(data, stored_type)
        n_head = n_head_if_permuted(hf)
        on_disk_order = llama_cpp_permute(got.numpy(), n_head) if n_head else got.numpy()
        np.testing.assert_array_equal(on_disk_order, expected, err_msg=hf)
        err = np.abs(got.numpy() - original).max() / np.abs(original).max()
        assert err <= (tol if stored_type == qtype else 0.0), f"{hf}: relative error {err:.4f}"


@pytest.mark.parametrize("qtype", DEQUANT_ONLY, ids=lambda q: q.name)
def test_dequant_only_block_formats(qtype: Q, tmp_path):
    """K-quants, i-quants, NVFP4: gguf cannot quantize them in numpy, so store valid-shaped
    random blocks. Every byte is masked with 0x3B, which keeps each fp16/fp8 scale finite."""
    rng = np.random.default_rng(qtype.value)
    stored: dict[str, tuple[np.ndarray, Q]] = {}
    for hf, w in hf_weights(rng, ternary=False).items():
        if w.ndim == 1:
            stored[GGUF_NAME[hf]] = (w, Q.F32)
            continue
        row_bytes = w.shape[1] // GGML_QUANT_SIZES[qtype][0] * GGML_QUANT_SIZES[qtype][1]
        stored[GGUF_NAME[hf]] = (rng.integers(0, 256, (w.shape[0], row_bytes), np.uint8) & 0x3B, qtype)
    source = GGUFSource(write_tiny_llama(tmp_path / f"tiny-{qtype.name}.gguf", stored))
    for hf in hf_weights(rng, ternary=False):
        got = source.load(hf).numpy()
        data, stored_type = stored[GGUF_NAME[hf]]
        n_head = n_head_if_permuted(hf)
        expected = dequantize(data, stored_type)
        assert np.isfinite(expected).all() and np.abs(expected).max() > 0
        np.testing.assert_array_equal(llama_cpp_permute(got, n_head) if n_head else got, expected, err_msg=hf)


def test_tiny_untied_gqa_model_matches_transformers(tmp_path):
    """Cross-check names (incl. lm_head) and the K un-permutation with 2 KV heads against HF."""
    originals = hf_weights(np.random.default_rng(7), ternary=False)
    stored = {GGUF_NAME[hf]: (quantize(llama_cpp_permute(w, n) if (n := n_head_if_permuted(hf)) else w,
                                       Q.Q8_0 if w.ndim == 2 else Q.F32), Q.Q8_0 if w.ndim == 2 else Q.F32)
              for hf, w in originals.items()}
    path = write_tiny_llama(tmp_path / "tiny.gguf", stored)
    source = GGUFSource(path)
    assert source.hf_config["tie_word_embeddings"] is False
    ref = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32).state_dict()
    assert set(ref) == set(source.tensor_infos())
    for name in ref:
        assert torch.equal(source.load(name), ref[name]), name


# ---------------------------------------------------------------- bad input


def _assert_one_line(exc: TrtbuildError, *needles: str) -> None:
    msg = str(exc)
    assert "\n" not in msg and all(n in msg for n in needles), msg


def test_random_bytes(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(np.random.default_rng(0).bytes(1 << 16))
    with pytest.raises(InputError) as e:
        GGUFSource(bad)
    _assert_one_line(e.value, str(bad), "is not a GGUF file", "re-download")


def test_gguf_magic_then_garbage(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + np.random.default_rng(1).bytes(4096))
    with pytest.raises(InputError) as e:
        GGUFSource(bad)
    _assert_one_line(e.value, str(bad), "is truncated or corrupt")


def test_empty_file(tmp_path):
    (tmp_path / "empty.gguf").touch()
    with pytest.raises(InputError) as e:
        GGUFSource(tmp_path / "empty.gguf")
    _assert_one_line(e.value, "empty.gguf")


def test_truncated_real_file(smollm2_gguf, tmp_path):
    cut = tmp_path / "half.gguf"
    with open(smollm2_gguf, "rb") as f:
        cut.write_bytes(f.read(smollm2_gguf.stat().st_size // 2))
    with pytest.raises(InputError) as e:
        GGUFSource(cut)
    _assert_one_line(e.value, str(cut), "is truncated or corrupt", "re-download")


def test_missing_path(tmp_path):
    with pytest.raises(InputError) as e:
        GGUFSource(tmp_path / "nope.gguf")
    _assert_one_line(e.value, "nope.gguf", "does not exist")


@pytest.mark.parametrize("gguf_arch", ["mamba", "qwen35", "bert"])
def test_unsupported_architecture(gguf_arch, tmp_path):
    tensors = {"token_embd.weight": (np.zeros((8, 32), np.float32), Q.F32)}
    path = write_tiny_llama(tmp_path / f"{gguf_arch}.gguf", tensors, arch=gguf_arch)
    with pytest.raises(UnsupportedError) as e:
        GGUFSource(path)
    _assert_one_line(e.value, repr(gguf_arch), "llama")


def test_rope_table_is_refused_not_dropped(tmp_path):
    """llama 3.1-style rope scaling lives in rope_freqs.weight; transformers' config loses it."""
    stored = {GGUF_NAME[hf]: (w, Q.F32) for hf, w in hf_weights(np.random.default_rng(0), False).items()}
    stored["rope_freqs.weight"] = (np.ones(HEAD_DIM // 2, np.float32), Q.F32)
    with pytest.raises(UnsupportedError) as e:
        GGUFSource(write_tiny_llama(tmp_path / "rope.gguf", stored))
    _assert_one_line(e.value, "rope_freqs.weight")


@pytest.mark.parametrize("scaling", [gguf.RopeScalingType.LINEAR, gguf.RopeScalingType.YARN], ids=str)
def test_rope_scaling_metadata_is_refused_not_dropped(scaling, tmp_path):
    stored = {GGUF_NAME[hf]: (w, Q.F32) for hf, w in hf_weights(np.random.default_rng(0), False).items()}
    path = write_tiny_llama(tmp_path / "scaled.gguf", stored, rope_scaling=scaling)
    with pytest.raises(UnsupportedError) as e:
        GGUFSource(path)
    _assert_one_line(e.value, "scaled.gguf", repr(scaling.value))
    # and the same file without the key opens: the refusal is about the scaling alone
    assert GGUFSource(write_tiny_llama(tmp_path / "plain.gguf", stored)).hf_config["model_type"] == "llama"


def test_gguf_without_tokenizer_metadata(tmp_path):
    stored = {GGUF_NAME[hf]: (w, Q.F32) for hf, w in hf_weights(np.random.default_rng(0), False).items()}
    source = GGUFSource(write_tiny_llama(tmp_path / "notok.gguf", stored))
    with pytest.raises(UnsupportedError) as e:
        source.write_tokenizer(tmp_path / "out")
    _assert_one_line(e.value, "notok.gguf", "tokenizer")

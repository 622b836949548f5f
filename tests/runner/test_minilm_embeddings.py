"""The real all-MiniLM-L6-v2 against sentence-transformers: float32 cosine >= 0.9999 on every text of a
varied set (short, long past the 256-token truncation, accents, CJK, emoji, code, numbers), int8
weight-only >= 0.99; `trtbuild run --embed`; Embeddings(engine_dir), the entry point of its own, and LLM
over it; and the one-line refusals between encoders and decoders."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from cli_process import assert_user_error, trtbuild
from runner_engines import add_word_tokenizer, build_engine

from converters.convert import convert
from engine_builder import LLM, Embeddings
from engine_builder.build.pipeline import build
from engine_builder.formats.build_config import BuildConfig, Limits
from engine_builder.runner.backend_choice import open_backend
from engine_builder.runner.embedder import Embedder
from engine_builder.runner.engine import EngineDir
from engine_builder.util.errors import InputError, UnsupportedError

TEXTS = [
    "Hi",
    "The cat sits outside.",
    "A man is playing guitar.",
    "What is the capital of France? Paris is the capital and most populous city of France.",
    "Café, naïve, résumé and jalapeño keep their accents.",
    "東京は日本の首都です。",
    "I love this! 😀🎉 Best day ever!!!",
    "def embed(texts): return model.encode(texts, normalize_embeddings=True)",
    "In 2024, revenue rose 12.5% to $3,400,000 (up from $3.02M).",
    "SHOUTING IN ALL CAPITALS IS STILL A SENTENCE",
    "   leading and trailing   spaces   ",
    "?!",
    " ".join(["Long inputs are cut to the model's max_seq_length of 256 tokens, as sentence-transformers does."] * 30),
    "Quantum entanglement links the states of two particles regardless of the distance between them.",
]


@pytest.fixture(scope="module")
def sentence_transformer(minilm_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir), device="cpu")


@pytest.fixture(scope="module")
def minilm(minilm_engine):
    with LLM(minilm_engine) as llm:
        yield llm


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_float32_matches_sentence_transformers_on_every_text(minilm, sentence_transformer):
    ours = minilm.embed(TEXTS)
    theirs = sentence_transformer.encode(TEXTS, batch_size=32)
    assert ours.shape == theirs.shape == (len(TEXTS), 384) and ours.dtype == np.float32
    cos = cosines(ours, theirs)
    assert cos.min() >= 0.9999, dict(zip(TEXTS, cos))
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, rtol=1e-5)  # the Normalize module
    assert len(minilm.tokenizer(TEXTS[-2]).input_ids) > 256  # the long text really was truncated


def test_int8_weight_only_stays_above_0_99(minilm_dir, sentence_transformer, tmp_path):
    convert(minilm_dir, tmp_path / "ckpt", quant="int8_wo")
    build(tmp_path / "ckpt", tmp_path / "engine", BuildConfig(targets=("onnxruntime",), dtype="float32",
                                                              limits=Limits(32, 256, 256)))
    with LLM(tmp_path / "engine") as llm:
        ours = llm.embed(TEXTS)
    cos = cosines(ours, sentence_transformer.encode(TEXTS, batch_size=32))
    print(f"MiniLM int8_wo cosine vs sentence-transformers: min {cos.min():.5f}, mean {cos.mean():.5f}")
    assert cos.min() >= 0.99, dict(zip(TEXTS, cos))
    assert cos.min() < 0.99999  # the weights really are int8: not the float vectors


def test_single_string_and_order(minilm):
    batch = minilm.embed(TEXTS[:4])
    np.testing.assert_allclose(minilm.embed(TEXTS[2]), batch[2], atol=1e-5)  # alone or padded in a batch
    np.testing.assert_allclose(minilm.embed(TEXTS[:4][::-1]), batch[::-1], atol=1e-5)
    with pytest.raises(InputError, match="empty"):
        minilm.embed(["fine", ""])
    with pytest.raises(InputError, match="strings"):
        minilm.embed([1, 2])


def test_run_embed_prints_the_vectors(minilm, minilm_engine):
    proc = trtbuild("run", minilm_engine, "--embed", "Hi", "--embed", TEXTS[5], "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.strip().splitlines()]
    assert len(lines) == 2 and [line["dimensions"] for line in lines] == [384, 384]
    assert lines[0]["tokens"] == 3  # [CLS] hi [SEP]
    np.testing.assert_allclose(np.array([line["embedding"] for line in lines]), minilm.embed(["Hi", TEXTS[5]]),
                               atol=1e-6)


def test_tensorrt_backend_is_refused_with_the_reason(minilm):
    with pytest.raises(UnsupportedError, match="onnxruntime twin"):
        Embedder(minilm.engine, minilm.tokenizer, backend="tensorrt")


@pytest.fixture(scope="module")
def decoder_engine(tiny_model_dir, module_tmp_factory):
    root = module_tmp_factory.mktemp("tiny-decoder")
    shutil.copytree(tiny_model_dir("llama"), root / "hf")
    add_word_tokenizer(root / "hf", 320)
    convert(root / "hf", root / "ckpt", dtype="float32")
    return build_engine(root / "ckpt", root / "engine", Limits(2, 32, 64))


def test_encoders_and_decoders_refuse_each_others_work(decoder_engine, minilm_engine, minilm):
    assert_user_error(trtbuild("run", decoder_engine, "--embed", "w5 w6", timeout=300), "text-generation",
                      "encoder engine")
    with pytest.raises(InputError, match="encoder .* engine: .* run --embed"):
        minilm.stream("Hello")  # what `trtbuild run --prompt` calls
    with LLM(decoder_engine) as llm, pytest.raises(InputError, match="text-generation .* encoder engine"):
        llm.embed("w5 w6")
    with pytest.raises(InputError, match="encoder .* engine: it computes embeddings"):  # eval, bench: a decoder's
        open_backend(EngineDir.load(minilm_engine))


def test_embeddings_entry_point_matches_sentence_transformers(minilm_engine, sentence_transformer):
    with Embeddings(minilm_engine, threads=2) as model:
        assert (model.dimensions, model.max_tokens, model.max_batch) == (384, 256, 32)
        assert model.backend_name == "onnxruntime" and "onnxruntime twin" in model.backend_reason
        ours = model.embed(TEXTS)
        one = model.embed(TEXTS[3])  # one string -> one vector
    theirs = sentence_transformer.encode(TEXTS, batch_size=32)
    assert ours.shape == theirs.shape == (len(TEXTS), 384) and ours.dtype == np.float32
    cos = cosines(ours, theirs)
    assert cos.min() >= 0.9999, dict(zip(TEXTS, cos))
    assert one.shape == (384,) and float(one @ theirs[3]) / np.linalg.norm(theirs[3]) >= 0.9999


def test_llm_over_an_encoder_holds_the_entry_point(minilm, minilm_engine):
    assert isinstance(minilm.embeddings, Embeddings) and minilm.embeddings.engine is minilm.engine
    assert minilm.tokenizer is minilm.embeddings.tokenizer
    assert (minilm.backend_name, minilm.backend_reason) == ("onnxruntime", minilm.embeddings.backend_reason)
    with Embeddings(minilm_engine, verify=False) as model:
        np.testing.assert_array_equal(model.embed(TEXTS[:5]), minilm.embed(TEXTS[:5]))  # the same call
    assert minilm.last_timings is None and minilm.speculation is None
    refusal = "encoder .* engine: it computes embeddings, not text; use LLM.embed"
    for use in (lambda: minilm.generate(["Hello"]), lambda: minilm.chat([{"role": "user", "content": "Hi"}]),
                lambda: minilm.stream_chat([{"role": "user", "content": "Hi"}]), lambda: minilm.generator,
                lambda: minilm.backend):
        with pytest.raises(InputError, match=refusal) as caught:
            use()
        assert "\n" not in str(caught.value)


def test_embeddings_refuses_a_decoder_a_tensorrt_backend_and_a_changed_file(decoder_engine, minilm_engine, tmp_path):
    with pytest.raises(InputError, match="text-generation .* engine, not an encoder: embeddings need an encoder"):
        Embeddings(decoder_engine)
    with pytest.raises(UnsupportedError, match="onnxruntime twin"):
        Embeddings(minilm_engine, backend="tensorrt")
    changed = tmp_path / "minilm"
    shutil.copytree(minilm_engine, changed)
    weights = max((f for f in changed.iterdir() if f.is_file()), key=lambda f: f.stat().st_size)
    with weights.open("r+b") as f:  # one byte of the largest file, its size kept: only the sha256 tells
        f.seek(weights.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(InputError, match="changed after it was built"):
        Embeddings(changed)
    with Embeddings(changed, verify=False) as model:  # the trusted fast start skips the hashes
        assert model.embed("Hi").shape == (384,)

"""Tiny random BERT and RoBERTa encoders made in code: convert -> build (a real TensorRT-RTX engine and the
onnxruntime twin) -> pooled embeddings allclose to HF transformers' model + sentence-transformers' pooling
computed here, for every pooling mode; and the one-line errors of configs we cannot build."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from cli_process import assert_user_error, trtbuild
from runner_engines import add_word_tokenizer

from converters.convert import convert
from engine_builder import LLM, Embeddings
from engine_builder.build.pipeline import build
from engine_builder.formats.build_config import BuildConfig, Limits
from engine_builder.formats.checkpoint import CheckpointConfig

VOCAB = 120
DIMS = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=64)
# ragged on purpose: padding must change nothing
TOKEN_IDS = [[5, 17, 33, 8], [9, 40, 41, 42, 43, 44, 45, 46, 47, 48, 50, 51], [77], [3, 3, 3, 90, 91, 100, 119]]
FLAGS = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens", "max": "pooling_mode_max_tokens",
         "mean_sqrt_len": "pooling_mode_mean_sqrt_len_tokens", "lasttoken": "pooling_mode_lasttoken"}


def make_encoder(out: Path, kind: str, pooling: str | None, normalize: bool, act: str = "gelu") -> torch.nn.Module:
    """A random BertModel / RobertaModel saved as a sentence-transformers dir (modules.json, 1_Pooling)."""
    torch.manual_seed(0)
    if kind == "bert":
        model = transformers.BertModel(transformers.BertConfig(**DIMS, hidden_act=act, type_vocab_size=2))
    else:
        model = transformers.RobertaModel(transformers.RobertaConfig(**DIMS, hidden_act=act, type_vocab_size=1,
                                                                     pad_token_id=1))
    with torch.no_grad():  # random init leaves LayerNorms at 1 / 0: perturb them so a wrong norm shows
        for name, p in model.named_parameters():
            if "LayerNorm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.eval().save_pretrained(out)
    add_word_tokenizer(out, VOCAB)
    if pooling is not None:
        modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
        if normalize:
            modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                            "type": "sentence_transformers.models.Normalize"})
        (out / "modules.json").write_text(json.dumps(modules))
        (out / "1_Pooling").mkdir()
        (out / "1_Pooling" / "config.json").write_text(json.dumps(
            {"word_embedding_dimension": 32, **{flag: mode == pooling for mode, flag in FLAGS.items()}}))
    return model


def reference(model: torch.nn.Module, pooling: str, normalize: bool, token_ids=TOKEN_IDS) -> np.ndarray:
    """HF's token states of each text alone (no padding), pooled as sentence-transformers' Pooling does."""
    out = []
    for ids in token_ids:
        with torch.no_grad():
            states = model(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                           token_type_ids=torch.zeros(1, len(ids), dtype=torch.long)).last_hidden_state[0]
        pooled = {"cls": states[0], "lasttoken": states[-1], "max": states.max(0).values,
                  "mean": states.mean(0), "mean_sqrt_len": states.sum(0) / len(ids) ** 0.5}[pooling]
        out.append(torch.nn.functional.normalize(pooled, dim=0) if normalize else pooled)
    return torch.stack(out).numpy()


@pytest.mark.parametrize("kind, pooling, normalize, targets", [
    ("bert", "mean", True, ("onnxruntime", "tensorrt")),
    ("roberta", "cls", False, ("onnxruntime", "tensorrt")),
    ("bert", "max", False, ("onnxruntime",)),
    ("bert", "mean_sqrt_len", False, ("onnxruntime",)),
    ("roberta", "lasttoken", True, ("onnxruntime",)),
])
def test_encoder_embeddings_equal_hf(tmp_path, kind, pooling, normalize, targets):
    model = make_encoder(tmp_path / "hf", kind, pooling, normalize)
    convert(tmp_path / "hf", tmp_path / "ckpt")
    spec = CheckpointConfig.load(tmp_path / "ckpt").model.encoder
    assert (spec.pooling.mode, spec.pooling.normalize) == (pooling, normalize)
    assert spec.position_offset == (2 if kind == "roberta" else 0)  # RoBERTa: padding_idx + 1
    result = build(tmp_path / "ckpt", tmp_path / "engine",
                   BuildConfig(targets=targets, dtype="float32", limits=Limits(max_batch=3, max_input_len=32,
                                                                               max_seq_len=32)))
    if "tensorrt" in targets:  # a real TensorRT-RTX engine over dynamic batch and sequence
        assert result.engine_bytes > 0 and (tmp_path / "engine" / "rank0.engine").is_file()
        (profile,) = result.tensorrt["profiles"]
        assert profile["input_ids"] == [[1, 1], [3, 32], [3, 32]] and profile.keys() == {"input_ids", "attention_mask"}
    with Embeddings(tmp_path / "engine") as engine:
        got = engine.embedder.embed_ids(TOKEN_IDS).embeddings  # 4 texts in batches of max_batch 3
    np.testing.assert_allclose(got, reference(model, pooling, normalize), rtol=1e-4, atol=2e-5)


def test_plain_hf_dir_pools_by_mean_and_limits_fit_the_position_table(tmp_path):
    """No modules.json: mean pooling, no normalization (what sentence-transformers gives such a model);
    the decoder's default max_input_len 1024 is cut to the 64 positions the model has."""
    model = make_encoder(tmp_path / "hf", "bert", None, False, act="gelu_new")
    convert(tmp_path / "hf", tmp_path / "ckpt")
    build(tmp_path / "ckpt", tmp_path / "engine", BuildConfig(targets=("onnxruntime",), dtype="float32"))
    with LLM(tmp_path / "engine") as llm:
        assert llm.engine.limits.max_input_len == 64 and llm.embeddings.max_tokens == 64
        got = llm.embed("w5 w17 w33 w8")  # one string -> one vector, through the engine's tokenizer
        assert got.shape == (32,)
        ids = llm.tokenizer("w5 w17 w33 w8").input_ids
        np.testing.assert_allclose(got, reference(model, "mean", False, [ids])[0], rtol=1e-4, atol=2e-5)
        with pytest.raises(Exception, match="encoder .* engine: it computes embeddings"):
            llm.generate("w5 w6")


@pytest.mark.parametrize("edit, needle", [
    (lambda d: _edit_json(d / "config.json", position_embedding_type="relative_key"), "position_embedding_type"),
    (lambda d: _edit_json(d / "config.json", hidden_act="swish_beta"), "hidden_act"),
    (lambda d: (d / "modules.json").write_text(json.dumps(
        [{"type": "sentence_transformers.models.Transformer", "path": ""},
         {"type": "sentence_transformers.models.Pooling", "path": "1_Pooling"},
         {"type": "sentence_transformers.models.Dense", "path": "2_Dense"}])), "models.Dense"),
    (lambda d: _edit_json(d / "1_Pooling" / "config.json", pooling_mode_max_tokens=True), "2 pooling modes"),
    (lambda d: _edit_json(d / "config.json", hidden_size=48), "shape"),
])
def test_bad_encoder_configs_are_one_line_errors(tmp_path, edit, needle):
    make_encoder(tmp_path / "hf", "bert", "mean", True)
    edit(tmp_path / "hf")
    proc = trtbuild("convert", tmp_path / "hf", tmp_path / "ckpt", timeout=120)
    assert_user_error(proc, needle)
    assert not (tmp_path / "ckpt").exists()


def _edit_json(path: Path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))

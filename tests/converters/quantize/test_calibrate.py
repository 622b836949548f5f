"""Calibration statistics against Hugging Face: the graph taps the activations each linear really multiplies.

The tiny models get a word-level tokenizer ("w0".."w319") and a text of random such words, so
calibration windows are real token ids; transformers runs the same windows with forward
pre-hooks on q_proj / o_proj / gate_proj / down_proj / lm_head, whose inputs are exactly the
inputs of our fused qkv / o / gate_up / down / lm_head.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from runner_engines import add_word_tokenizer

from converters.convert import convert
from converters.quantize import calibration_text
from converters.quantize.calibrate import SAMPLE_TOKENS, CalibrationData, collect, sample_positions
from engine_builder.util.errors import InputError

VOCAB = 320
SAMPLES, SEQ_LEN = 3, 24
WORDS = 1000  # one token each


@pytest.fixture(scope="module")
def tiny_calibration(tiny_model_dir, module_tmp_factory):
    """tiny_calibration(arch, dtype) -> (HF dir with a word tokenizer, its checkpoint, a text of random words)."""
    made: dict[tuple[str, str], tuple[Path, Path, Path]] = {}

    def get(arch: str, dtype: str = "float32") -> tuple[Path, Path, Path]:
        if (arch, dtype) not in made:
            root = module_tmp_factory.mktemp(f"calib-{arch}-{dtype}")
            hf = root / "hf"
            shutil.copytree(tiny_model_dir(arch), hf)
            add_word_tokenizer(hf, VOCAB)
            convert(hf, root / "ckpt", dtype=dtype)
            # 30..99 only: the tokenizer's special "w0" / "w1" / "w2" would also match inside "w17", "w203"
            words = np.random.default_rng(0).integers(30, 100, WORDS)
            text = root / "words.txt"
            text.write_text(" ".join(f"w{i}" for i in words))
            made[arch, dtype] = hf, root / "ckpt", text
        return made[arch, dtype]

    return get


def hf_linear_inputs(model: transformers.PreTrainedModel, ids: np.ndarray) -> dict[str, np.ndarray]:
    """Our linear prefix -> every token's input to that linear in transformers, [windows * seq, in]."""
    modules = {"lm_head": model.lm_head}
    for i, layer in enumerate(model.model.layers):
        modules |= {f"layers.{i}.attn.qkv": layer.self_attn.q_proj, f"layers.{i}.attn.o": layer.self_attn.o_proj,
                    f"layers.{i}.mlp.gate_up": layer.mlp.gate_proj, f"layers.{i}.mlp.down": layer.mlp.down_proj}
    seen: dict[str, list[np.ndarray]] = {prefix: [] for prefix in modules}
    hooks = [module.register_forward_pre_hook(lambda _, args, p=prefix: seen[p].append(args[0][0].numpy()))
             for prefix, module in modules.items()]
    try:
        with torch.no_grad():
            for window in ids:
                model(torch.tensor(window[None, :]))
    finally:
        for hook in hooks:
            hook.remove()
    return {prefix: np.concatenate(xs) for prefix, xs in seen.items()}


def assert_statistics_match(data: CalibrationData, want: dict[str, np.ndarray]) -> None:
    assert sorted(data.inputs) == sorted(want)
    for prefix, x in want.items():  # x: [tokens, in]
        got = data.inputs[prefix]
        # absolute slack for channels near zero, relative to the layer's largest activation
        atol = 1e-5 * np.abs(x).max()
        np.testing.assert_allclose(got.absmax, np.abs(x).max(axis=0), rtol=1e-4, atol=atol, err_msg=prefix)
        np.testing.assert_allclose(got.mean_abs, np.abs(x).mean(axis=0), rtol=1e-4, atol=atol, err_msg=prefix)
        picks = sample_positions(x.shape[0])
        np.testing.assert_allclose(got.sample, x[picks], rtol=1e-4, atol=atol, err_msg=prefix)


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_statistics_match_hf_linear_inputs(tiny_calibration, arch):
    hf, ckpt, text_file = tiny_calibration(arch)
    text = calibration_text.load(text_file)
    calls = []
    data = collect(ckpt, text, SAMPLES, SEQ_LEN, progress=lambda done, total: calls.append((done, total)))
    assert calls == [(1, SAMPLES), (2, SAMPLES), (3, SAMPLES)]
    assert sorted(p.name for p in ckpt.parent.iterdir()) == ["ckpt", "hf", "words.txt"]  # its graph dir is gone
    assert (data.info.source, data.info.sha256, data.info.samples, data.info.seq_len) == \
        ("words.txt", text.sha256, SAMPLES, SEQ_LEN)

    ids = calibration_text.windows(text, ckpt, SAMPLES, SEQ_LEN)  # [samples, seq]
    # consecutive windows from the start, one token per word
    assert ids.ravel().tolist() == [int(w[1:]) for w in text.text.split()[:SAMPLES * SEQ_LEN]]
    model = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32, attn_implementation="eager")
    assert_statistics_match(data, hf_linear_inputs(model.eval(), ids))
    assert data.inputs["lm_head"].sample.shape == (SAMPLES * SEQ_LEN, 64)  # fewer tokens than SAMPLE_TOKENS: all


def test_token_sample_spans_every_window(tiny_calibration):
    """More tokens than SAMPLE_TOKENS: the kept tokens come from all windows, and are still HF's activations."""
    hf, ckpt, text_file = tiny_calibration("llama")
    text = calibration_text.load(text_file)
    data = collect(ckpt, text, samples=4, seq_len=160)
    assert data.inputs["layers.1.mlp.down"].sample.shape == (SAMPLE_TOKENS, 96)
    assert set(sample_positions(4 * 160) // 160) == {0, 1, 2, 3}
    model = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32, attn_implementation="eager")
    assert_statistics_match(data, hf_linear_inputs(model.eval(), calibration_text.windows(text, ckpt, 4, 160)))


def test_half_precision_checkpoint_is_calibrated_in_float32(tiny_calibration):
    """A float16 checkpoint's weights are cast up in the graph: the taps sit behind that Cast, and the
    statistics are those of transformers running the float16-rounded weights in float32."""
    hf, ckpt, text_file = tiny_calibration("llama", "float16")
    text = calibration_text.load(text_file)
    data = collect(ckpt, text, SAMPLES, SEQ_LEN)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32, attn_implementation="eager")
    model = model.half().float().eval()
    assert_statistics_match(data, hf_linear_inputs(model, calibration_text.windows(text, ckpt, SAMPLES, SEQ_LEN)))


def test_short_text_uses_the_windows_that_fit(tiny_calibration):
    _, ckpt, text_file = tiny_calibration("llama")
    data = collect(ckpt, calibration_text.load(text_file), samples=50, seq_len=128)
    assert (data.info.samples, data.info.seq_len) == (7, 128)  # 1000 tokens: 7 windows of 128


def test_text_shorter_than_one_window_is_an_input_error(tiny_calibration):
    _, ckpt, text_file = tiny_calibration("llama")
    with pytest.raises(InputError, match="fewer than one window.*shorter --calib-seq-len or a longer text"):
        calibration_text.windows(calibration_text.load(text_file), ckpt, samples=4, seq_len=WORDS + 1)


def test_builtin_text_and_jsonl(tmp_path):
    builtin = calibration_text.load(None)
    assert builtin.source == "builtin:calibration.txt" and builtin.text.startswith("THE TEMPEST")
    assert len(builtin.sha256) == 64
    path = tmp_path / "docs.jsonl"
    path.write_text(json.dumps({"text": "first doc"}) + "\n\n" + json.dumps({"text": "second", "id": 2}) + "\n")
    loaded = calibration_text.load(path)
    assert (loaded.text, loaded.source) == ("first doc\n\nsecond", "docs.jsonl")


@pytest.mark.parametrize(("name", "content", "message"), [
    ("missing.txt", None, "calibration text .*missing.txt does not exist"),
    ("empty.txt", "  \n", "is empty"),
    ("bad.jsonl", '{"text": "ok"}\n{"text": 3}\n', "line 2 has no string \"text\" field"),
    ("broken.jsonl", '{"text": "ok"}\nnot json\n', "line 2 is not JSON"),
])
def test_bad_calibration_files_are_input_errors(tmp_path, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(InputError, match=message):
        calibration_text.load(path)


def test_smollm2_statistics_match_hf(smollm2_ckpt, hf_smollm2):
    """The real model, all 121 linears: 30 layers deep the tapped activations still agree with transformers'."""
    text = calibration_text.load(None)
    data = collect(smollm2_ckpt, text, samples=2, seq_len=64)  # transformers takes ~6 s per 100 tokens here
    model, _ = hf_smollm2
    assert_statistics_match(data, hf_linear_inputs(model, calibration_text.windows(text, smollm2_ckpt, 2, 64)))

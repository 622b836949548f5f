"""FastTokenizer (no transformers import) gives exactly what transformers' tokenizer of the same dir gives:
token ids, special token ids and chat-template renders, on SmolLM2's byte-level BPE and a tiny word-level one."""

from __future__ import annotations

import json
import shutil

import pytest
from runner_engines import add_word_tokenizer
from sample_texts import MULTILINGUAL

from engine_builder.runner.engine import load_tokenizer
from engine_builder.runner.fast_tokenizer import FastTokenizer

TINY_TEMPLATE = ("{% for m in messages %}{% if loop.first and m['role'] != 'system' %}{{ bos_token }} default\n"
                 "{% endif %}{{ m['role'] }} {{ m['content'] | trim }}{{ eos_token }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant{% endif %}")
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "  Hello\nthere  "}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! 👋"},
     {"role": "user", "content": "How are you?", "name": None}],  # None values are dropped, as transformers does
]


@pytest.fixture(scope="module")
def tokenizer_dirs(smollm2_ckpt, module_tmp_factory):
    """name -> (dir, texts): SmolLM2's checkpoint dir as convert wrote it, a tiny word-level tokenizer dir."""
    tiny = module_tmp_factory.mktemp("word-tokenizer")
    add_word_tokenizer(tiny, 64)
    (tiny / "chat_template.jinja").write_text(TINY_TEMPLATE)
    smol_texts = [*MULTILINGUAL.values(), "<|im_start|>user\nHi<|im_end|>", " leading", "trailing ", "", "\n\n"]
    return {"smollm2": (smollm2_ckpt, smol_texts), "word": (tiny, ["w1 w5 w9", "w3  w60\nw2", "w99 oov", "", "w2"])}


def transformers_tokenizer(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


@pytest.mark.parametrize("name", ["smollm2", "word"])
def test_same_ids_special_tokens_and_chat_renders_as_transformers(tokenizer_dirs, name):
    path, texts = tokenizer_dirs[name]
    fast, hf = load_tokenizer(path), transformers_tokenizer(path)
    assert isinstance(fast, FastTokenizer)
    for text in texts:
        for special in (True, False):
            assert fast(text, add_special_tokens=special).input_ids == hf(text, add_special_tokens=special).input_ids
        assert fast(text)["input_ids"] == hf(text)["input_ids"]
    for attr in ("bos_token", "eos_token", "pad_token", "unk_token", "bos_token_id", "eos_token_id",
                 "pad_token_id", "unk_token_id", "all_special_ids", "chat_template"):
        assert getattr(fast, attr) == getattr(hf, attr), attr
    assert fast.get_vocab() == hf.get_vocab()
    for chat in CHATS:
        for prompt in (True, False):
            want = hf.apply_chat_template(chat, tokenize=False, add_generation_prompt=prompt)
            assert fast.apply_chat_template(chat, tokenize=False, add_generation_prompt=prompt) == want
    # what FastTokenizer does not answer itself comes from transformers' tokenizer of the same dir
    ids = hf(texts[0]).input_ids
    assert fast.decode(ids) == hf.decode(ids)
    assert fast.apply_chat_template(CHATS[0], add_generation_prompt=True) == \
        hf.apply_chat_template(CHATS[0], add_generation_prompt=True)


def test_options_that_edit_the_backend_take_transformers_class(tokenizer_dirs, tmp_path):
    """add_bos_token can make transformers rewrite the post-processor: that dir is not FastTokenizer's to load."""
    path, _ = tokenizer_dirs["word"]
    shutil.copytree(path, tmp_path / "tok")
    config = json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text())
    (tmp_path / "tok" / "tokenizer_config.json").write_text(json.dumps({**config, "add_bos_token": True}))
    tok = load_tokenizer(tmp_path / "tok")
    assert not isinstance(tok, FastTokenizer)
    assert tok("w5 w6").input_ids == transformers_tokenizer(tmp_path / "tok")("w5 w6").input_ids

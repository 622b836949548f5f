"""The tokenizer of `trtbuild run`'s first token, without importing transformers (issue 16's cold start).

transformers' TokenizersBackend wraps a `tokenizers.Tokenizer` read from tokenizer.json, but importing
transformers costs ~0.5-0.9 s (its lazy-import machinery walks every model module) before the file is
even opened. For the tokenizer dirs where that wrapper adds nothing to encoding (`eligible()`: the generic
class, no option that edits the backend, every named special token already an added token, a post-processor
in the file), `FastTokenizer` holds the same `tokenizers.Tokenizer` and answers what generation asks for:
encoding one text (`tok(text).input_ids`), the special tokens and their ids, and the chat template rendered
the way transformers renders it (jinja2's sandbox, trim_blocks / lstrip_blocks, its `tojson`,
`raise_exception` and `strftime_now`, the named special tokens as variables). Anything else (batches,
truncation, padding, tools, `decode`, `convert_ids_to_tokens`...) goes to the transformers tokenizer of
the same dir, loaded on first use. tests/runner/test_fast_tokenizer.py checks token ids, special ids and
chat renders against transformers on SmolLM2 and on a tiny word-level tokenizer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
GENERIC_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
# tokenizer_config.json keys that change nothing transformers does to the backend tokenizer or to an encoding
# of one text; any other key (add_bos_token, add_prefix_space, do_lower_case, split_special_tokens...) means
# transformers' own class
PLAIN_KEYS = frozenset({"backend", "tokenizer_class", "model_max_length", "clean_up_tokenization_spaces",
                        "added_tokens_decoder", "padding_side", "truncation_side", "model_input_names",
                        "chat_template", "name_or_path", "errors", *SPECIAL_TOKENS})
# transformers patches the pre-tokenizer of some vocabularies above this size (Mistral's regex)
MAX_PLAIN_VOCAB = 100_000
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


def eligible(path: Path) -> tuple[Any, dict[str, Any], str | None] | None:
    """(tokenizers.Tokenizer, tokenizer_config, chat template) when FastTokenizer gives what transformers
    gives for PATH, else None."""
    try:
        config = json.loads((path / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or config.get("tokenizer_class") not in GENERIC_CLASSES:
        return None
    if set(config) - PLAIN_KEYS or config.get("extra_special_tokens") or (path / "additional_chat_templates").exists():
        return None
    template = _chat_template(path, config)
    if template is False:
        return None
    from tokenizers import Tokenizer

    try:
        backend = Tokenizer.from_file(str(path / "tokenizer.json"))
    except Exception:  # noqa: BLE001 - a file tokenizers cannot read: transformers says why
        return None
    added = {t.content for t in backend.get_added_tokens_decoder().values()}
    named = [_content(config.get(name)) for name in SPECIAL_TOKENS if config.get(name) is not None]
    if (backend.post_processor is None or backend.get_vocab_size() > MAX_PLAIN_VOCAB
            or any(t is None or t not in added for t in named)):
        return None
    return backend, config, template


def _content(value: Any) -> str | None:
    """A special token as tokenizer_config.json stores it: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _chat_template(path: Path, config: dict[str, Any]) -> str | None | bool:
    """The template transformers would use (chat_template.jinja first); False for what only it handles."""
    file = path / "chat_template.jinja"
    if file.is_file():
        return file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if template is None or isinstance(template, str):
        return template
    return False  # named templates (a list of {name, template}): transformers picks one


class Encoded(dict):
    """One text's encoding, shaped like transformers' BatchEncoding: enc.input_ids or enc["input_ids"]."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class FastTokenizer:
    def __init__(self, path: Path, backend: Any, config: dict[str, Any], chat_template: str | None) -> None:
        self.path, self.backend_tokenizer, self.chat_template = Path(path), backend, chat_template
        self._config = config
        self.special_tokens_map = {name: _content(config[name]) for name in SPECIAL_TOKENS
                                   if config.get(name) is not None}
        for name in SPECIAL_TOKENS:  # eos_token / eos_token_id ... as transformers names them
            token = self.special_tokens_map.get(name)
            setattr(self, name, token)
            setattr(self, name + "_id", backend.token_to_id(token) if token is not None else None)
        self.all_special_tokens = list(dict.fromkeys(self.special_tokens_map.values()))
        self.all_special_ids = [backend.token_to_id(t) for t in self.all_special_tokens]

    def __call__(self, text: Any, add_special_tokens: bool = True, **kwargs: Any) -> Any:
        if kwargs or not isinstance(text, str):
            return self.transformers(text, add_special_tokens=add_special_tokens, **kwargs)
        # encode_batch, not encode: only the batch call releases the GIL while it works, so a server that
        # tokenizes a large prompt in a worker thread keeps answering /health (what transformers calls too)
        ids = self.backend_tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        return Encoded(input_ids=ids, attention_mask=[1] * len(ids))

    def get_vocab(self) -> dict[str, int]:
        return self.backend_tokenizer.get_vocab(with_added_tokens=True)

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    def apply_chat_template(self, conversation: Sequence[Mapping[str, Any]], tools: Any = None,
                            add_generation_prompt: bool = False, tokenize: bool = True, **kwargs: Any) -> Any:
        messages = _plain_messages(conversation)
        if (tokenize or tools is not None or kwargs or messages is None or not self.chat_template
                or _GENERATION_TAG.search(self.chat_template)):
            return self.transformers.apply_chat_template(conversation, tools=tools, tokenize=tokenize,
                                                         add_generation_prompt=add_generation_prompt, **kwargs)
        return _compiled(self.chat_template).render(messages=messages, tools=None, documents=None,
                                                    add_generation_prompt=add_generation_prompt,
                                                    **self.special_tokens_map)

    @cached_property
    def transformers(self) -> Any:
        """transformers' tokenizer of the same dir, for everything FastTokenizer does not answer itself."""
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        return TokenizersBackend.from_pretrained(str(self.path))

    def __getattr__(self, name: str) -> Any:  # only for names not set above (decode, convert_ids_to_tokens...)
        if name.startswith("__") or name in ("transformers", "backend_tokenizer", "_config"):
            raise AttributeError(name)
        return getattr(self.transformers, name)


def _plain_messages(conversation: Any) -> list[dict[str, str]] | None:
    """The messages as transformers hands them to the template (None values dropped), when each is a dict
    of strings without reasoning fields; None for anything transformers itself must convert."""
    if not isinstance(conversation, list | tuple) or not conversation:
        return None
    messages = []
    for message in conversation:
        if not isinstance(message, dict) or any(k in message for k in _REASONING_FIELDS):
            return None
        if not all(type(k) is str and (v is None or type(v) is str) for k, v in message.items()):
            return None
        messages.append({k: v for k, v in message.items() if v is not None})
    return messages


_TEMPLATES: dict[str, Any] = {}


def _compiled(template: str) -> Any:
    """transformers' chat-template environment (utils/chat_template_utils.py, v5): the immutable sandbox,
    trim_blocks and lstrip_blocks, loop controls, its tojson / raise_exception / strftime_now, and its
    guarded `dict` and `namespace`."""
    if template not in _TEMPLATES:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
                   sort_keys: bool = False) -> str:
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        def strftime_now(format: str) -> str:
            return datetime.now().strftime(format)

        class TemplateDict:
            def __call__(self, *args: Any, **kwargs: Any) -> dict:
                return dict(*args, **kwargs)

            def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
                return dict.fromkeys(*args, **kwargs)

        class TemplateNamespace(jinja2.utils.Namespace):
            def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - jinja's own signature trick
                self, args = args[0], args[1:]
                attrs = dict(*args, **kwargs)
                for name in attrs:
                    TemplateNamespace._check_name(name)
                jinja2.utils.Namespace.__init__(self, attrs)

            def __setitem__(self, name: str, value: Any) -> None:
                TemplateNamespace._check_name(name)
                jinja2.utils.Namespace.__setitem__(self, name, value)

            @staticmethod
            def _check_name(name: Any) -> None:
                if isinstance(name, str) and name.startswith("_"):
                    raise jinja2.exceptions.SecurityError(
                        f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}.")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, dict=TemplateDict(),
                           namespace=TemplateNamespace)
        _TEMPLATES[template] = env.from_string(template)
    return _TEMPLATES[template]

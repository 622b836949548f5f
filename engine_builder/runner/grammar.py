"""Constrained decoding: a token mask per step from llguidance, compiled grammars cached per constraint.

    compiler = GrammarCompiler(tokenizer, vocab_size, eos_token_id)   # once per model (~0.3 s)
    matcher = compiler.matcher(params)        # None without a constraint; UnsupportedError / InputError
    matcher.prefetch()                        # start the next mask in a worker (overlaps the forward pass)
    allowed = matcher.allowed()               # [vocab] bool; the sampler sets the rest to -inf
    matcher.accept(token_id)                  # after the token is chosen

Why llguidance rather than xgrammar (benchmarks/grammar_engines.py on SmolLM2's 49k tokenizer,
this machine): llguidance compiles a JSON schema in ~0.5 ms (xgrammar ~5 ms), its mask p99 is
~0.5 ms (xgrammar's median is lower, ~2 us vs ~12 us, but its p99 is ~4 ms); it names the schema
keywords it cannot enforce ("Unimplemented keys: [\"not\"]") where xgrammar compiles the same
schema and silently leaves that part unconstrained, which the product must refuse instead; and it
needs only numpy (xgrammar brings torch masks and triton).

JSON is generated without free whitespace (", " and ": " separators, as json.dumps writes it):
with flexible whitespace a small model can fill its whole budget with newlines inside an object.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine_builder.util.errors import InputError, UnsupportedError

# compiled constraints kept per model; a server sees the same few schemas again and again
CACHE_SIZE = 256
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Constraint:
    """What a request's output must match: kind is json_schema, regex or choice; source its text
    (a schema as canonical JSON, a regex, or the choices as a JSON list)."""

    kind: str
    source: str

    @staticmethod
    def of(params: Any) -> Constraint | None:
        """The constraint a SamplingParams carries (at most one; SamplingParams checks that)."""
        if getattr(params, "json_schema", None) is not None:
            return Constraint("json_schema", params.json_schema)
        if getattr(params, "regex", None) is not None:
            return Constraint("regex", params.regex)
        if getattr(params, "choice", None) is not None:
            return Constraint("choice", json.dumps(list(params.choice)))
        return None


def canonical_schema(schema: Any, field: str = "json_schema") -> str:
    """A JSON schema (dict or JSON text) as canonical JSON text: the cache key, and hashable."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise InputError(f"{field} is not valid JSON ({exc}); give a JSON schema object") from None
    if isinstance(schema, bool):  # JSON Schema allows true/false as whole schemas
        schema = {} if schema else {"not": {}}
    if not isinstance(schema, dict):
        raise InputError(f"{field} must be a JSON schema object, got {type(schema).__name__}")
    return json.dumps(schema, sort_keys=True, separators=(",", ":"))


class GrammarCompiler:
    """llguidance over one model's tokenizer; compiles constraints into matchers, cached per constraint."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_id: int | None) -> None:
        self._hf, self.vocab_size, self._eos = tokenizer, vocab_size, eos_token_id
        self._lltok: Any = None
        self._cache: OrderedDict[Constraint, Any] = OrderedDict()  # constraint -> a fresh matcher to copy
        self._lock = threading.Lock()  # the server compiles on its event loop, the executor steps in its thread
        self._pool: ThreadPoolExecutor | None = None
        self.hits = self.misses = 0

    def matcher(self, params: Any) -> GrammarMatcher | None:
        constraint = Constraint.of(params)
        if constraint is None:
            return None
        with self._lock:
            template = self._cache.get(constraint)
            if template is not None:
                self._cache.move_to_end(constraint)
                self.hits += 1
            else:
                template = self._compile(constraint)
                self._cache[constraint] = template
                if len(self._cache) > CACHE_SIZE:
                    self._cache.popitem(last=False)
                self.misses += 1
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-mask")
            return GrammarMatcher(template.deep_copy(), self.vocab_size, self._pool, self._eos)

    def check(self, params: Any) -> None:
        """Raise the error matcher() would (compiling and caching the constraint)."""
        self.matcher(params)

    def _tokenizer(self) -> Any:
        if self._lltok is None:
            import llguidance

            backend = getattr(self._hf, "backend_tokenizer", None)
            if backend is None:
                raise UnsupportedError("constrained decoding needs a fast (tokenizers) tokenizer; this engine's "
                                       "tokenizer has none")
            self._lltok = llguidance.LLTokenizer(backend.to_str(), n_vocab=self.vocab_size, eos_token=self._eos)
        return self._lltok

    def _compile(self, c: Constraint) -> Any:
        try:
            return self._compile_checked(c)
        except (ValueError, RuntimeError, TypeError) as exc:  # llguidance's own refusals: the input's fault
            raise InputError(f"the {c.kind} cannot be compiled: {exc}; fix it and retry") from None

    def _compile_checked(self, c: Constraint) -> Any:
        import llguidance

        M = llguidance.LLMatcher
        if c.kind == "json_schema":
            grammar = M.grammar_from_json_schema(c.source, overrides=JSON_OPTIONS)
        elif c.kind == "regex":
            grammar = M.grammar_from_regex(c.source)
        else:  # choice: a Lark rule of JSON-escaped string literals, so no choice text needs regex escaping
            grammar = M.grammar_from_lark("start: " + " | ".join(json.dumps(s) for s in json.loads(c.source)))
        lltok = self._tokenizer()
        is_error, messages = M.validate_grammar_with_warnings(grammar, lltok)
        if is_error or messages:
            # a warning means part of the constraint would not be enforced: refused, never silently loosened
            detail = "; ".join(messages) or "invalid grammar"
            if any("Unimplemented" in m or "unsupported" in m.lower() for m in messages):
                raise UnsupportedError(f"the {c.kind} uses features the grammar engine cannot enforce ({detail}); "
                                       "remove them from the schema")
            raise InputError(f"the {c.kind} cannot be compiled: {detail}; fix it and retry")
        matcher = M(lltok, grammar, log_level=0)
        if matcher.is_error():
            raise InputError(f"the {c.kind} cannot be compiled: {matcher.get_error()}; fix it and retry")
        return matcher


class GrammarMatcher:
    """One request's position in its grammar. Mutable by design: it advances a token per step."""

    def __init__(self, matcher: Any, vocab_size: int, pool: ThreadPoolExecutor, eos: int | None) -> None:
        self._m, self._vocab, self._pool, self.eos = matcher, vocab_size, pool, eos
        self._bits = np.zeros((vocab_size + 31) // 32, dtype=np.int32)  # [words] one bit per token
        self._pending: Future | None = None

    def prefetch(self) -> None:
        """Compute the next mask in the worker thread (llguidance releases the GIL), so it overlaps
        the engine call that produces this step's logits."""
        if self._pending is None:
            self._pending = self._pool.submit(self._fill)

    def _fill(self) -> None:
        self._m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)

    def allowed(self) -> np.ndarray:
        """[vocab] bool: the tokens the grammar allows next (EOS once it is complete)."""
        if self._pending is None:
            self._fill()
        else:
            self._pending.result()
            self._pending = None
        return np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: self._vocab].astype(bool)

    def accept(self, token_id: int) -> None:
        if not self._m.is_stopped():
            self._m.consume_token(int(token_id))

    @property
    def error(self) -> str | None:
        return self._m.get_error() if self._m.is_error() else None

    @property
    def done(self) -> bool:
        """The grammar matched a complete output and allows nothing more."""
        return self._m.is_stopped()

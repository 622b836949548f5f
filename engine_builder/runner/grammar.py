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

Bounds (GrammarLimits, each named in its refusal): a constraint's text is at most 64 KiB and an anyOf /
oneOf has at most 256 branches, checked before any compile (an anyOf of 8,000 objects once took 12 s
to compile and 17-81 MB to keep); a compile runs in one worker thread of its own (never the server's
event loop: llguidance releases the GIL) and one that takes longer than 10 s is refused, then and
every later time. The cache is an LRU bounded by count (256) and by the constraints' text (1 MiB):
measured, a compiled grammar costs up to ~130x its text (an anyOf of 800 objects, 66 KB: 8 MB), so
the cache holds at most ~130 MB however many distinct schemas a server sees, and an evicted grammar's
memory is freed. llguidance can still give up mid-answer on a grammar within the bounds (a parser
row of more than 2,000 Earley items: an anyOf of 200 objects whose extra keys are allowed): it then
allows only EOS (sampling_constraints.py), and verdict() replays the answer's tokens so that the server
reports an error instead of a "stop" (server/generation.py).

JSON is generated without free whitespace (", " and ": " separators, as json.dumps writes it):
with flexible whitespace a small model can fill its whole budget with newlines inside an object.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine_builder.util.errors import InputError, UnsupportedError

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class GrammarLimits:
    """What one constraint may cost; the defaults fit any schema a person writes (OpenAI's strict mode
    takes 128 tools and enums of 1,000 values; a schema of 64 KiB is ~1,000 properties)."""

    max_source_bytes: int = 64 * 1024  # a schema's canonical JSON / a regex / the choices as JSON
    max_branches: int = 256  # alternatives of one anyOf / oneOf
    compile_timeout_s: float = 10.0  # one compile, in the compile worker
    cache_entries: int = 256  # compiled constraints kept: a server sees the same few again and again
    cache_source_bytes: int = 1 << 20  # their text, summed (memory: up to ~130x this)


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


def check_bounds(c: Constraint, limits: GrammarLimits) -> None:
    """InputError naming the limit a constraint is over; cheap (no compile), so it runs first."""
    size = len(c.source.encode())
    if size > limits.max_source_bytes:
        raise InputError(f"the {c.kind} is {size} bytes but this server compiles at most {limits.max_source_bytes} "
                         "(the grammar limit max_source_bytes); send a smaller one")
    if c.kind != "json_schema":
        return
    stack = [json.loads(c.source)]  # iterative: a deep schema must not hit Python's recursion limit
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key in ("anyOf", "oneOf"):
                branches = node.get(key)
                if isinstance(branches, list) and len(branches) > limits.max_branches:
                    raise InputError(f"the json_schema has an {key} of {len(branches)} branches but this server "
                                     f"takes at most {limits.max_branches} (the grammar limit max_branches); "
                                     "merge branches or split the request")
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


class GrammarCompiler:
    """llguidance over one model's tokenizer; compiles constraints into matchers, cached per constraint.

    submit() compiles in the compile worker (the server awaits it); matcher() is the executor's call and
    finds the grammar cached then (it compiles in the caller's thread only if the cache dropped it)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_id: int | None,
                 limits: GrammarLimits = GrammarLimits()) -> None:
        self._hf, self.vocab_size, self._eos = tokenizer, vocab_size, eos_token_id
        self.limits = limits
        self._lltok: Any = None
        self._cache: OrderedDict[Constraint, Any] = OrderedDict()  # constraint -> a fresh matcher to copy
        self._cache_bytes = 0  # len(source) summed over the cache
        self._slow: OrderedDict[Constraint, float] = OrderedDict()  # refused for their compile time (seconds)
        # only cache operations hold the lock, never a compile: the executor's cache hit must not wait for
        # the compile worker's long compile
        self._lock = threading.Lock()
        self._tok_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._compile_pool: ThreadPoolExecutor | None = None
        self.hits = self.misses = 0

    # --- the cache ----------------------------------------------------------------------------

    @property
    def cached(self) -> tuple[int, int]:
        """(entries, bytes of constraint text) in the cache now."""
        with self._lock:
            return len(self._cache), self._cache_bytes

    def _lookup(self, c: Constraint) -> Any:
        with self._lock:
            seconds = self._slow.get(c)
            if seconds is not None:
                raise InputError(self._slow_message(c, seconds))
            template = self._cache.get(c)
            if template is not None:
                self._cache.move_to_end(c)
                self.hits += 1
            return template

    def _store(self, c: Constraint, template: Any) -> None:
        size = len(c.source)
        with self._lock:
            self.misses += 1
            if c in self._cache or size > self.limits.cache_source_bytes:
                return
            self._cache[c] = template
            self._cache_bytes += size
            while len(self._cache) > self.limits.cache_entries or self._cache_bytes > self.limits.cache_source_bytes:
                old, _ = self._cache.popitem(last=False)
                self._cache_bytes -= len(old.source)

    def _template(self, c: Constraint) -> Any:
        """The cached grammar, or compiled (timed) and cached now (its bounds checked first)."""
        template = self._lookup(c)
        if template is None:
            check_bounds(c, self.limits)
            started = time.monotonic()
            template = self._compile(c)
            seconds = time.monotonic() - started
            if seconds > self.limits.compile_timeout_s:
                with self._lock:
                    self._slow[c] = seconds
                    if len(self._slow) > self.limits.cache_entries:
                        self._slow.popitem(last=False)
                raise InputError(self._slow_message(c, seconds))
            self._store(c, template)
        return template

    def _slow_message(self, c: Constraint, seconds: float) -> str:
        return (f"the {c.kind} took {seconds:.1f} s to compile, over this server's {self.limits.compile_timeout_s:g} s "
                "(the grammar limit compile_timeout_s); simplify it")

    # --- the API ------------------------------------------------------------------------------

    def matcher(self, params: Any) -> GrammarMatcher | None:
        constraint = Constraint.of(params)
        if constraint is None:
            return None
        template = self._template(constraint)
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-mask")
            pool = self._pool
        return GrammarMatcher(template.deep_copy(), self.vocab_size, pool, self._eos)

    def check(self, params: Any) -> None:
        """Raise the error matcher() would (compiling and caching the constraint), in this thread."""
        constraint = Constraint.of(params)
        if constraint is not None:
            self._template(constraint)

    def submit(self, params: Any) -> Future[None]:
        """check() in the compile worker (one thread: compiles take at most one core); the bounds are
        checked here first, so a constraint over them raises at once."""
        done: Future[None] = Future()
        constraint = Constraint.of(params)
        if constraint is not None:
            check_bounds(constraint, self.limits)
            if self._lookup(constraint) is None:
                with self._lock:
                    if self._compile_pool is None:
                        self._compile_pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-compile",
                                                                initializer=_lower_priority)
                    pool = self._compile_pool
                return pool.submit(self._template, constraint)
        done.set_result(None)
        return done

    def verdict(self, params: Any, token_ids: list[int]) -> str | None:
        """Why an answer that ended on a stop token is not a complete match of its constraint (None if it is):
        the answer's tokens (the stop token left out) replayed through a fresh copy of the grammar."""
        constraint = Constraint.of(params)
        if constraint is None:
            return None
        matcher = self._template(constraint).deep_copy()
        for token in token_ids:
            if matcher.is_error() or matcher.is_stopped():
                break
            matcher.consume_token(int(token))
        if matcher.is_error():
            why = first_line(matcher.get_error())
            return f"the grammar engine gave up on this {constraint.kind} mid-answer ({why})"
        if not matcher.is_accepting():
            return f"the answer ended before it matched the {constraint.kind}"
        return None

    def warm(self) -> None:
        """Build the grammar engine's tokenizer now (a server, before it listens): llguidance holds the GIL while it
        builds it (~1 s on SmolLM2's 49k vocabulary on a loaded 2-core CPU), which stalled /health for the first
        constrained request. A tokenizer it cannot take is left for that request to refuse."""
        try:
            self._tokenizer()
        except Exception:  # noqa: BLE001 (llguidance's own types): the request that needs it says why, in one line
            pass

    def _tokenizer(self) -> Any:
        # built on the first compile (or by warm()), not when the engine loads: LLM.generate users without
        # constraints never pay for it
        with self._tok_lock:
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


def _lower_priority() -> None:
    """The compile worker yields the CPU to the server's event loop and the step loop (Linux schedules
    threads one by one; nice 10): a compile must not slow /health or other requests' tokens."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (AttributeError, OSError):  # not Linux, or not allowed: the compile only runs at normal priority
        pass


def first_line(text: str) -> str:
    """llguidance's errors carry the parser state on further lines; a client gets the first."""
    return text.strip().splitlines()[0] if text.strip() else "no detail"


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

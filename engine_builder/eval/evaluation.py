"""`trtbuild eval` as a function: perplexity of an engine dir on a text, and, against a reference,
the mean KL(reference || model) of the next-token distributions and their top-1 agreement.

    result = evaluate("engine", reference="ckpt-fp32", max_tokens=1024)
    print(result.ppl, result.kl, result.top1_agreement, result.context)

The engine graph returns only the last position's logits, so every scored position is one
engine step: windows run side by side, one per KV slot, and each step feeds every window its
next token, giving [windows, vocab] next-token logits per call. The reference runs in lockstep
on the same tokens, so both distributions of a position meet in one place and are reduced to
running sums at once.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine_builder.eval.reference import check_same_vocab, load_reference, opened_reference
from engine_builder.eval.scores import ScoreSums
from engine_builder.eval.text import DEFAULT_CONTEXT, DEFAULT_MAX_TOKENS, load_text, token_windows
from engine_builder.formats import graph_io as io
from engine_builder.runner.backend import Backend
from engine_builder.runner.backend_choice import choose_backend, open_backend
from engine_builder.runner.engine import EngineDir
from engine_builder.util.errors import CapacityError, InputError, UnsupportedError

# progress(stage, positions scored so far, positions to score)
ReportProgress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class EvalResult:
    ppl: float
    kl: float | None  # mean KL(reference || model) per position, nats; None without a reference
    top1_agreement: float | None  # share of positions whose argmax agrees with the reference's
    tokens: int  # positions scored (each window of n tokens scores n-1)
    windows: int
    context: int  # longest window, in tokens (special prefix included)
    text: str  # the text's source
    backend: str
    reference_path: str | None
    reference_ppl: float | None
    seconds: float

    def to_json(self) -> dict[str, Any]:
        reference = None if self.reference_path is None else {"path": self.reference_path, "ppl": self.reference_ppl}
        return {"ppl": self.ppl, "kl": self.kl, "top1_agreement": self.top1_agreement, "tokens": self.tokens,
                "windows": self.windows, "context": self.context, "text": self.text, "backend": self.backend,
                "reference": reference, "seconds": self.seconds}


def evaluate(engine_dir: Path | str, reference: Path | str | None = None, text: Path | str | None = None,
             max_tokens: int = DEFAULT_MAX_TOKENS, context: int | None = None, backend: str = "auto",
             progress: ReportProgress | None = None) -> EvalResult:
    """Score ENGINE_DIR on the first MAX_TOKENS tokens of TEXT (None: the shipped eval text) in windows of
    CONTEXT tokens (default: DEFAULT_CONTEXT, capped by the engines' max_seq_len), against REFERENCE (a
    checkpoint or engine dir) when given."""
    started = time.perf_counter()
    report = progress or (lambda *_: None)
    if max_tokens < 2:
        raise InputError(f"--max-tokens must be at least 2 (one token predicts the next), got {max_tokens}")
    engine = EngineDir.load(engine_dir)
    if engine.manifest.mapping is not None:  # its ranks return last-position logits only, and need their processes
        raise UnsupportedError(f"{engine_dir} is a tp/pp engine dir; evaluate a single-process build of the same "
                               "model (`trtbuild convert` without --tp/--pp, then `trtbuild build`)")
    choice = choose_backend(engine, backend)  # decided without loading: a bad --backend fails before any work
    eval_text = load_text(Path(text) if text is not None else None)
    ref = load_reference(Path(reference)) if reference is not None else None
    report("loading the tokenizer", 0, 0)
    tokenizer = engine.load_tokenizer()
    if ref is not None:
        check_same_vocab(engine, tokenizer, ref, ref.load_tokenizer())
    engines = [engine, *([ref.engine] if ref is not None and ref.engine is not None else [])]
    window_len = pick_context(context, engines)
    windows = token_windows(tokenizer, eval_text, max_tokens, window_len)
    slots = min(len(windows), *(e.limits.max_batch for e in engines))
    total = sum(len(w) - 1 for w in windows)
    with contextlib.ExitStack() as stack:
        reference_backend = None
        if ref is not None:  # first: a checkpoint's build peaks at several times its weights in RAM
            reference_engine = stack.enter_context(opened_reference(ref, slots, window_len,
                                                                    lambda stage: report(stage, 0, total)))
            reference_backend, _ = open_backend(reference_engine, "auto")
            stack.callback(reference_backend.close)
        model, _ = open_backend(engine, choice.name)
        stack.callback(model.close)
        sums = score_windows(model, reference_backend, windows, slots,
                             lambda done: report(f"scoring on {choice.name}", done, total))
    return EvalResult(
        ppl=sums.ppl, kl=sums.mean_kl if ref else None, top1_agreement=sums.top1_agreement if ref else None,
        tokens=sums.positions, windows=len(windows), context=max(len(w) for w in windows), text=eval_text.source,
        backend=choice.name, reference_path=str(ref.path) if ref else None,
        reference_ppl=sums.reference_ppl if ref else None, seconds=round(time.perf_counter() - started, 3))


def pick_context(requested: int | None, engines: Sequence[EngineDir]) -> int:
    """The window length: REQUESTED or DEFAULT_CONTEXT, within every engine's KV cache (max_seq_len) and,
    for longrope models, within the short-factor range (past it the engine re-prefills, which a
    one-token-per-step scorer cannot do, and Hugging Face switches the whole window to the long factor)."""
    limits = {f"{e.path} max_seq_len": e.limits.max_seq_len for e in engines}
    for e in engines:
        if (short_range := io.reprefill_after(e.graph_metadata)) is not None:
            limits[f"{e.path} longrope short range"] = short_range
    if requested is None:
        return min(DEFAULT_CONTEXT, *limits.values())
    if requested < 2:
        raise InputError(f"--context must be at least 2 tokens, got {requested}")
    for what, bound in limits.items():
        if requested > bound:
            raise CapacityError(f"--context {requested} exceeds {what} {bound}; pass --context {bound} or less, "
                                f"or rebuild with a larger --max-seq-len")
    return requested


def score_windows(model: Backend, reference: Backend | None, windows: list[np.ndarray], slots: int,
                  advanced: Callable[[int], None]) -> ScoreSums:
    """Feed WINDOWS, SLOTS at a time (one per KV slot), one token per step through MODEL and REFERENCE."""
    sums = ScoreSums()
    done = 0
    backends = [b for b in (model, reference) if b is not None]
    for first in range(0, len(windows), slots):
        group = windows[first:first + slots]  # only the text's last window can be shorter, and it comes last
        for b in backends:
            for slot, window in enumerate(group):
                # the last token is only predicted, never fed: a window takes len - 1 KV positions
                b.kv.allocate(slot, len(window) - 1, 1)
        for t in range(len(group[0]) - 1):
            rows = sum(len(w) - 1 > t for w in group)  # windows still feeding: a prefix of the slots
            ids = np.array([[w[t]] for w in group[:rows]], np.int64)  # [rows, 1]
            targets = np.array([w[t + 1] for w in group[:rows]], np.int64)  # [rows]
            logits = model.step(0, ids)  # [rows, vocab]
            reference_logits = reference.step(0, ids) if reference is not None else None
            sums.add(logits, targets, reference_logits)
            for b in backends:
                for slot in range(rows):
                    b.kv.advance(slot, 1)
            done += rows
            advanced(done)
        for b in backends:
            for slot in range(len(group)):
                b.release(slot)
    return sums

"""The step functions of generation, and the requests' way into the step loop.

    admit    a request takes the lowest free KV slot (runner/kv/), its storage for the context so far
    prefill  its context (or a chunk of it) written at the slot's length in one engine call; after the last
             chunk its first token is sampled
    decode   one step over the decoding slots (a ModelInput, runner/core/model_input.py): each feeds its last
             token at its own length, so prompts of any lengths share a step with no padding; on a slot engine
             a free row inside the range rides along with token 0 at length 0 and its logits are ignored
    release  a request that stops frees its slot at once, and the next waiting request takes it

Who runs which of them each step is the scheduler's plan (runner/scheduling/scheduler.py -> StepPlan), carried
out by runner/scheduling/engine_step.py; two drivers repeat that step: LLM.generate / stream through `admission`
(runner/scheduling/block_admission.py, synchronous, every admitted prompt prefilled whole) and
engine_builder/executor (a thread serving requests that arrive at any time, chunked prefill under a token
budget). So a request gets the same engine calls, and the same tokens, whichever drives it. Whoever drives them
claims the Generator first (`claim`): one driver at a time, since the KV cache and the per-slot next tokens are
shared state. A beam search request (num_beams > 1) holds a slot per beam and runs in the same steps as the
sampled ones: prefilled once, its beams decode in the step's one batched call, and BeamSearch (beam_search.py)
picks their tokens where the sampler picks the others'.

The loop yields Events (text deltas per request) after each step; time the consumer spends on them (printing, a
network write) is not counted in the timings. Per-step Python overhead (everything in a decode step but the
engine call) is measured in `Timings.overhead_share`.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from engine_builder.runner.backend import Backend
from engine_builder.runner.beam_search import BeamSearch
from engine_builder.runner.core.image_prompt import ImagePrompt
from engine_builder.runner.core.model_input import ImageEmbeds, ModelInput
from engine_builder.runner.detokenizer import IncrementalDetokenizer
from engine_builder.runner.grammar import GrammarCompiler
from engine_builder.runner.kv.prefix_cache import PrefixCache
from engine_builder.runner.prompt_logprobs import score as score_prompt
from engine_builder.runner.request_state import Event, RequestState, StepClock, Timings
from engine_builder.runner.sampler import Sampler, SamplingState, TokenLogprobs
from engine_builder.runner.sampling_params import SamplingParams
from engine_builder.runner.stopping import StopChecker
from engine_builder.util.errors import CapacityError, InputError, UnsupportedError


class Admission(Protocol):
    """Who runs start()'s sampled requests (runner/scheduling/block_admission.py is the one LLM uses)."""

    def check(self, generator: Generator, prompt_ids: Sequence[int], params: SamplingParams) -> None: ...

    def run(self, generator: Generator, requests: Sequence[RequestState], clock: StepClock) -> Iterator[Event]: ...


class DecodePolicy(Protocol):
    """How the loop's decode step runs for the requests past their prefill: PlainDecode (below: one batched
    engine call, a token each) or speculative decoding's propose -> verify -> accept
    (runner/speculative/speculative_decode.py). Either one emits tokens through Generator.accept."""

    step_tokens: int  # KV positions one decode step may write per request (the scheduler's lookahead)

    def begin(self) -> None:
        """A run starts (per-run statistics reset)."""

    def decode(self, gen: Generator, active: dict[int, RequestState], events: list[Event],
               clock: StepClock | None) -> None:
        """One decode step over `active` (slot -> request); finished requests leave it."""

    def release(self, r: RequestState) -> None:
        """r leaves the loop (finished, cancelled, preempted): drop what the policy kept for it."""

    def close(self) -> None: ...


class PlainDecode:
    """The default DecodePolicy: every active request's next token from one batched step."""

    step_tokens = 1

    def begin(self) -> None:
        pass

    def decode(self, gen: Generator, active: dict[int, RequestState], events: list[Event],
               clock: StepClock | None) -> None:
        gen.decode_batch(active, events, clock)

    def release(self, r: RequestState) -> None:
        pass

    def close(self) -> None:
        pass


class Generator:
    """Runs requests on one backend. One driver at a time (claim): the KV cache belongs to it."""

    def __init__(self, backend: Backend, tokenizer: Any, eos_token_ids: Sequence[int] = (),
                 sampler: Sampler | None = None, prefix_cache: PrefixCache | None = None,
                 decoding: DecodePolicy | None = None) -> None:
        self.backend = backend
        self.decoding: DecodePolicy = decoding or PlainDecode()
        self.prefix_cache = prefix_cache  # reuse earlier prompts' full KV blocks (prefix_cache.py)
        # also keep what a request generated (chat: the next turn's prompt starts with this answer)
        self.cache_outputs = False
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(dict.fromkeys(int(t) for t in eos_token_ids))
        self.sampler = sampler or backend.make_sampler()
        self.timings: Timings | None = None  # of the last finished run
        # how start()'s sampled requests are admitted and stepped: the scheduler's step loop, which LLM sets
        # (runner/scheduling/block_admission.py; the scheduling package sits above this module)
        self.admission: Admission | None = None
        self.next_ids = np.zeros((backend.kv.batch_slots, 1), np.int64)  # [slots, 1] each slot's last token
        self._owner: tuple[str, str] | None = None  # who drives the step functions now, and how to free them
        self._owner_lock = threading.Lock()
        # json_schema / regex / choice requests: llguidance over this tokenizer (grammar.py), built lazily
        eos = self.eos_token_ids[0] if self.eos_token_ids else None
        self.grammars = GrammarCompiler(tokenizer, backend.vocab_size, eos)

    # --- ownership --------------------------------------------------------------------------

    def claim(self, owner: str, release_hint: str) -> None:
        """Take the step functions for `owner`, or raise InputError naming the current owner and
        its release_hint (what a caller who finds the model busy should do)."""
        with self._owner_lock:
            if self._owner is not None:
                raise InputError(f"this model is already generating ({self._owner[0]}); {self._owner[1]}")
            self._owner = (owner, release_hint)

    def unclaim(self) -> None:
        with self._owner_lock:
            self._owner = None

    # --- admission checks -------------------------------------------------------------------

    def check(self, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        """Raise a user error if this request can never run on this engine (before any work)."""
        kv, limit = self.backend.kv, self.backend.max_input_len
        if len(prompt_ids) == 0:
            raise InputError("the prompt is empty; give at least one token of text")
        if len(prompt_ids) > limit:
            raise InputError(f"the prompt has {len(prompt_ids)} tokens but the engine takes at most {limit} "
                             f"(max_input_len); shorten the prompt or rebuild with a larger max_input_len")
        needed = len(prompt_ids) + params.max_new_tokens
        if needed > kv.max_seq:
            raise CapacityError(f"prompt {len(prompt_ids)} tokens + max_new_tokens {params.max_new_tokens} = "
                                f"{needed} exceeds the engine's max_seq_len {kv.max_seq}; lower max_new_tokens "
                                f"to {kv.max_seq - len(prompt_ids)} or less, or rebuild with a larger max_seq_len")
        if params.num_beams > kv.batch_slots:
            raise CapacityError(f"num_beams {params.num_beams} needs one KV slot per beam but the engine has "
                                f"{kv.batch_slots} (max_batch); lower num_beams or rebuild with a larger max_batch")

    def new_request(self, index: int, prompt_ids: Sequence[int], params: SamplingParams,
                    image: ImagePrompt | None = None) -> RequestState:
        """image: a vision-language prompt (runner/vision/image_prompts.py); prompt_ids are then its ids."""
        # SamplingState first: it refuses ids outside the vocab, which the detokenizer would not survive
        state = SamplingState(params, prompt_ids, self.backend.vocab_size)
        detok = IncrementalDetokenizer(self.tokenizer, prompt_ids)
        state.grammar = self.grammars.matcher(params)  # UnsupportedError / InputError for a bad constraint
        if image is not None and not self.backend.takes_images:
            raise UnsupportedError(f"the {self.backend.name} backend does not run image inputs on this engine; run "
                                   "a vision-language engine with --backend onnxruntime")
        scored = min(self.backend.logits_tail, self.backend.max_input_len)  # positions one scoring call returns
        if image is not None and image.whole and params.prompt_logprobs is not None and image.spans() and (
                longest := max(b - a for a, b in image.spans())) > scored:
            raise UnsupportedError(f"prompt_logprobs of an image prompt need its {longest} image positions' logits "
                                   f"from one engine call (the image attends both ways), and this {self.backend.name} "
                                   f"engine returns {scored} at most (logits_tail); drop prompt_logprobs, or run it "
                                   "with --backend torch")
        return RequestState(index, list(prompt_ids), params, state,
                            StopChecker(params, detok, self.eos_token_ids),
                            logprobs=[] if params.logprobs is not None else None,
                            prompt_logprobs=[None] if params.prompt_logprobs is not None else None, image=image)

    # --- the loop ---------------------------------------------------------------------------

    def start(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams],
              images: Sequence[ImagePrompt | None] | None = None) -> tuple[list[RequestState], Iterator[Event]]:
        """Check every request now (user errors before any work), then return their states and the
        loop that generates for them; iterating it yields text deltas as they become safe to show,
        and the states hold the final text, tokens and logprobs once it ends. images: per prompt, its
        ImagePrompt (whose ids the prompt is) or None."""
        if len(prompts) != len(params):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
        images = list(images) if images is not None else [None] * len(prompts)
        if self.admission is None:
            raise ValueError("this Generator has no step loop to run requests on; set generator.admission "
                             "(LLM sets runner/scheduling/block_admission.BlockAdmission)")
        for ids, p in zip(prompts, params):
            self.check(ids, p)
            self.admission.check(self, ids, p)
        requests = [self.new_request(i, ids, p, image)
                    for i, (ids, p, image) in enumerate(zip(prompts, params, images))]
        return requests, self._loop(requests)

    @property
    def step_tokens(self) -> int:
        return self.decoding.step_tokens

    def close(self) -> None:
        self.decoding.close()  # a draft model's engine

    def _loop(self, requests: list[RequestState]) -> Iterator[Event]:
        self.claim("an unfinished stream?", "finish or close it first")
        self.decoding.begin()
        clock = StepClock(self.backend)
        try:
            # lower priority values first (SamplingParams.priority); a stable sort keeps the order within a level
            yield from self.admission.run(self, sorted(requests, key=lambda r: r.params.priority), clock)
        finally:
            for r in requests:  # on an error or an abandoned stream: give every slot back
                if r.slot is not None:
                    self.release(r)
            self.timings = clock.timings()
            self.unclaim()

    # --- the step functions -----------------------------------------------------------------

    def run_step(self, batch: ModelInput) -> Any:
        """Run the model over one step's batch: the one place the runtime calls a backend's forward (every step
        kind (prefill, batched prefill, decode, beams, verify) builds a ModelInput and comes here;
        tests/architecture/test_layers.py checks it). Logits of batch.logits_indices in the backend's own array
        type: numpy for a host backend, a device tensor for the torch backend (the sampler reads them there)."""
        return self.backend.forward(batch)

    def admit(self, r: RequestState, initial_tokens: int | None = None) -> None:
        """Reserve r's KV slot for prompt + max_new_tokens (the lowest free slot); a paged cache takes blocks
        for all of them, or for initial_tokens only (the executor grows the rest as decoding proceeds). A beam
        search takes a slot per beam, each whole, and starts its search afresh. (The scheduler allocates through
        the KV interface itself and hands the admitted to `admitted`; this is the same for a caller without one.)"""
        r.take_slots(self.backend.kv.allocate_sequences(r.index, len(r.prompt_ids), r.params.max_new_tokens,
                                                        r.params.num_beams, initial_tokens))
        self.admitted([r])

    def admitted(self, requests: Sequence[RequestState]) -> None:
        """Requests that just took their slots: a beam search starts afresh (a preempted one is recomputed from
        its prompt)."""
        for r in requests:
            if r.params.num_beams > 1:
                r.beams = BeamSearch(r.params, self.eos_token_ids, self.backend.vocab_size)
                r.token_ids = []

    def prefill_remaining(self, r: RequestState) -> int:
        """Prompt tokens of an admitted request not yet in its slot (0 once its first token is sampled)."""
        return r.prefill_remaining(self.backend.kv)

    def load_cached_prefix(self, r: RequestState) -> int:
        """Where r's next prefill chunk starts: its slot's length, after copying the prompt's cached blocks into
        the slot (cached blocks are copied, not computed) if r is fresh (slot empty, nothing generated, prompt not
        scored: cached blocks have no logits to score). The lookup happens once per slot: a later call only
        looks, so blocks another prompt stores meanwhile cannot move a start a caller already planned with
        (batched_prefill.start sizes a shared call before the step's earlier calls store their prompts)."""
        kv = self.backend.kv
        if (not r.prefix_looked_up and self.prefix_cache is not None and not r.token_ids
                and r.prompt_logprobs is None and kv.length(r.slot) == 0):
            self.prefix_cache.load(r.cache_prompt, r.slot)
        r.prefix_looked_up = True
        return kv.length(r.slot)

    def prefill(self, r: RequestState, events: list[Event], max_tokens: int | None = None) -> None:
        """Write the next tokens of r's context into its slot at the slot's length: all of them, or at
        most max_tokens (chunked prefill). After the last one, r's next token is sampled. The context
        is the prompt, plus the generated tokens when a longrope re-prefill starts over at 0."""
        kv = self.backend.kv
        context = r.prompt_ids + r.token_ids
        start = self.load_cached_prefix(r)
        scored = r.prompt_logprobs is not None and not r.token_ids
        end = len(context) if max_tokens is None else min(len(context), start + max_tokens)
        if r.image is not None:  # an image that attends both ways is prefilled in one call
            end = r.image.chunk_end(start, end)
        if end == len(context) and r.sampling.grammar is not None:
            r.sampling.grammar.prefetch()
        if scored:
            logits = self._prefill_scored(r, start, end)
        else:
            ids = np.asarray(context[start:end], np.int64)[None, :]
            logits = self.run_step(ModelInput.rows(r.slot, ids, kv.lengths[r.slot:r.slot + 1],
                                                  images=_images(r, start, end)))  # [1, vocab]
            kv.advance(r.slot, end - start)
        if end == len(context) and not r.token_ids and self.prefix_cache is not None:
            self.prefix_cache.store(r.cache_prompt, r.slot)
        if end == len(context) and r.beams is not None:  # every beam starts from the prompt's KV and logits
            self.backend.copy_slots([r.slot] * (len(r.beam_slots) - 1), r.beam_slots[1:])
            self._beam_step(r, np.repeat(self.backend.to_host(logits), len(r.beam_slots), axis=0), events)
        elif end == len(context):  # earlier chunks' logits predict prompt tokens we already have
            sample = self.sampler(logits, [r.sampling])
            self.accept(r, int(sample.token_ids[0]), sample.logprobs[0], events)

    def _prefill_scored(self, r: RequestState, start: int, end: int) -> np.ndarray:
        """Prompt tokens start..end, scoring each next prompt token (prompt_logprobs): in steps of up to
        the graph's logits_tail tokens (16 by default), whose logits cover every position of the step
        (one token per step on an engine built before logits_tail)."""
        context = r.prompt_ids + r.token_ids
        chunk = max(1, min(self.backend.logits_tail, self.backend.max_input_len))
        logits = None
        kv = self.backend.kv
        at = start
        while at < end:
            stop = min(end, at + chunk)
            if r.image is not None:  # an image that attends both ways within one call (new_request checked it fits)
                stop = r.image.chunk_end(at, stop)
            ids = np.asarray(context[at:stop], np.int64)[None, :]
            batch = ModelInput.rows(r.slot, ids, kv.lengths[r.slot:r.slot + 1], logits=ids.shape[1],
                                    images=_images(r, at, at + ids.shape[1]))
            tail = self.backend.to_host(self.run_step(batch))  # [seq, vocab]: j predicts the token after ids[j]
            kv.advance(r.slot, ids.shape[1])
            for j in range(ids.shape[1]):
                if at + j + 1 < len(r.prompt_ids):
                    r.prompt_logprobs.append(score_prompt(tail[j:j + 1], r.prompt_ids[at + j + 1],
                                                          r.params.prompt_logprobs))
            logits = tail[-1:]  # [1, vocab]
            at = stop
        return logits

    def reprefill(self, active: dict[int, RequestState], events: list[Event]) -> None:
        """longrope: a sequence reaching the switch length is recomputed with the long factors."""
        kv = self.backend.kv
        if self.backend.reprefill_after is None:
            return
        for slot, r in list(active.items()):
            # a beam search keeps the short factors throughout (its beams would each need the recompute)
            if r.beams is None and kv.length(slot) == self.backend.reprefill_after:
                kv.rewind(slot, 0)
                self.prefill(r, events)
                if r.slot is None:
                    del active[slot]

    def decode(self, active: dict[int, RequestState], events: list[Event], clock: StepClock | None = None) -> None:
        """The loop's decode step over `active` (slot -> request), as the decode policy runs it."""
        self.decoding.decode(self, active, events, clock)

    def decode_batch(self, active: dict[int, RequestState], events: list[Event],
                     clock: StepClock | None = None) -> None:
        """One engine call feeding every active request its last token; finished ones leave `active`.
        The step is a ModelInput of the active slots only; a slot engine runs it over [lowest, highest]
        (SlotRows), where inactive slots ride along (free, or mid-way through a chunked prefill): each
        writes one junk entry at its own length, which that slot's next prefill overwrites first, and its
        logits are dropped."""
        started = time.perf_counter()
        execute_before = self.backend.execute_seconds
        slots = sorted(active)
        for s in slots:  # grammar masks are computed in a worker while the engine runs
            if active[s].sampling.grammar is not None:
                active[s].sampling.grammar.prefetch()
        at = np.asarray(slots, np.int64)
        logits = self.run_step(ModelInput.decode(at, self.next_ids[at, 0], self.backend.kv.lengths[at]))
        rows = [active[s] for s in slots]
        sampled = [i for i, r in enumerate(rows) if r.beams is None]
        if sampled:
            requests = [rows[i] for i in sampled]
            sample = self.sampler(logits if len(sampled) == len(rows) else logits[sampled],
                                  [r.sampling for r in requests])
            for r, token, lp in zip(requests, sample.token_ids, sample.logprobs):
                self.backend.kv.advance(r.slot, 1)
                self.accept(r, int(token), lp, events)
        if len(sampled) < len(rows):
            host = self.backend.to_host(logits)  # [rows, vocab]
            row_of = {s: i for i, s in enumerate(slots)}
            for r in {r.index: r for r in rows if r.beams is not None}.values():
                for s in r.beam_slots:
                    self.backend.kv.advance(s, 1)
                self._beam_step(r, host[[row_of[s] for s in r.beam_slots]], events)
        drop_finished(active)
        if clock is not None:
            clock.decode_step(time.perf_counter() - started, self.backend.execute_seconds - execute_before,
                              len(sampled) + len({r.index for r in rows if r.beams is not None}))

    def accept(self, r: RequestState, token: int, logprobs: TokenLogprobs | None, events: list[Event]) -> None:
        r.token_ids.append(token)
        r.sampling.append(token)
        if r.logprobs is not None and logprobs is not None:
            r.logprobs.append(logprobs)
        out = r.stop.step(token)
        if out.finished:
            r.finish_reason, r.stop_reason, r.text = out.finish_reason, out.stop_reason, r.stop.text
            if self.cache_outputs and self.prefix_cache is not None:  # the slot holds prompt + output but the last
                self.prefix_cache.store([*r.cache_prompt, *r.token_ids], r.slot)
            self.release(r)
        else:
            self.next_ids[r.slot, 0] = token
        events.append(Event(r.index, out.text, out.finished, token, logprobs))

    def _beam_step(self, r: RequestState, logits: np.ndarray, events: list[Event]) -> None:
        """Advance r's beam search by the beams' logits [beams, vocab]: each beam's cache follows its parent and
        feeds its token next step; when the search ends, the best hypothesis is r's answer and its slots go back."""
        step = r.beams.step(logits)
        if step.done:
            events += _finish_beams(r)
            self.release(r)
            return
        slots = r.beam_slots
        if not np.array_equal(step.parents, np.arange(len(slots))):
            self.backend.copy_slots([slots[p] for p in step.parents], slots)
        self.next_ids[list(slots), 0] = step.tokens
        r.token_ids = r.beams.leading

    def release(self, r: RequestState) -> None:
        """Give r's slots back (finished, cancelled or failed): their cache rows return to zeros."""
        self.clear_slots([r], r.give_back(self.backend.kv))

    def clear_slots(self, requests: Sequence[RequestState], freed: Sequence[tuple[int, int]]) -> None:
        """These requests' slots were freed in the KV manager (freed: slot, positions written; by release, or by
        the scheduler preempting them): drop what the decode policy keeps for them, and clear what lies beside the
        KV manager (the slots' next tokens; a device cache's rows)."""
        for r in requests:
            self.decoding.release(r)
        for slot, used in freed:
            self.next_ids[slot, 0] = 0  # an idle row feeds token 0 at length 0
            self.backend.zero_rows(slot, used)


def drop_finished(active: dict[int, RequestState]) -> None:
    """Leave out of ACTIVE (slot -> request) the requests that released their slot this step."""
    for slot in [s for s, r in active.items() if r.slot is None]:
        del active[slot]


def _finish_beams(r: RequestState) -> list[Event]:
    """A search's best hypothesis through the request's StopChecker (text, stop strings, finish reason): its tokens'
    events all at once, as a stream sees them when the search ends."""
    tokens, logprobs = r.beams.best()
    events = []
    for i, t in enumerate(tokens):
        out = r.stop.step(t)
        events.append(Event(r.index, out.text, out.finished, t, logprobs[i] if logprobs is not None else None))
        if out.finished:
            tokens = tokens[:i + 1]
            r.finish_reason, r.stop_reason = out.finish_reason, out.stop_reason
            break
    else:  # ended by the search without a stop token (cannot happen: the last step always hits)
        r.finish_reason = "length"
        events[-1] = dataclasses.replace(events[-1], finished=True)
    r.token_ids, r.text = tokens, r.stop.text
    if logprobs is not None:
        r.logprobs = logprobs[:len(tokens)]
    return events


def _images(r: RequestState, start: int, end: int) -> ImageEmbeds | None:
    """The image features a one-row prefill of r's context [start, end) splices in, if any."""
    if r.image is None:
        return None
    at, embeds = r.image.features_for(start, end)
    return ImageEmbeds(at, embeds) if len(at) else None

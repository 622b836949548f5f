"""Draft-model proposer: a second, smaller or quantized engine dir with the target's tokenizer drafts k
tokens autoregressively; the target verifies them in one step.

The draft keeps one KV slot per running request in its own backend. Before drafting it feeds the tokens
of the request's context it has not seen (the prompt at first, then the tokens the last verify step
emitted); draft positions that the target rejected are rewound first, so the draft cache always holds a
prefix of the true context. A request the draft cannot hold (all its slots busy, or a prompt longer
than its max_seq_len) simply gets no drafts and decodes plainly.

A finished request's draft slot stays filled ("parked"): the next request whose context starts with the same
tokens (the same system prompt, a chat's next turn, a repeated prompt) takes it over and feeds only what
differs, as the target's prefix cache spares the target. Without it the draft re-read every prompt: 70 ms
of a 1.4 s story at k=4 (5 %, benchmarks/speculative.py --parts breakdown). A parked slot is freed when a
request needs a slot and none is free.

Greedy requests draft the draft's argmax (a one-hot q). With stop_margin (the adaptive draft length's
default) a proposal ends at a token whose two best logits lie within stop_margin of each other: a quantized
build of the target diverges from it where the target's choice is a near tie that rounding flips. SmolLM2's
int4 draft over four stories (benchmarks/results/spec-replay-2026-11-26T1428.txt): of 380 first drafts 11 were
wrong, 10 of those were near ties (margin < 0.2), and so were 33 right ones: a near tie fails 23 % of the time,
any draft 3 %. Ending the proposal there (the near tie still drafted: its logits are paid for) spares the doomed
tail; simulated, that gave the adaptive length +3-7 %. The proposer checks that rule as it goes: it keeps decayed
counts of how often its near-tie drafts survived verification (seen at the next proposal, from the context), and
stops at near ties only while at least NEAR_TIE_FAILS of them fail, so a draft that is the target itself, or one
whose near ties are right anyway, drafts on.
Sampled requests draft from the draft's own
temperature / top-k / top-p / min-p distribution (penalties left out: they only change how often
drafts survive, never the output distribution) and report it as q for the rejection rule.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np

from engine_builder.runner.backend_choice import open_backend
from engine_builder.runner.engine import EngineDir
from engine_builder.runner.request_state import RequestState
from engine_builder.runner.sampler import Sampler, SamplingState
from engine_builder.runner.speculative.acceptance import draw, probabilities
from engine_builder.runner.speculative.proposer import NO_PROPOSAL, Proposal
from engine_builder.runner.tunables import NEAR_TIE_DECAY, NEAR_TIE_FAILS, NEAR_TIE_PRIOR
from engine_builder.util.errors import CapacityError, InputError, UnsupportedError


class DraftProposer:
    name = "draft"
    record_margins = False  # keep the margin of every drafted greedy token in self.margins (benchmarks)
    park = True  # keep a finished request's slot for the next request's common prefix (False: free it)

    def __init__(self, engine_dir: str | Path, target_tokenizer, target_vocab: int, backend: str = "auto",
                 threads: int | None = None, seed: int | None = None, stop_margin: float | None = None) -> None:
        engine = EngineDir.load(engine_dir)
        tokenizer = engine.load_tokenizer()
        if tokenizer.get_vocab() != target_tokenizer.get_vocab():
            raise InputError(f"the draft engine {engine_dir} has another tokenizer than the target; draft with an "
                             "engine built from a model of the same tokenizer (an int4 build of the same checkpoint)")
        self.backend, _ = open_backend(engine, backend, threads=threads)
        if self.backend.vocab_size != target_vocab:
            raise InputError(f"the draft engine {engine_dir} has {self.backend.vocab_size} logits per token, the "
                             f"target {target_vocab}; draft with a model of the same vocabulary")
        if self.backend.reprefill_after is not None:
            raise UnsupportedError(f"the draft engine {engine_dir} is a longrope model that re-prefills past "
                                   f"{self.backend.reprefill_after} tokens; draft with another model")
        self._fed: dict[int, list[int]] = {}  # id(request) -> the tokens its draft slot holds, in order
        self._parked: dict[int, list[int]] = {}  # the slot keys of finished requests -> the tokens they hold
        self._parked_keys = 0  # the last parked key given out: -1, -2, ...
        self._states: dict[int, SamplingState] = {}  # id(request) -> its penalty-free sampling warps
        self._sampler = Sampler()
        self._rng = np.random.default_rng(seed)
        self.seconds = 0.0  # time spent drafting, summed
        self.timed_tokens = 0  # the single-token draft steps that self.seconds covers
        self.stop_margin = stop_margin  # None: a greedy proposal drafts the k asked for
        self.margins: list[float] = []  # the last proposal's top-2 logit margins, with record_margins
        # near-tie drafts: decayed (survived, judged) counts, and per request the last proposal with near ties,
        # not yet judged: (its context length, its tokens, the indices of its near ties)
        self.near_ties = NEAR_TIE_PRIOR
        self._near: dict[int, tuple[int, tuple[int, ...], list[int]]] = {}
        # a proposal's first draft token comes from its catch-up step (the tokens the last verify step emitted,
        # 1-2 of them: a 2-token step cost 44 ms beside 23 ms for one on the gguf draft), the others from
        # single-token steps: timed apart, so a short draft is not judged by its catch-up alone
        self.catchup_seconds = 0.0
        self.catchups = 0

    def propose(self, request: RequestState, k: int) -> Proposal:
        return self._propose(request, k)

    def _propose(self, request: RequestState, k: int) -> Proposal:
        kv, key = self.backend.kv, id(request)
        context = request.prompt_ids + request.token_ids
        self._judge_near_ties(key, context)
        slot = kv.slot_of(key)
        if slot is None:
            slot = self._take_slot(request, context)
            if slot is None:
                return NO_PROPOSAL
        fed = self._fed[key]
        # feed at least one token: its logits start the draft
        common = min(_common_prefix(fed, context), len(context) - 1)
        if common < len(fed):
            kv.rewind(slot, common)  # the rejected draft positions: zeroed, length back
            del fed[common:]
        # self.seconds is what the adaptive draft length weighs per drafted token: the drafting loop and a
        # steady-state catch-up (the last verify step's correction or bonus token), not a first prefill or
        # the catch-up after plain steps, which would make drafting look dear and switch it off for good
        started = time.perf_counter()
        steady = len(context) - common <= 2
        logits = None
        for start in range(common, len(context), self.backend.max_input_len):
            chunk = context[start:start + self.backend.max_input_len]
            logits = self.backend.step(slot, np.asarray([chunk], np.int64))  # [1, vocab]
            kv.advance(slot, len(chunk))
            fed += chunk
        # after a catch-up of many tokens (plain steps in between) even the first single-token draft step is
        # slow (measured 80-100 ms vs ~20 ms steady: onnxruntime re-plans for the shape), so such a proposal
        # is not timed at all: its cost would keep the adaptive length at plain steps (draft_length.py)
        greedy = request.params.greedy
        state = None if greedy else self._states.get(key)
        if state is None and not greedy:
            state = self._states[key] = SamplingState(dataclasses.replace(
                request.params, repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0),
                (), self.backend.vocab_size)
        rng = request.sampling.rng if request.sampling.rng is not None else self._rng
        if steady:
            self.catchup_seconds += time.perf_counter() - started
            self.catchups += 1
            started = time.perf_counter()
        tokens, probs, steps, near = [], [], 0, []
        margins = greedy and (self.stop_margin is not None or self.record_margins)
        stop = self.stop_margin is not None and self.near_ties[0] <= (1 - NEAR_TIE_FAILS) * self.near_ties[1]
        self.margins = []
        for j in range(k):
            tie = False
            if greedy:
                token = int(np.argmax(logits[0]))
                if margins:
                    top2 = np.partition(logits[0], -2)[-2:]
                    self.margins.append(float(top2[1] - top2[0]))
                    tie = self.stop_margin is not None and self.margins[-1] < self.stop_margin
                    if tie:
                        near.append(j)
            else:
                q = probabilities(self._sampler.process(logits, [state])[0])
                token = draw(q, rng)
                probs.append(q)
            tokens.append(token)
            if tie and stop:
                # likely where the target goes the other way. This token is drafted still (its logits are paid
                # for, and a verify step one token wider costs little), the next ones are not
                break
            if j + 1 < k:
                logits = self.backend.step(slot, np.asarray([[token]], np.int64))
                kv.advance(slot, 1)
                fed.append(token)
                steps += 1
        if steady:
            self.seconds += time.perf_counter() - started
            self.timed_tokens += steps
        if near:
            self._near[key] = (len(context), tuple(tokens), near)
        return Proposal(tuple(tokens), np.stack(probs) if probs else None)

    def _judge_near_ties(self, key: int, context: list[int]) -> None:
        """Count the last proposal's near-tie drafts that verification judged: those up to the first rejected
        draft, which context now tells (kept: the target emitted the same token there)."""
        last = self._near.pop(key, None)
        if last is None:
            return
        start, tokens, near = last
        survived, judged = self.near_ties
        accepted = _common_prefix(list(tokens), context[start:])
        for i in near:
            if i > accepted or start + i >= len(context):  # after the first rejected draft: never verified
                break
            kept = i < accepted
            survived, judged = NEAR_TIE_DECAY * survived + kept, NEAR_TIE_DECAY * judged + 1
        self.near_ties = survived, judged

    def _take_slot(self, request: RequestState, context: list[int]) -> int | None:
        """A draft slot for a new request: the parked slot sharing the longest prefix with its context (kept
        under the request's key, its tokens still fed), else a fresh one; None when the draft cannot hold it."""
        kv, key = self.backend.kv, id(request)
        needed = len(request.prompt_ids) + request.params.max_new_tokens
        best, best_common = None, 0
        for parked, tokens in self._parked.items():
            common = _common_prefix(tokens, context)
            if common > best_common and kv.reserved(kv.slot_of(parked)) >= needed:
                best, best_common = parked, common
        if best is not None:
            slot = kv.slot_of(best)
            tokens = self._parked.pop(best)
            kv.hand_over(slot, key)
            self._fed[key] = tokens
            return slot
        if not kv.num_free and self._parked:  # the oldest parked slot makes room
            self._free_parked(next(iter(self._parked)))
        if not kv.num_free:
            return None
        new_tokens = request.params.max_new_tokens
        if kv.reservation_is_free and needed <= kv.max_seq:
            # a slot's storage holds max_seq positions anyway: reserve them all, so a longer next request
            # (a chat's next turn) can take this slot over when it is parked
            new_tokens = kv.max_seq - len(request.prompt_ids)
        try:
            slot = kv.allocate(key, len(request.prompt_ids), new_tokens)
        except CapacityError:  # longer than the draft's max_seq_len: this request decodes plainly
            return None
        self._fed[key] = []
        return slot

    def release(self, request: RequestState) -> None:
        key = id(request)
        slot = self.backend.kv.slot_of(key)
        fed = self._fed.pop(key, None)
        self._states.pop(key, None)
        self._near.pop(key, None)
        if slot is None:
            return
        if fed and self.park:  # parked under a key no live request has (negative: id() never is, and it may recur)
            self._parked_keys -= 1
            self.backend.kv.hand_over(slot, self._parked_keys)
            self._parked[self._parked_keys] = fed
        else:
            self.backend.release(slot)

    def forget_parked(self) -> None:
        """Free every parked slot: the next request is fed its whole context (what the retired spec_replay study
        compared against parking)."""
        for parked in list(self._parked):
            self._free_parked(parked)

    def _free_parked(self, parked: int) -> None:
        del self._parked[parked]
        self.backend.release(self.backend.kv.slot_of(parked))

    def close(self) -> None:
        self.backend.close()


def _common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens a and b share."""
    common = 0
    for x, y in zip(a, b):
        if x != y:
            break
        common += 1
    return common

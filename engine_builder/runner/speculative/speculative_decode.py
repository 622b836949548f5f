"""Speculative decoding as the one loop's decode policy: propose, verify, accept (Generator(decoding=...)).

For each running request, a proposer (ngram.py, draft.py) offers up to k tokens; the target engine then
runs ONE step over [last token, d1..dk] at the request's cache length (the graph's logits_tail gives the
logits of all k+1 positions) and acceptance.py decides, position by position, which tokens survive: the
accepted drafts, then the target's own token (a correction, or a bonus after k accepted drafts). Each
emitted token goes through the same Generator.accept as plain decoding (stop tokens, stop strings, max tokens,
logprobs, streaming events), so those behave exactly as without speculation.

KV rollback: the step writes all k+1 positions, but the slot's length advances only by the tokens that
were kept; rejected positions lie past the length, masked, and the next step overwrites them first
(tests/runner/test_speculative_verify.py). The cache manager never counts them, so nothing leaks.

Requests with drafts verify together: ONE engine step over the slot range they span, each row
[last token, its drafts] padded to the longest row (padding, like rejected drafts, lies past the row's
length: masked, overwritten first), rows between them riding along on padding as in a plain decode
step. A single request with drafts, or a batch that cannot take the padded width (a row too near
max_seq, a longrope model), verifies row by row. Requests with no drafts this step share one plain
batched decode step, so a seeded request's draws never depend on what else shares the batch.
"""

from __future__ import annotations

import time

import numpy as np

from engine_builder.runner.backend import Backend
from engine_builder.runner.core.model_input import ModelInput
from engine_builder.runner.generate import Generator
from engine_builder.runner.request_state import Event, RequestState, StepClock
from engine_builder.runner.speculative.acceptance import bonus_token, verify_token
from engine_builder.runner.speculative.draft_length import DraftLength, StepCosts
from engine_builder.runner.speculative.proposer import NO_PROPOSAL, Proposal, Proposer
from engine_builder.runner.speculative.speculative_config import SpeculativeConfig
from engine_builder.runner.speculative.stats import SpeculativeStats
from engine_builder.util.errors import UnsupportedError


class SpeculativeDecode:
    """The DecodePolicy (generate.py) of LLM(..., speculative=...): each step, requests with drafts verify them,
    the others decode in the Generator's plain batched step. Its stats and proposer are what a caller reads
    (LLM.speculation)."""

    def __init__(self, backend: Backend, *, config: SpeculativeConfig, proposer: Proposer,
                 seed: int | None = None) -> None:
        self.backend = backend
        if backend.logits_tail < 2:
            raise UnsupportedError("this engine's steps return the last position's logits only, so it cannot verify "
                                   "drafts; rebuild it with this trtbuild (`trtbuild build <ckpt-dir> <engine-dir> "
                                   "--force`, logits_tail 16 by default)")
        self.config, self.proposer = config, proposer
        # k drafts + the last token must fit one step's logits and one multi-token step
        self.cap = max(0, min(config.draft_cap, backend.logits_tail - 1, backend.max_input_len - 1))
        self.step_tokens = self.cap + 1  # a verify step writes the last token and up to cap drafts
        # measured step costs per number of requests decoding together: at batch 4 a plain step and a verify
        # step of w tokens a row cost other multiples of batch 1's, and the draft length weighs those
        self._costs: dict[int, StepCosts] = {}
        self.costs = StepCosts()
        self.stats = SpeculativeStats(proposer.name)
        self._lengths: dict[int, DraftLength] = {}  # id(request) -> its draft length controller
        # the last finished request's controller: a new request starts from its acceptance counts, not from
        # alpha 0.5 (from 0.5 a gguf draft at 100 % acceptance spent a whole second story on plain steps and
        # sparse probes)
        self._prior = DraftLength(self.cap, config.adaptive)
        self._rng = np.random.default_rng(seed)  # acceptance draws of requests without their own seed

    def begin(self) -> None:
        self.stats = SpeculativeStats(self.proposer.name)  # per run, like Generator.timings

    def decode(self, gen: Generator, active: dict[int, RequestState], events: list[Event],
               clock: StepClock | None = None) -> None:
        costs = self._costs.get(len(active))
        if costs is None:  # a new batch size: its steps are measured afresh; the proposer's cost carries over
            costs = self._costs[len(active)] = StepCosts(draft_token=self.costs.draft_token,
                                                         draft_first=self.costs.draft_first)
        self.costs = costs
        plain: dict[int, RequestState] = {}
        drafted: dict[int, tuple[RequestState, DraftLength, Proposal]] = {}
        draft_backend = getattr(self.proposer, "backend", None)  # a draft model's: its engine time is engine time
        started = time.perf_counter()
        execute_before = draft_backend.execute_seconds if draft_backend is not None else 0.0
        for slot in sorted(active):
            r = active[slot]
            if r.beams is not None:  # a beam search's rows decode in the plain step (nothing to verify)
                plain[slot] = r
                continue
            control = self._lengths.get(id(r))
            if control is None:
                control = self._lengths[id(r)] = self._prior.successor()
            proposal = self._propose(r, control)
            if not proposal.tokens:
                control.observe(0, 0)
                plain[slot] = r
                continue
            drafted[slot] = (r, control, proposal)
        if clock is not None:  # decode tok/s counts the drafting, not just the verify steps
            clock.proposing(time.perf_counter() - started,
                            draft_backend.execute_seconds - execute_before if draft_backend is not None else 0.0)
        riders = {slot: (r, self._lengths[id(r)], NO_PROPOSAL) for slot, r in plain.items()
                  if r.params.greedy and r.beams is None}
        if drafted and riders and self._fits_together({**drafted, **riders}):
            # greedy requests without drafts take their token from the verify step's first position rather than
            # from a second, plain engine call (sampled ones keep theirs: the plain step's draws are their own)
            drafted = dict(sorted({**drafted, **riders}.items()))
            for slot in riders:
                del plain[slot]
        if len(drafted) > 1 and self.config.adaptive and all(r.params.greedy for r, _, _ in drafted.values()):
            drafted = self._common_width(drafted)
            if not any(p.tokens for _, _, p in drafted.values()):  # a plain step is the better deal
                plain.update((slot, r) for slot, (r, _, _) in drafted.items())
                plain = dict(sorted(plain.items()))
                drafted = {}
        if len(drafted) > 1 and self._fits_together(drafted):
            self._verify_batch(gen, drafted, events, clock)
        else:
            for r, control, proposal in drafted.values():
                control.observe(len(proposal.tokens), self._verify(gen, r, proposal, events, clock), proposal.match)
        for slot, (r, _, _) in drafted.items():
            if r.slot is None:
                del active[slot]
        if len(plain) == 1:  # (a beam search has two rows or more)
            (slot, r), = plain.items()
            self._verify(gen, r, NO_PROPOSAL, events, clock)  # one row at its own slot: a plain step, timed as t1
            if r.slot is None:
                del active[slot]
        elif plain:
            running, started = list(plain), time.perf_counter()
            gen.decode_batch(plain, events, clock)  # one batched step; verified rows ride along harmlessly
            self.costs.observe_plain(time.perf_counter() - started)  # a batch of one-token rows costs about t1
            self.stats.plain_steps += 1
            for slot in running:
                if slot not in plain:  # finished in that step
                    del active[slot]

    def _common_width(self, drafted: dict[int, tuple[RequestState, DraftLength, Proposal]]
                      ) -> dict[int, tuple[RequestState, DraftLength, Proposal]]:
        """Every row of a batched verify step pays for the longest row's width: the width W with the most
        expected tokens per second over all rows (each row's drafts cut to W - 1, its own acceptance rate),
        measured costs of this batch size. At batch 4 on a 2-core CPU a step is compute-bound: a width-8
        verify step costs about four plain ones, so one row's long copy must not make the others pay for it."""
        widths = sorted({len(p.tokens) + 1 for _, _, p in drafted.values()} | {1})
        best_w, best_rate = widths[-1], -1.0
        for w in widths:
            tokens = 0.0
            for _, control, p in drafted.values():
                tokens += control.expected_tokens(min(len(p.tokens), w - 1), p.match)
            rate = tokens / max(self.costs.verify(w) if w > 1 else (self.costs.t1 or 0.0), 1e-9)
            if rate > best_rate:
                best_w, best_rate = w, rate
        if best_w == widths[-1]:
            return drafted
        cut = {}
        for slot, (r, control, p) in drafted.items():
            k = min(len(p.tokens), best_w - 1)
            cut[slot] = (r, control, Proposal(p.tokens[:k], None if p.probs is None else p.probs[:k], p.match))
        return cut

    def _propose(self, r: RequestState, control: DraftLength) -> Proposal:
        """r's drafts for this step. A cheap proposer (ngram: a lookup) proposes first, and its match length
        picks the draft length; a draft model drafts only the length chosen before, each token a model step."""
        room = self._room(r)
        if getattr(self.proposer, "cheap", False):
            proposal = self.proposer.propose(r, min(self.cap, room)) if self.cap and room > 0 else NO_PROPOSAL
            k = control.choose(self.costs, min(room, len(proposal.tokens)), proposal.match) if proposal.tokens else 0
            return Proposal(proposal.tokens[:k], None if proposal.probs is None else proposal.probs[:k],
                            proposal.match) if k else NO_PROPOSAL
        k = control.choose(self.costs, room)
        if not k:
            return NO_PROPOSAL
        started, before = time.perf_counter(), getattr(self.proposer, "seconds", None)
        timed_before = getattr(self.proposer, "timed_tokens", 0)
        catchups_before = getattr(self.proposer, "catchups", 0)
        catchup_before = getattr(self.proposer, "catchup_seconds", 0.0)
        proposal = self.proposer.propose(r, k)
        if before is None:
            self.costs.observe_proposal(len(proposal.tokens), time.perf_counter() - started)
        else:  # the proposer times its own steady drafting only (draft.py); an untimed proposal is no sample
            if self.proposer.catchups > catchups_before:
                self.costs.observe_catchup(self.proposer.catchup_seconds - catchup_before)
            self.costs.observe_proposal(self.proposer.timed_tokens - timed_before, self.proposer.seconds - before)
        return proposal

    def _room(self, r: RequestState) -> int:
        """Most drafts r may take now: its remaining tokens (the step then writes at most up to the slot's
        reservation, prompt + max_new_tokens), and before a longrope switch."""
        limit = r.params.max_new_tokens - len(r.token_ids)
        switch = self.backend.reprefill_after
        length = self.backend.kv.length(r.slot)
        if switch is not None and length < switch:  # every position of the step must use the same rope table
            limit = min(limit, switch - length - 1)
        return limit

    def _fits_together(self, drafted: dict[int, tuple[RequestState, DraftLength, Proposal]]) -> bool:
        """Can one step of width max(k) + 1 run over every slot from the first drafted to the last?"""
        if self.backend.reprefill_after is not None:  # a padded row could cross the rope switch
            return False
        width = max(len(p.tokens) for _, _, p in drafted.values()) + 1
        kv = self.backend.kv  # lengths, not length(): a free slot between two drafted ones rides along at 0
        return bool((kv.lengths[min(drafted):max(drafted) + 1] + width <= kv.max_seq).all())

    def _verify_batch(self, gen: Generator, drafted: dict[int, tuple[RequestState, DraftLength, Proposal]],
                      events: list[Event], clock: StepClock | None) -> None:
        """One engine step verifying every drafted request (see the module docstring), then each row's acceptance."""
        started, execute_before = time.perf_counter(), self.backend.execute_seconds
        lo, hi = min(drafted), max(drafted) + 1
        width = max(len(p.tokens) for _, _, p in drafted.values()) + 1
        ids = np.zeros((hi - lo, width), np.int64)  # rows riding along, and the padding: token 0
        ids[:, 0] = gen.next_ids[lo:hi, 0]
        for slot, (_, _, proposal) in drafted.items():
            ids[slot - lo, 1:len(proposal.tokens) + 1] = proposal.tokens
        batch = ModelInput.rows(lo, ids, self.backend.kv.lengths[lo:hi], logits=width)
        logits = self.backend.to_host(gen.run_step(batch)).reshape(hi - lo, width, -1)  # [rows, width, vocab]
        emitted = 0
        for slot, (r, control, proposal) in drafted.items():
            accepted, kept = self._settle(gen, r, proposal, logits[slot - lo, :len(proposal.tokens) + 1], events)
            if proposal.tokens:  # a rider's plain step was observed when it proposed nothing
                control.observe(len(proposal.tokens), accepted, proposal.match)
            emitted += kept
        seconds = time.perf_counter() - started
        self.costs.observe_verify(width, seconds)
        self.stats.batched_verify_steps += 1
        if clock is not None:
            clock.decode_step(seconds, self.backend.execute_seconds - execute_before, emitted)

    def _verify(self, gen: Generator, r: RequestState, proposal: Proposal, events: list[Event],
                clock: StepClock | None) -> int:
        """One engine step over [last token, *drafts] at r's slot; emits the kept tokens; how many drafts survived."""
        started, execute_before = time.perf_counter(), self.backend.execute_seconds
        slot, drafts = r.slot, proposal.tokens
        ids = np.empty((1, len(drafts) + 1), np.int64)
        ids[0, 0] = gen.next_ids[slot, 0]
        ids[0, 1:] = drafts
        batch = ModelInput.rows(slot, ids, self.backend.kv.lengths[slot:slot + 1], logits=ids.shape[1])
        logits = self.backend.to_host(gen.run_step(batch))  # [k+1, vocab]: i predicts the token after ids[i]
        accepted, emitted = self._settle(gen, r, proposal, logits, events)
        seconds = time.perf_counter() - started
        if drafts:
            self.costs.observe_verify(len(drafts) + 1, seconds)
        else:
            self.costs.observe_plain(seconds)
            self.stats.plain_steps += 1
        if clock is not None:
            clock.decode_step(seconds, self.backend.execute_seconds - execute_before, emitted)
        return accepted

    def _settle(self, gen: Generator, r: RequestState, proposal: Proposal, logits: np.ndarray,
                events: list[Event]) -> tuple[int, int]:
        """r's verdict on its drafts from the step's logits [k+1, vocab] (position i predicts the token after
        input i): the kept tokens emitted, the cache advanced by them; (drafts accepted, tokens emitted)."""
        slot, drafts = r.slot, proposal.tokens
        greedy = r.params.greedy
        rng = r.sampling.rng if r.sampling.rng is not None else self._rng
        accepted = emitted = 0
        for i in range(len(drafts) + 1):
            raw = logits[i:i + 1]  # [1, vocab]
            processed = gen.sampler.process(raw, [r.sampling])  # penalties see every token kept so far
            if i < len(drafts):
                q = None if proposal.probs is None else proposal.probs[i]
                token, kept = verify_token(processed[0], drafts[i], q, greedy, rng)
            else:
                token, kept = bonus_token(processed[0], greedy, rng), False
            logprobs = None
            if r.logprobs is not None:
                logprobs = gen.sampler._logprobs(raw, processed, np.array([token]), [r.sampling])[0]
            self.backend.kv.advance(slot, 1)  # ids[i] is context now: the cache keeps its position
            accepted += kept
            emitted += 1
            gen.accept(r, token, logprobs, events)
            if not kept or r.slot is None:
                break
        if drafts:
            self.stats.verify_steps += 1
            self.stats.draft_tokens += len(drafts)
            self.stats.accepted_tokens += accepted
            self.stats.emitted_tokens += emitted
        return accepted, emitted

    def release(self, r: RequestState) -> None:
        """r left the loop (finished, cancelled, preempted): its proposer state and draft length go."""
        self.proposer.release(r)
        control = self._lengths.pop(id(r), None)
        if control is not None and control.accepted:
            self._prior = control

    def close(self) -> None:
        self.proposer.close()

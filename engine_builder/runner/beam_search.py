"""Beam search for one request, a numpy port of transformers' GenerationMixin._beam_search (v5).

Same rules, so the same output as HF `generate(num_beams=..., do_sample=False)`:
  * scores are accumulated float32 log_softmax(logits); beam 0 starts at 0, the others at -1e9
    so the first step does not pick the same token num_beams times
  * each step keeps the top K = max(2, 1 + #stop ids) * num_beams continuations over all beams,
    so at least num_beams survive when some end; the best num_beams unfinished ones run on
  * a continuation ends on a stop id (EOS or stop_token_ids) or at max_new_tokens; one of the
    top num_beams that ends enters the finished set with score sum_logprobs / len ** length_penalty
    (len = generated tokens, the stop token included)
  * early_stopping=True stops once num_beams hypotheses finished; False uses HF's heuristic
    (stop when the best running beam, at its current length, cannot beat the worst finished one)
Sampling warpers (temperature, top_k/top_p/min_p) and penalties do not apply: this is HF's
beam search with do_sample=False. Stop strings cut the final text (and its tokens) but do not
steer the search.

BeamSearch is the search alone, one step at a time over the beams' logits; the step loop runs it (generate.py):
each beam is a KV slot, the prompt is prefilled once into the first and copied (a paged cache: forked) to the
others, every beam feeds its token in the step's one batched decode beside sampled requests, and the caches are
reordered (copy_slots) whenever beams swap parents.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from engine_builder.runner.logits_processors import log_softmax
from engine_builder.runner.sampler import TokenLogprobs
from engine_builder.runner.sampling_params import SamplingParams

NEG = np.float32(-1e9)  # HF's "impossible" score


@dataclass(frozen=True)
class BeamStep:
    parents: np.ndarray  # [beams] the beam each continues: its KV cache follows that beam's
    tokens: np.ndarray  # [beams] the token each beam feeds next
    done: bool  # the search ended: best() is the answer


class BeamSearch:
    """One request's beams, advanced by step() over their logits."""

    def __init__(self, params: SamplingParams, eos_token_ids: Collection[int], vocab_size: int) -> None:
        beams, max_new = params.num_beams, params.max_new_tokens
        self.beams, self.max_new, self.length_penalty = beams, max_new, params.length_penalty
        self.early_stopping, self.top_n = params.early_stopping, params.logprobs
        stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
        self.stop_lookup = np.zeros(vocab_size, bool)  # [vocab]
        self.stop_lookup[[t for t in stop_ids if t < vocab_size]] = True
        self.keep = max(2, 1 + len(stop_ids)) * beams
        self.cur = 0  # tokens generated per beam so far
        self.running_tokens = np.zeros((beams, max_new), np.int64)  # [beams, max_new] generated so far
        self.running_scores = np.full(beams, NEG, np.float32)
        self.running_scores[0] = 0  # the first step must not pick the same token num_beams times
        self.running_lp: list[list[TokenLogprobs]] = [[] for _ in range(beams)]
        self.done_tokens = np.zeros((beams, max_new), np.int64)
        self.done_len = np.zeros(beams, np.int64)
        self.done_scores = np.full(beams, NEG, np.float32)
        self.done = np.zeros(beams, bool)
        self.done_lp: list[list[TokenLogprobs]] = [[] for _ in range(beams)]
        self.improvable = True  # HF's is_early_stop_heuristic_unsatisfied
        self.top_beams = np.arange(self.keep) < beams  # only the top num_beams of the K may finish

    def step(self, logits: np.ndarray) -> BeamStep:
        """Advance every beam by one token, given each beam's next-token logits [beams, vocab] (host)."""
        beams, cur = self.beams, self.cur
        logp = log_softmax(logits)  # [beams, vocab] float32
        vocab = logp.shape[1]
        total = (logp + self.running_scores[:, None]).reshape(-1)  # [beams * vocab]
        cand = np.argpartition(-total, self.keep - 1)[:self.keep]
        cand = cand[np.argsort(-total[cand], kind="stable")]  # K best, best first
        cand_scores = total[cand]  # [K]
        parent, token = cand // vocab, cand % vocab
        cand_tokens = self.running_tokens[parent]  # [K, max_new]
        cand_tokens[:, cur] = token
        hits = self.stop_lookup[token] | (cur + 1 >= self.max_new)  # [K] this continuation ends here
        cand_lp = (_candidate_logprobs(logp, parent, token, self.top_n, self.running_lp)
                   if self.top_n is not None else None)

        # the best unfinished continuations run on
        run_scores = cand_scores + hits.astype(np.float32) * NEG
        nxt = _top(run_scores, beams)
        self.running_tokens, self.running_scores, src = cand_tokens[nxt], run_scores[nxt], parent[nxt]
        if cand_lp is not None:
            self.running_lp = [cand_lp[i] for i in nxt]

        # finished hypotheses: merge the new ones with the old, keep the best num_beams
        fin = cand_scores / np.float32((cur + 1) ** self.length_penalty)
        if self.done.all() and self.early_stopping:
            fin = fin + NEG
        if not self.improvable:
            fin = fin + NEG
        fin = fin + (~(hits & self.top_beams)).astype(np.float32) * NEG
        merged_scores = np.concatenate([self.done_scores, fin.astype(np.float32)])
        pick = _top(merged_scores, beams)
        old = pick < beams
        new = pick - beams
        self.done_tokens = np.where(old[:, None], self.done_tokens[np.minimum(pick, beams - 1)],
                                    cand_tokens[np.maximum(new, 0)])
        self.done_len = np.where(old, self.done_len[np.minimum(pick, beams - 1)], cur + 1)
        self.done = np.where(old, self.done[np.minimum(pick, beams - 1)], (hits & self.top_beams)[np.maximum(new, 0)])
        if cand_lp is not None:
            self.done_lp = [self.done_lp[p] if p < beams else cand_lp[p - beams] for p in pick]
        self.done_scores = merged_scores[pick]

        self.cur = cur + 1
        self.improvable = _improvable(self.improvable, self.running_scores, self.done_scores, self.done, self.cur,
                                      self.length_penalty)
        keep_going = self.improvable and not (self.done.all() and self.early_stopping) and not hits.all()
        return BeamStep(src, self.running_tokens[:, cur].copy(), not keep_going)

    @property
    def leading(self) -> list[int]:
        """The best running beam's tokens so far (what the request has generated, as far as the loop counts)."""
        return [int(t) for t in self.running_tokens[0, :self.cur]]

    def best(self) -> tuple[list[int], list[TokenLogprobs] | None]:
        """The best finished hypothesis: its tokens, and their logprobs when the request asked for them."""
        best = int(np.argmax(self.done_scores))  # already sorted best first; argmax guards ties
        tokens = [int(t) for t in self.done_tokens[best, :self.done_len[best]]]
        return tokens, (list(self.done_lp[best]) if self.top_n is not None else None)


def _top(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest, best first; ties to the lower index (torch.topk, sorted=True)."""
    return np.argsort(-scores, kind="stable")[:k]


def _improvable(unsatisfied: bool, running: np.ndarray, done_scores: np.ndarray, done: np.ndarray,
                length: int, length_penalty: float) -> bool:
    """HF _check_early_stop_heuristic (early_stopping True/False): can a running beam still win?"""
    best_running = running[0] / np.float32(length ** length_penalty)
    worst_done = np.where(done, done_scores.min(), NEG)  # [beams]
    return bool(unsatisfied and np.any(best_running > worst_done))


def _candidate_logprobs(logp: np.ndarray, parent: np.ndarray, token: np.ndarray, n: int,
                        history: list[list[TokenLogprobs]]) -> list[list[TokenLogprobs]]:
    """Per candidate: its parent's logprob history plus this token's (from the beam's own distribution)."""
    n = min(n, logp.shape[1])
    tops: list[tuple[tuple[int, float], ...]] = []
    for row in logp:  # top n of each beam once, not of each of the K candidates
        top = np.argpartition(-row, n - 1)[:n] if n else np.zeros(0, np.int64)
        top = top[np.argsort(-row[top], kind="stable")]
        tops.append(tuple((int(i), float(row[i])) for i in top))
    out = []
    for p, t in zip(parent, token):
        chosen = logp[p, t]
        rank = int((logp[p] > chosen).sum()) + 1
        out.append([*history[p], TokenLogprobs(int(t), float(chosen), rank, tops[p])])
    return out

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
steer the search. Each beam is a KV slot: the prompt is prefilled once and copied to the other
beams, and the cache rows are reordered (copied) whenever beams swap parents.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator

import numpy as np

from engine_builder.runner.backend import Backend
from engine_builder.runner.logits_processors import log_softmax
from engine_builder.runner.request_state import Event, RequestState, StepClock
from engine_builder.runner.sampler import TokenLogprobs

NEG = np.float32(-1e9)  # HF's "impossible" score


def run_beam_search(backend: Backend, eos_token_ids: Collection[int], r: RequestState,
                    clock: StepClock) -> Iterator[Event]:
    import time

    kv, params = backend.kv, r.params
    beams, max_new, prompt_len = params.num_beams, params.max_new_tokens, len(r.prompt_ids)
    stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
    stop_lookup = np.zeros(backend.vocab_size, bool)  # [vocab]
    stop_lookup[[t for t in stop_ids if t < backend.vocab_size]] = True
    keep = max(2, 1 + len(stop_ids)) * beams
    top_n = params.logprobs

    slots = [kv.allocate((r.index, "beam", b), prompt_len, max_new) for b in range(beams)]
    try:
        if slots != list(range(slots[0], slots[0] + beams)):  # one engine call covers all beams
            raise RuntimeError(f"beam slots {slots} are not contiguous; beam search must run alone")
        started = time.perf_counter()
        logits = backend.step(slots[0], np.asarray(r.prompt_ids, np.int64)[None, :])  # [1, vocab]
        kv.advance(slots[0], prompt_len)
        backend.copy_slots([slots[0]] * (beams - 1), slots[1:])  # every beam starts from the prompt
        logits = np.repeat(logits, beams, axis=0)  # [beams, vocab]
        clock.prefill += time.perf_counter() - started

        running_tokens = np.zeros((beams, max_new), np.int64)  # [beams, max_new] generated so far
        running_scores = np.full(beams, NEG, np.float32)
        running_scores[0] = 0
        running_lp: list[list[TokenLogprobs]] = [[] for _ in range(beams)]
        done_tokens = np.zeros((beams, max_new), np.int64)
        done_len = np.zeros(beams, np.int64)
        done_scores = np.full(beams, NEG, np.float32)
        done = np.zeros(beams, bool)
        done_lp: list[list[TokenLogprobs]] = [[] for _ in range(beams)]
        improvable = True  # HF's is_early_stop_heuristic_unsatisfied
        top_beams = np.arange(keep) < beams  # only the top num_beams of the K may finish

        for cur in range(max_new):
            started = time.perf_counter()
            execute_before = backend.execute_seconds
            if cur:
                logits = backend.step(slots[0], running_tokens[:, cur - 1:cur])
                for s in slots:
                    kv.advance(s, 1)
            logp = log_softmax(logits)  # [beams, vocab] float32
            vocab = logp.shape[1]
            total = (logp + running_scores[:, None]).reshape(-1)  # [beams * vocab]
            cand = np.argpartition(-total, keep - 1)[:keep]
            cand = cand[np.argsort(-total[cand], kind="stable")]  # K best, best first
            cand_scores = total[cand]  # [K]
            parent, token = cand // vocab, cand % vocab
            cand_tokens = running_tokens[parent]  # [K, max_new]
            cand_tokens[:, cur] = token
            hits = stop_lookup[token] | (cur + 1 >= max_new)  # [K] this continuation ends here
            cand_lp = _candidate_logprobs(logp, parent, token, top_n, running_lp) if top_n is not None else None

            # the best unfinished continuations run on
            run_scores = cand_scores + hits.astype(np.float32) * NEG
            nxt = _top(run_scores, beams)
            running_tokens, running_scores, src = cand_tokens[nxt], run_scores[nxt], parent[nxt]
            if cand_lp is not None:
                running_lp = [cand_lp[i] for i in nxt]

            # finished hypotheses: merge the new ones with the old, keep the best num_beams
            fin = cand_scores / np.float32((cur + 1) ** params.length_penalty)
            if done.all() and params.early_stopping:
                fin = fin + NEG
            if not improvable:
                fin = fin + NEG
            fin = fin + (~(hits & top_beams)).astype(np.float32) * NEG
            merged_scores = np.concatenate([done_scores, fin.astype(np.float32)])
            pick = _top(merged_scores, beams)
            old = pick < beams
            new = pick - beams
            done_tokens = np.where(old[:, None], done_tokens[np.minimum(pick, beams - 1)],
                                   cand_tokens[np.maximum(new, 0)])
            done_len = np.where(old, done_len[np.minimum(pick, beams - 1)], cur + 1)
            done = np.where(old, done[np.minimum(pick, beams - 1)], (hits & top_beams)[np.maximum(new, 0)])
            if cand_lp is not None:
                done_lp = [done_lp[p] if p < beams else cand_lp[p - beams] for p in pick]
            done_scores = merged_scores[pick]

            improvable = _improvable(improvable, running_scores, done_scores, done, cur + 1, params.length_penalty)
            keep_going = improvable and not (done.all() and params.early_stopping) and not hits.all()
            if keep_going and not np.array_equal(src, np.arange(beams)):
                backend.copy_slots([slots[i] for i in src], slots)  # each beam's cache follows its parent
            clock.decode_step(time.perf_counter() - started, backend.execute_seconds - execute_before, beams)
            if not keep_going:
                break
    finally:
        for s in slots:
            backend.release(s)

    best = int(np.argmax(done_scores))  # already sorted best first; argmax guards ties
    tokens = [int(t) for t in done_tokens[best, :done_len[best]]]
    yield from _finish(r, tokens, done_lp[best] if top_n is not None else None)


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


def _finish(r: RequestState, tokens: list[int], logprobs) -> Iterator[Event]:
    """Run the chosen hypothesis through the request's StopChecker: text, stop strings, finish reason."""
    text = ""
    for i, t in enumerate(tokens):
        out = r.stop.step(t)
        text += out.text
        if out.finished:
            tokens = tokens[:i + 1]
            r.finish_reason, r.stop_reason = out.finish_reason, out.stop_reason
            break
    else:  # ended by the search without a stop token (cannot happen: the last step always hits)
        r.finish_reason = "length"
    r.token_ids, r.text = tokens, r.stop.text
    if logprobs is not None:
        r.logprobs = list(logprobs[:len(tokens)])
    yield Event(r.index, text, True)

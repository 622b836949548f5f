"""Which healthy backend gets a request: round-robin, least-load, prefix-aware (SGLang's cache-aware router).

    policy = make_policy("prefix-aware")
    backend = policy.choose(candidates, prompt_text)   # candidates: healthy and not yet tried

prefix-aware, per request:
  1. loads imbalanced (most in-flight - least > BALANCE_ABS and most > least * BALANCE_REL): least-load
  2. else the backend whose recent prompts match the longest prefix of this one, when that match
     covers at least CACHE_THRESHOLD of the prompt's blocks: its KV cache likely holds the prefix
  3. else the backend with the least remembered (the most room for a new prefix), then least-load
and the prompt's blocks are remembered for the chosen backend. SGLang's defaults: cache threshold
0.5, balance thresholds 32 requests and 1.0001.
"""

from __future__ import annotations

import itertools
from typing import Protocol

from engine_builder.router.backends import Backend
from engine_builder.router.prefix_index import PrefixIndex

CACHE_THRESHOLD = 0.5
BALANCE_ABS = 32
BALANCE_REL = 1.0001


class Policy(Protocol):
    uses_prompt: bool  # whether choose() reads the prompt (the others skip parsing the body)

    def choose(self, candidates: list[Backend], prompt: str) -> Backend: ...

    def forget(self, backend: Backend) -> None: ...


class RoundRobin:
    uses_prompt = False

    def __init__(self) -> None:
        self._counter = itertools.count()

    def choose(self, candidates: list[Backend], prompt: str) -> Backend:
        return candidates[next(self._counter) % len(candidates)]

    def forget(self, backend: Backend) -> None:
        pass


class LeastLoad(RoundRobin):
    """Fewest in-flight requests; ties taken in turn, so an idle pool is still spread."""

    def choose(self, candidates: list[Backend], prompt: str) -> Backend:
        start = next(self._counter) % len(candidates)
        rotated = candidates[start:] + candidates[:start]
        return min(rotated, key=lambda b: b.in_flight)


class PrefixAware(LeastLoad):
    uses_prompt = True

    def __init__(self, cache_threshold: float = CACHE_THRESHOLD, balance_abs: int = BALANCE_ABS,
                 balance_rel: float = BALANCE_REL) -> None:
        super().__init__()
        self.index = PrefixIndex()
        self.cache_threshold, self.balance_abs, self.balance_rel = cache_threshold, balance_abs, balance_rel

    def choose(self, candidates: list[Backend], prompt: str) -> Backend:
        keys = self.index.keys(prompt)
        loads = [b.in_flight for b in candidates]
        if max(loads) - min(loads) > self.balance_abs and max(loads) > min(loads) * self.balance_rel:
            chosen = super().choose(candidates, prompt)
        else:
            matched = [self.index.matched_blocks(b.url, keys) for b in candidates]
            best = max(range(len(candidates)), key=lambda i: (matched[i], -candidates[i].in_flight))
            if keys and matched[best] >= self.cache_threshold * len(keys):
                chosen = candidates[best]
            else:
                chosen = min(candidates, key=lambda b: (self.index.size(b.url), b.in_flight))
        self.index.insert(chosen.url, keys)
        return chosen

    def forget(self, backend: Backend) -> None:
        self.index.forget(backend.url)


def make_policy(name: str) -> Policy:
    return {"round-robin": RoundRobin, "least-load": LeastLoad, "prefix-aware": PrefixAware}[name]()

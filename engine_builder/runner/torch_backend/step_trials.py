"""How a CUDA step runs, where the answer depends on the model and the GPU: measured once, by replaying graphs.

    FusedChoice           which steps go through fused_decode.py's model (six Triton launches a layer) rather than
                          the compiled layer: up to 16 or 64 tokens, or none, by replaying decode steps of 1 and 64
                          rows both ways (TRTBUILD_FUSED_DECODE=auto)
    long_prefill_graphs   which lone prefills past the 256-token buckets get a graph: those whose replay beats the
                          eager launch of the shortest prompt they would take

Both run in the warm-up (runtime.py warm_up); the fused trial also before the first graph of a runtime that was not
warmed up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine_builder.runner.tunables import FUSED_DECODE_MAX_TOKENS

LONG_PREFILLS = (512, 1024, 2048, 4096, 8192, 16384)  # then max_input_len


class FusedChoice:
    """The fused model (None: none, or the model's layer is not llama-shaped) and the steps it runs: those of at
    most `max_tokens` tokens. TRIAL: measure before choosing (auto); else every step up to FUSED_DECODE_MAX_TOKENS.
    `trial`: the figures once measured."""

    def __init__(self, model: Any | None, *, trial: bool) -> None:
        self.model = model
        self.max_tokens = FUSED_DECODE_MAX_TOKENS if model is not None else 0
        self._untried = trial and model is not None
        self.trial: dict | None = None

    def settle(self, graphs) -> dict | None:
        """Decode steps of 1 and FUSED_DECODE_MAX_TOKENS rows (cuda_graphs.StepGraphs.timed), each with the fused
        layers and with the compiled ones; the fused model then runs steps up to the largest size up to which it was
        the faster (a model and GPU where cuBLAS streams the weights faster than the Triton kernel keep cuBLAS).
        Once; the trial's figures, or None where there is nothing to try."""
        if not self._untried:
            return self.trial
        self._untried = False
        steps = {}
        for rows in (1, FUSED_DECODE_MAX_TOKENS):
            self.max_tokens = 0  # the runtime's run_model reads it: the compiled layer
            compiled_ms = graphs.timed(("decode", rows))[1]
            self.max_tokens = FUSED_DECODE_MAX_TOKENS
            fused_ms = graphs.timed(("decode", rows))[1]
            steps[rows] = {"fused_ms": round(fused_ms, 4), "compiled_ms": round(compiled_ms, 4)}
        wins = [rows for rows, t in steps.items() if t["fused_ms"] <= t["compiled_ms"]]
        # one row speaks for the steps of mma's 16-row tile, FUSED_DECODE_MAX_TOKENS rows for wgmma's up to it
        self.max_tokens = 0 if 1 not in wins else FUSED_DECODE_MAX_TOKENS if len(wins) == 2 else \
            min(16, FUSED_DECODE_MAX_TOKENS)
        self.trial = {"steps": steps, "max_tokens": self.max_tokens}
        return self.trial

    def describe(self) -> str:
        """The warm-up's line for the trial."""
        steps = ", ".join(f"{rows} row{'s' * (rows > 1)} {t['fused_ms']} ms (compiled {t['compiled_ms']})"
                          for rows, t in self.trial["steps"].items())
        kept = f"kept for steps of up to {self.max_tokens} tokens" if self.max_tokens else "dropped"
        return f"fused decode layer: a decode step of {steps}: {kept}"


def long_prefill_graphs(graphs, max_input_len: int,
                        eager_ms: Callable[[int], float]) -> list[tuple[int, float, float, bool]]:
    """Lone prefills past GRAPHS' default buckets (cuda_graphs.prefill_buckets: up to 256 tokens): LONG_PREFILLS
    below max_input_len, and max_input_len, each captured and adopted as a bucket where its replay is faster than
    EAGER_MS(n), the eager launch of the shortest prompt it would take (the previous bucket's length + 1: the most
    padding). A small model's prefill is bound by launching its kernels (SmolLM2's 1,024 tokens: 16.9 ms launched,
    5.4 ms of GPU work on an H100), a large one's by the GPU, where padding costs: the first bucket not kept ends
    the trial. (tokens, replay ms, eager ms, kept) each."""
    if not graphs.prefill_sizes:
        return []
    last = graphs.prefill_sizes[-1]
    sizes = [t for t in LONG_PREFILLS if last < t < max_input_len] + ([max_input_len] if max_input_len > last else [])
    out = []
    for tokens in sizes:
        eager = eager_ms(last + 1)
        graph, replay = graphs.timed(("prefill", tokens))
        out.append((tokens, round(replay, 3), round(eager, 3), replay < eager))
        if replay >= eager:
            break
        graphs.adopt_prefill(tokens, graph)
        last = tokens
    return out


def describe_long_prefills(found: list[tuple[int, float, float, bool]]) -> str:
    """The warm-up's line for long_prefill_graphs."""
    return "prefill graphs past 256 tokens: " + ", ".join(
        f"{t} {'kept' if kept else 'not kept'} (replay {replay} ms, eager {eager} ms)"
        for t, replay, eager, kept in found)

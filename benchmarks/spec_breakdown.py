"""Where a speculative story's wall time goes: `benchmarks/speculative.py --parts breakdown`.

The same story as the `draft` part (96 greedy tokens, each draft of --draft-quant at k=4), timed by wrapping
the engine calls and the loop's own functions of one LLM (instance attributes shadow the methods; nothing in
the library changes). Per generate call, summed over --runs runs after one warm-up, in milliseconds:

  target_verify[w]   the target engine's verify calls of w tokens (execute only)
  target_plain       its one-token calls (a plain step of the speculative loop, or plain decoding)
  target_prefill     its prompt steps (the prefix cache usually leaves one token)
  draft_prefill      the draft's first feed of a request (the prompt, or what its cached prefix leaves)
  draft_catchup[n]   the draft's catch-up calls of n tokens (what the last verify step emitted)
  draft_step         the draft's single-token drafting calls
  draft_python       the proposer's own time outside its engine calls (argmax, rewind, bookkeeping)
  settle             acceptance: processing the verify logits, argmax, emitting tokens (stop strings...)
  verify_python      the rest of a verify call: binding the ids, reading the logits, cost bookkeeping
  decode_python      the rest of the speculative decode step (proposal choice, draft length, stats)
  outside_decode     the generate call outside decode steps (admission, prefix cache, release, events)

The same with the draft's slot freed after each story ("unparked": the draft prefills the prompt every time,
as before draft.py parked finished slots), and for plain decoding (target_plain, target_prefill, decode_python,
outside_decode), so the per-token overhead of each loop is visible beside its engine time.
"""

from __future__ import annotations

import time
from collections import defaultdict

STORY_TASK = "Write a short story about a fox who finds a lost key in the forest."


class Timers:
    def __init__(self) -> None:
        self.ms: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def add(self, key: str, seconds: float) -> None:
        self.ms[key] += seconds * 1e3
        self.calls[key] += 1

    def scaled(self, runs: int) -> dict:
        return {key: {"ms": round(self.ms[key] / runs, 1), "calls": round(self.calls[key] / runs, 1),
                      "ms_per_call": round(self.ms[key] / max(self.calls[key], 1), 2)}
                for key in sorted(self.ms)}


def _wrap_backend(backend, timers: Timers, label) -> None:
    """backend.bind records the step's shape; backend.execute adds its seconds under label(rows, seq)."""
    bind, execute = backend.bind, backend.execute
    shape = [1, 1]

    def timed_bind(first_slot, input_ids):
        shape[:] = input_ids.shape
        return bind(first_slot, input_ids)

    def timed_execute():
        started = time.perf_counter()
        execute()
        key = label(*shape)
        if key is not None:
            timers.add(key, time.perf_counter() - started)
        timers.ms["_engine"] += (time.perf_counter() - started) * 1e3

    backend.bind, backend.execute = timed_bind, timed_execute


def _wrap(obj, name: str, timers: Timers, key: str) -> None:
    fn = getattr(obj, name)

    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            timers.add(key, time.perf_counter() - started)

    setattr(obj, name, timed)


def instrument(llm, timers: Timers) -> None:
    """Wrap llm's target backend, its generator and (speculative) its draft proposer."""
    gen = llm.generator
    state = {"phase": "prefill"}  # which loop function is calling the target engine

    def target_label(rows: int, seq: int) -> str:
        if state["phase"] == "prefill":
            return "target_prefill"
        return "target_plain" if seq == 1 else f"target_verify[{seq}]"

    _wrap_backend(llm.backend, timers, target_label)
    decode = gen.decode

    def timed_decode(*args, **kwargs):
        started, engine_before = time.perf_counter(), timers.ms["_engine"]
        python_before = sum(timers.ms[k] for k in ("draft_python", "settle", "verify_python"))
        state["phase"] = "decode"
        try:
            return decode(*args, **kwargs)
        finally:
            state["phase"] = "prefill"
            spent = (time.perf_counter() - started) * 1e3
            inner = (timers.ms["_engine"] - engine_before
                     + sum(timers.ms[k] for k in ("draft_python", "settle", "verify_python")) - python_before)
            timers.ms["decode_python"] += spent - inner
            timers.calls["decode_python"] += 1

    gen.decode = timed_decode
    proposer = getattr(gen, "proposer", None)
    if proposer is None:
        return
    draft_state = {"calls": 0, "first": False}

    def draft_label(rows: int, seq: int) -> str:
        draft_state["calls"] += 1
        if draft_state["calls"] == 1:
            return "draft_prefill" if draft_state["first"] else f"draft_catchup[{seq}]"
        return "draft_step" if seq == 1 else f"draft_chunk[{seq}]"

    _wrap_backend(proposer.backend, timers, draft_label)
    propose = proposer.propose

    def timed_propose(request, k):
        draft_state["calls"] = 0
        draft_state["first"] = proposer.backend.kv.slot_of(id(request)) is None
        started, engine_before = time.perf_counter(), timers.ms["_engine"]
        try:
            return propose(request, k)
        finally:
            spent = (time.perf_counter() - started) * 1e3
            timers.ms["draft_python"] += spent - (timers.ms["_engine"] - engine_before)
            timers.calls["draft_python"] += 1

    proposer.propose = timed_propose
    settle, verify = gen._settle, gen._verify

    def timed_settle(*args, **kwargs):
        started = time.perf_counter()
        try:
            return settle(*args, **kwargs)
        finally:
            timers.add("settle", time.perf_counter() - started)

    def timed_verify(*args, **kwargs):
        started, engine_before, settle_before = time.perf_counter(), timers.ms["_engine"], timers.ms["settle"]
        try:
            return verify(*args, **kwargs)
        finally:
            spent = (time.perf_counter() - started) * 1e3
            timers.ms["verify_python"] += spent - (timers.ms["_engine"] - engine_before) - (
                timers.ms["settle"] - settle_before)
            timers.calls["verify_python"] += 1

    gen._settle, gen._verify = timed_settle, timed_verify


def breakdown(engines, runs: int, max_new_tokens: int, threads: int, num_draft_tokens: int = 4) -> dict:
    from engine_builder import LLM, SamplingParams
    from engine_builder.runner.speculative import SpeculativeConfig

    plain = LLM(engines["float32"], threads=threads)
    ids = plain.encode_chat([{"role": "user", "content": STORY_TASK}])
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0, ignore_eos=True)
    llms = {"plain": plain}
    for quant, engine in engines["drafts"].items():
        for label, park in ((quant, True), (f"{quant}/unparked", False)):
            llms[label] = llm = LLM(engines["float32"], threads=threads, speculative=SpeculativeConfig(
                "draft", draft_engine=str(engine), num_draft_tokens=num_draft_tokens))
            llm.speculation.proposer.park = park  # unparked: the draft re-reads the prompt every story, as before
    timers = {name: Timers() for name in llms}
    for name, llm in llms.items():
        llm.generate(prompt_token_ids=[ids], params=params)  # warm-up: prefix cache, bindings, draft slot
        instrument(llm, timers[name])
    walls: dict[str, float] = defaultdict(float)
    results = {}
    for _ in range(runs):  # interleaved, like speculative.timed
        for name, llm in llms.items():
            started = time.perf_counter()
            results[name] = llm.generate(prompt_token_ids=[ids], params=params)[0]
            walls[name] += time.perf_counter() - started
    want = results["plain"].token_ids
    out: dict = {"prompt_tokens": len(ids), "new_tokens": len(want), "k": num_draft_tokens}
    for name, llm in llms.items():
        assert results[name].token_ids == want, f"{name} speculation changed the greedy tokens"
        t = timers[name]
        wall_ms = walls[name] * 1e3
        counted = sum(v for k, v in t.ms.items() if not k.startswith("_"))
        t.ms["outside_decode"] = wall_ms - counted
        t.calls["outside_decode"] = runs
        parts = t.scaled(runs)
        engine_ms = t.ms["_engine"] / runs
        row = {"wall_ms": round(wall_ms / runs, 1), "ms_per_token": round(wall_ms / runs / len(want), 2),
               "engine_ms": round(engine_ms, 1), "not_engine_ms": round(wall_ms / runs - engine_ms, 1),
               "parts": {k: v for k, v in parts.items() if not k.startswith("_")}}
        if name != "plain":
            row["speedup"] = round(walls["plain"] / walls[name], 3)
            row["speculative"] = llm.speculation.stats.to_json()
        out[name] = row
    return out


def print_table(result: dict) -> None:
    """The breakdown as aligned text: one line per part, ms per generate call and share of its wall time."""
    for name in [k for k in result if isinstance(result[k], dict) and "parts" in result[k]]:
        row = result[name]
        print(f"{name}: wall {row['wall_ms']} ms ({row['ms_per_token']} ms/token), engine {row['engine_ms']} ms, "
              f"not engine {row['not_engine_ms']} ms" + (f", speed-up {row['speedup']}x" if "speedup" in row else ""))
        if "speculative" in row:
            print(f"  {row['speculative']}")
        for key, v in row["parts"].items():
            print(f"  {key:22s} {v['ms']:8.1f} ms {100 * v['ms'] / row['wall_ms']:5.1f} %  "
                  f"{v['calls']:6.1f} calls  {v['ms_per_call']:6.2f} ms/call")

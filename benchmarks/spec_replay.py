"""Draft-length policies replayed exactly on the story: fixed k, the adaptive controller, and an oracle.

    .venv/bin/python benchmarks/spec_replay.py [--work /tmp/bench-spec-dh] [--draft-quant gguf_draft]
                                               [--max-new-tokens 96] [--requests 4] [--json]

Greedy speculative decoding emits the target's greedy tokens whatever the draft length, so a run is a
replay: the target's greedy story is decoded once (plain), and each policy is simulated against it. The
draft is the real draft engine, driven through the real DraftProposer (runner/speculative/draft.py) exactly
as the generator drives it, because at int8 activations its tokens depend on how it was fed (a 2-token
catch-up rounds differently from two 1-token steps): "live" rows. The "table" rows instead use run(t), how
many consecutive drafts the draft gets right from position t when fed one token at a time (one pass, 15
drafts at every t), which also gives the oracle: the cheapest plan over the whole story with every draft's
fate known (dynamic programming over the position and the width of the next catch-up).

Each step costs what the cost profile says (PROFILES: engine calls per kind measured in the real loop on
the quiet 16-core Xeon and on the 2-core dev machine, benchmarks/speculative.py --parts breakdown,costs), so
a policy's time is exact arithmetic, not a noisy timing: a plain step t1; a verify step of w tokens
verify(w); a proposal of k drafts its catch-up (the 1-2 tokens the last verify step emitted, more after
plain steps) plus k - 1 single-token draft steps; Python per step. The adaptive controller is the real
DraftLength / StepCosts (runner/speculative/draft_length.py) fed these costs as its measured seconds and
the simulated outcomes, over --requests stories in a row as benchmarks/speculative.py runs them (a warm-up,
then the timed runs; a request starts from the last one's counts): its row is the mean of the timed ones.
Speed-up = (prefill + plain decode) / (prefill + speculative decode), as the real benchmark's wall times.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine_builder.runner.speculative.draft import _common_prefix  # noqa: E402  (how many drafts agree)

KMAX = 15
# free text: the benchmark's story (benchmarks/speculative.py STORY_TASK) first, then others of its kind, so that a
# policy is not judged by where the few rejections of one story happen to fall
PROMPTS = ["Write a short story about a fox who finds a lost key in the forest.",
           "Write a short story about a robot who learns to paint.",
           "Tell a bedtime story about a little owl who is afraid of the dark.",
           "Write a short story about two friends who build a boat and sail to an island."]
# three more, not used to choose draft.py's STOP_MARGIN or NEAR_TIE_FAILS (--other-stories)
OTHER_PROMPTS = ["Write a short story about a girl who finds a dragon egg in her garden.",
                 "Tell a story about an old fisherman and a talking fish.",
                 "Write a short story about a lighthouse keeper during a storm."]


@dataclass(frozen=True)
class Profile:
    """Milliseconds of each engine call kind, and the Python around a step."""

    t1: float  # plain one-token target step
    verify: dict[int, float]  # target step of w tokens, in t1 (w from 2 to 16; missing widths interpolated)
    draft: float  # one single-token draft step
    catchup: tuple[float, float]  # draft catch-up of 1 / 2 tokens (more: + prefill_token each)
    prefill: float  # the target's prompt step (what the prefix cache leaves: same for every policy)
    python_plain: float = 0.0  # per plain step (sampler, bookkeeping)
    python_spec: float = 0.0  # per speculative step (proposer, acceptance, verify bookkeeping)
    prefill_token: float = 1.6  # each catch-up token past 2

    def verify_ms(self, w: int) -> float:
        if w == 1:
            return self.t1
        known = sorted({1: 1.0, **self.verify}.items())
        for (a, ra), (b, rb) in zip(known, known[1:]):
            if a <= w <= b:
                return self.t1 * (ra + (rb - ra) * (w - a) / (b - a))
        raise ValueError(f"no verify cost for width {w}")

    def catchup_ms(self, width: int) -> float:
        return self.catchup[min(width, 2) - 1] + max(0, width - 2) * self.prefill_token


def _scaled(ratios: dict[int, float], at5: float) -> dict[int, float]:
    """The costs part's verify ratios (timed alone), scaled so that width 5 costs what it cost in the loop."""
    scale = at5 / ratios[5]
    return {w: r * scale for w, r in ratios.items()}


PROFILES = {
    # quiet 16-core Xeon, 2 threads (benchmarks/results/speculative-xeon16-2026-11-26T1150.txt): the breakdown's
    # k=4 story (plain 26.59 ms, verify[5] 30.92, draft step 11.44, catch-up 11.13 / 14.36 ms, Python 0.36 ms per
    # plain step, 1.41 per speculative one) and the costs part's verify widths
    "xeon16": Profile(t1=26.59, verify=_scaled({2: 1.01, 3: 1.03, 5: 1.11, 8: 1.34, 12: 1.34, 16: 1.63}, 30.92 / 26.59),
                      draft=11.44, catchup=(11.13, 14.36), prefill=37.0, python_plain=0.36, python_spec=1.41),
    # the 2-core dev machine, load 0.4-1.1 (README "Where a speculative story's time goes": plain 20.6 ms,
    # verify[5] 23.8, draft step 11.1, catch-up 11.7 / 12.8, Python 31 ms over 95 plain steps, 24 over 22
    # speculative ones) and its quiet costs part (verify of 5 / 8 / 16 tokens 1.11 / 1.26 / 1.61 t1)
    "dev2": Profile(t1=20.6, verify=_scaled({2: 1.03, 3: 1.055, 5: 1.11, 8: 1.26, 12: 1.435, 16: 1.61}, 23.8 / 20.6),
                    draft=11.1, catchup=(11.7, 12.8), prefill=33.0, python_plain=0.33, python_spec=1.09),
}


@dataclass
class Run:
    """One simulated request's account."""

    ms: float = 0.0
    verify_steps: int = 0
    plain_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    ks: list[int] = field(default_factory=list)


class Story:
    """One prompt's greedy story (the target's tokens) and the draft engine, driven through DraftProposer."""

    def __init__(self, llm, proposer, prompt: str, max_new_tokens: int) -> None:
        from engine_builder import SamplingParams

        self.proposer, self.max_new_tokens = proposer, max_new_tokens
        self.prompt = llm.encode_chat([{"role": "user", "content": prompt}])
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0, ignore_eos=True)
        self.tokens = list(llm.generate(prompt_token_ids=[self.prompt], params=params)[0].token_ids)
        # as the benchmark's warm-up leaves it: the prompt and first token fed in one step, then parked; every
        # later request takes the parked slot over, rewinds to the prompt and feeds the first token alone. An
        # earlier prompt's parked slot is freed first, so that this prompt is fed whole as in the benchmark (taken
        # over, it would lend its common prefix, the chat template; the replay gave the same figures either way)
        proposer.forget_parked()
        warm = self._request([self.tokens[0]])
        self.proposer.propose(warm, 1)
        self.proposer.release(warm)

    def _request(self, token_ids: list[int]):
        from engine_builder import SamplingParams

        return SimpleNamespace(prompt_ids=self.prompt, token_ids=token_ids, sampling=SimpleNamespace(rng=None),
                               params=SamplingParams(max_new_tokens=self.max_new_tokens, temperature=0))

    def runs(self) -> tuple[list[int], list[list[float]]]:
        """run(t) for t = 1 .. max_new_tokens - 1 (t tokens emitted): drafts right in a row, fed one at a time;
        and the top-2 logit margin of each of the KMAX drafts from t."""
        request, out, margins = self._request([self.tokens[0]]), [], []
        stop, self.proposer.stop_margin, self.proposer.record_margins = self.proposer.stop_margin, None, True
        for t in range(1, self.max_new_tokens):
            request.token_ids = self.tokens[:t]
            drafts = self.proposer.propose(request, KMAX).tokens
            out.append(_common_prefix(list(drafts), self.tokens[t:]))
            margins.append([round(m, 4) for m in self.proposer.margins])
        self.proposer.stop_margin, self.proposer.record_margins = stop, False
        self.proposer.release(request)
        return out, margins

    def live(self, stop_margin: float | None):
        """A draft oracle for one request: draft(t, k) -> (drafted, right in a row), from the real proposer
        (stop_margin: DraftProposer's, None: none)."""
        request = self._request([self.tokens[0]])

        def draft(t: int, k: int) -> tuple[int, int]:
            request.token_ids = self.tokens[:t]
            self.proposer.stop_margin = stop_margin
            drafts = self.proposer.propose(request, k).tokens
            return len(drafts), _common_prefix(list(drafts), self.tokens[t:])

        def done() -> None:
            self.proposer.release(request)

        return draft, done


def simulate(choose, observe, draft, profile: Profile, n: int, costs=None) -> Run:
    """One request of n new tokens (the first from prefill) under a policy: choose(room) -> k (0: plain step),
    observe(drafted, accepted, verify_ms, catchup_ms, catchup_width, draft_ms); draft(t, k) -> (drafted (k, or
    fewer where the margin stop ended the proposal), drafts right in a row)."""
    run, t = Run(ms=profile.prefill), 1
    fed_valid = None  # emitted tokens whose draft KV is valid (None: the first proposal feeds one token)
    while t < n:
        room = n - t
        k = choose(room)
        run.ks.append(k)
        if k == 0:
            run.ms += profile.t1 + profile.python_plain
            run.plain_steps += 1
            observe(0, 0, profile.t1 + profile.python_plain, 0.0, 0, 0.0)
            t += 1
            continue
        width = 1 if fed_valid is None else t - min(fed_valid, t - 1)  # the tokens this proposal feeds first
        k, accepted = draft(t, k)
        catchup, drafting = profile.catchup_ms(width), (k - 1) * profile.draft
        verify = profile.verify_ms(k + 1) + profile.python_spec
        run.ms += catchup + drafting + verify
        run.verify_steps += 1
        run.drafted += k
        run.accepted += accepted
        observe(k, accepted, verify, catchup, width, drafting)
        fed_valid = t + min(accepted, k - 1)
        t = min(n, t + accepted + 1)
    return run


def plain_ms(profile: Profile, n: int) -> float:
    return profile.prefill + (n - 1) * (profile.t1 + profile.python_plain)


def fixed(k: int):
    return (lambda room: min(k, room)), (lambda *a: None)


def table_draft(runs: list[int], margins: list[list[float]], stop_margin: float | None, n: int):
    """draft(t, k) from the recorded pass, with DraftProposer's near-tie stop and its check (draft.py) replayed on
    the recorded margins: a fresh proposer's counts at first, kept across the requests that share the closure."""
    from engine_builder.runner.speculative.draft import NEAR_TIE_DECAY, NEAR_TIE_FAILS, NEAR_TIE_PRIOR

    counts = list(NEAR_TIE_PRIOR)

    def draft(t: int, k: int) -> tuple[int, int]:
        near = [j for j in range(k) if margins[t - 1][j] < stop_margin] if stop_margin is not None else []
        drafted = near[0] + 1 if near and counts[0] <= (1 - NEAR_TIE_FAILS) * counts[1] else k
        accepted = min(drafted, runs[t - 1])
        for i in near:  # judged at the next proposal: up to the first rejected draft, before the story's end
            if i >= drafted or i > accepted or t + i >= n:
                break
            counts[:] = NEAR_TIE_DECAY * counts[0] + (i < accepted), NEAR_TIE_DECAY * counts[1] + 1
        return drafted, accepted

    return draft


class Adaptive:
    """The real controller classes, one generator's worth: StepCosts shared, DraftLength per request."""

    def __init__(self) -> None:
        from engine_builder.runner.speculative.draft_length import DraftLength, StepCosts

        self.costs, self.prior = StepCosts(), DraftLength(KMAX, True)

    def request(self):
        control = self.prior.successor()
        costs = self.costs

        def choose(room: int) -> int:
            return control.choose(costs, room)

        def observe(k, accepted, verify_ms, catchup_ms, width, drafting_ms) -> None:
            if k == 0:
                costs.observe_plain(verify_ms / 1e3)
                control.observe(0, 0)
                return
            if width <= 2:  # as the generator: a steady catch-up and its drafting are samples
                costs.observe_catchup(catchup_ms / 1e3)
                costs.observe_proposal(k - 1, drafting_ms / 1e3)
            costs.observe_verify(k + 1, verify_ms / 1e3)
            control.observe(k, accepted)

        def finish() -> None:
            if control.accepted:
                self.prior = control

        return choose, observe, finish


def oracle(runs: list[int], profile: Profile, n: int) -> float:
    """The least decode time with every draft's fate known (run(t) from the table): DP over (t, catch-up width)."""
    from functools import cache

    @cache
    def best(t: int, width: int) -> float:
        if t >= n:
            return 0.0
        room = n - t
        out = profile.t1 + profile.python_plain + best(t + 1, min(width + 1, 8))
        for k in range(1, min(KMAX, room) + 1):
            a = min(k, runs[t - 1])
            cost = profile.catchup_ms(width) + (k - 1) * profile.draft + profile.verify_ms(k + 1) + profile.python_spec
            out = min(out, cost + best(min(n, t + a + 1), 2 if a == k else 1))
        return out

    return profile.prefill + best(1, 1)


@contextmanager
def controller(version: str):
    """"main": the draft length controller before this replay's changes (failures of unreached positions decay as
    the others: UNSEEN_FAILURES 1); "new": as committed."""
    from engine_builder.runner.speculative import draft_length

    kept = draft_length.UNSEEN_FAILURES
    draft_length.UNSEEN_FAILURES = 1.0 if version == "main" else kept
    try:
        yield
    finally:
        draft_length.UNSEEN_FAILURES = kept


# adaptive variants: (label, controller version, near-tie stop); "adaptive" is what the generator runs now
ADAPTIVE = [("adaptive (main)", "main", False), ("adaptive, no stop", "new", False), ("adaptive", "new", True)]


def replay(story: Story | None, runs: list[int], margins: list[list[float]], n: int, requests: int,
           live: bool) -> dict:
    """{profile: {policy: {mode: row}}} for one prompt; live rows need the story (its draft engine). Fixed k as
    `--num-draft-tokens k` runs it (no near-tie stop) and, for contrast, with the stop ("k=K, stop")."""
    from engine_builder.runner.speculative.draft import NEAR_TIE_PRIOR, STOP_MARGIN

    modes = ("table", "live") if live else ("table",)

    def live_draft(stop: bool):
        story.proposer.near_ties = NEAR_TIE_PRIOR  # every policy starts from a fresh proposer's counts
        return story.live(STOP_MARGIN if stop else None)

    def live_fixed(k: int, stop: bool) -> dict[int, tuple[int, int]]:
        """The live draft's outcomes at a fixed k (the same whatever the profile): {t: draft(t, k)}."""
        draft, done = live_draft(stop)
        seen: dict[int, tuple[int, int]] = {}

        def record(t: int, k: int) -> tuple[int, int]:
            seen[t] = draft(t, k)
            return seen[t]

        simulate(*fixed(k), record, PROFILES["xeon16"], n)
        done()
        return seen

    live_k = {(k, stop): live_fixed(k, stop) for k in range(1, KMAX + 1) for stop in (False, True)} if live else {}
    out: dict = {}
    for name, profile in PROFILES.items():
        base = plain_ms(profile, n)
        rows: dict[str, dict] = {}
        for stop in (False, True):
            for k in range(1, KMAX + 1):
                for mode in modes:
                    draft = table_draft(runs, margins, STOP_MARGIN if stop else None, n) if mode == "table" else \
                        (lambda t, k, seen=live_k[k, stop]: seen[t])
                    rows.setdefault(f"k={k}" + (", stop" if stop else ""), {})[mode] = _row(
                        simulate(*fixed(k), draft, profile, n), base)
        for label, version, stop in ADAPTIVE:
            for mode in modes:
                adaptive, timed = Adaptive(), []
                table = table_draft(runs, margins, STOP_MARGIN if stop else None, n)
                if mode == "live":
                    story.proposer.near_ties = NEAR_TIE_PRIOR
                with controller(version):
                    for i in range(requests):
                        choose, observe, finish = adaptive.request()
                        if mode == "table":
                            r = simulate(choose, observe, table, profile, n)
                        else:
                            draft, done = story.live(STOP_MARGIN if stop else None)
                            r = simulate(choose, observe, draft, profile, n)
                            done()
                        finish()
                        if i or requests == 1:
                            timed.append(r)
                rows.setdefault(label, {})[mode] = _row(_mean(timed), base)
        rows["oracle"] = {"table": {"speedup": round(base / oracle(runs, profile, n), 3)}}
        out[name] = rows
    return out


def cheap_task(context0: list[int], tokens: list[int], proposer, profile: Profile, n: int, k: int | None,
               requests: int) -> Run:
    """A proposer without a model (ngram, or one whose drafts always fail) as the generator drives it: a cheap one
    (ngram) proposes first and its match length picks k; another drafts the k chosen. k None: adaptive (the mean
    of the timed requests), else fixed."""
    from engine_builder.runner.speculative.draft_length import DraftLength, StepCosts

    costs, prior, timed = StepCosts(), DraftLength(KMAX if k is None else k, k is None), []
    for i in range(requests):
        control, run, t = prior.successor(), Run(ms=profile.prefill), 1
        while t < n:
            room, context = n - t, context0 + tokens[:t]
            if getattr(proposer, "cheap", False):
                proposal = proposer(context, min(control.cap, room))
                drafts = proposal.tokens[:control.choose(costs, min(room, len(proposal.tokens)), proposal.match)] \
                    if proposal.tokens else ()
                match = proposal.match
            else:
                drafts, match = proposer(context, control.choose(costs, room)).tokens, 0
            if not drafts:
                control.observe(0, 0)
                run.ms += profile.t1 + profile.python_plain
                costs.observe_plain((profile.t1 + profile.python_plain) / 1e3)
                run.plain_steps += 1
                t += 1
                continue
            accepted = _common_prefix(list(drafts), tokens[t:])
            seconds = profile.verify_ms(len(drafts) + 1) + profile.python_spec
            run.ms += seconds
            costs.observe_proposal(len(drafts), 1e-5 * len(drafts))  # the generator times the lookup: microseconds
            costs.observe_verify(len(drafts) + 1, seconds / 1e3)
            control.observe(len(drafts), accepted, match)
            run.verify_steps, run.drafted, run.accepted = run.verify_steps + 1, run.drafted + len(drafts), \
                run.accepted + accepted
            t = min(n, t + accepted + 1)
        if control.accepted:
            prior = control
        if i or requests == 1:
            timed.append(run)
    return _mean(timed)


def cheap_tasks(llm, n: int, requests: int, copy_prompt: str, story_prompt: str) -> dict:
    """The copy task with ngram, and the worst case (drafts never accepted), as benchmarks/speculative.py --parts
    copy,worst runs them (96 tokens, ignore_eos); {profile: {policy: {"table": row}}}."""
    import numpy as np

    from engine_builder import SamplingParams
    from engine_builder.runner.speculative.ngram import lookup

    def ngram(context, k):
        return lookup(context, k)

    ngram.cheap = True
    rng = np.random.default_rng(0)

    def never(context, k):  # benchmarks/speculative.py NeverAccepted: random ids, practically never right
        return SimpleNamespace(tokens=tuple(int(x) for x in rng.integers(1000, 40000, k)), match=0)

    out: dict = {}
    params = SamplingParams(max_new_tokens=n, temperature=0, ignore_eos=True)
    for task, text, proposer in (("copy (ngram)", copy_prompt, ngram), ("worst", story_prompt, never)):
        ids = llm.encode_chat([{"role": "user", "content": text}])
        tokens = list(llm.generate(prompt_token_ids=[ids], params=params)[0].token_ids)
        for name, profile in PROFILES.items():
            base, rows = plain_ms(profile, n), out.setdefault(name, {}).setdefault(task, {})
            for k in ((4,) if task == "worst" else range(1, KMAX + 1)):
                rows[f"k={k}"] = {"table": _row(cheap_task(ids, tokens, proposer, profile, n, k, requests), base)}
            for label, version, _ in ADAPTIVE[:2]:
                with controller(version):
                    rows[label.replace(", no stop", "")] = {"table": _row(
                        cheap_task(ids, tokens, proposer, profile, n, None, requests), base)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-spec-dh"))
    parser.add_argument("--draft-quant", default="gguf_draft")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--prompts", type=int, default=len(PROMPTS),
                        help=f"how many of the {len(PROMPTS)} free-text prompts (the first: the benchmark's story)")
    parser.add_argument("--requests", type=int, default=4, help="stories in a row for the adaptive controller "
                        "(the first a warm-up, as benchmarks/speculative.py --runs 3)")
    parser.add_argument("--table-only", action="store_true", help="no live rows (faster: one draft pass a prompt)")
    parser.add_argument("--other-stories", action="store_true",
                        help="replay OTHER_PROMPTS instead (out of sample for the near-tie stop's settings)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import speculative as bench

    from engine_builder import LLM
    from engine_builder.runner.speculative.draft import DraftProposer

    engines = bench.build_engines(args.work, (args.draft_quant,))
    llm = LLM(engines["float32"], threads=args.threads)
    proposer = DraftProposer(engines["drafts"][args.draft_quant], llm.tokenizer, llm.backend.vocab_size,
                             threads=args.threads)
    n, results = args.max_new_tokens, {"prompts": {}}
    prompts = (OTHER_PROMPTS if args.other_stories else PROMPTS)[:args.prompts]
    for prompt in prompts:
        story = Story(llm, proposer, prompt, n)
        runs, margins = story.runs()
        results["prompts"][prompt] = {"runs": runs, "margins": margins, "profiles": replay(
            story, runs, margins, n, args.requests, not args.table_only)}
    results["mean"] = _mean_over_prompts(results["prompts"])
    results["cheap"] = cheap_tasks(llm, n, args.requests, bench.COPY_TASK, bench.STORY_TASK)
    if args.json:
        print(json.dumps(results))
        return
    for prompt, r in results["prompts"].items():
        print(f"{prompt!r}: run(t), drafts right in a row from each position (of {KMAX}):",
              " ".join(map(str, r["runs"])))
    print_table(results["mean"], f"free text, mean over {len(prompts)} prompt(s)")
    if len(prompts) > 1 and not args.other_stories:
        print_table(results["prompts"][PROMPTS[0]]["profiles"], "the benchmark's story alone")
    for name, tasks in results["cheap"].items():
        for task, rows in tasks.items():
            print_table({name: rows}, task)


def _mean_over_prompts(prompts: dict) -> dict:
    """{profile: {policy: {mode: {"speedup": mean}}}}; a policy's mean speed-up over the prompts (its row counts
    summed)."""
    out: dict = {}
    for r in prompts.values():
        for profile, rows in r["profiles"].items():
            for policy, modes in rows.items():
                for mode, row in modes.items():
                    cell = out.setdefault(profile, {}).setdefault(policy, {}).setdefault(mode, {})
                    for key, value in row.items():
                        cell.setdefault(key, []).append(value)
    for rows in out.values():
        for modes in rows.values():
            for mode, cell in modes.items():
                modes[mode] = {key: round(sum(v) / len(v), 3) if key == "speedup" else sum(v)
                               for key, v in cell.items()}
    return out


def print_table(profiles: dict, title: str) -> None:
    for name, rows in profiles.items():
        print(f"\n{name}, {title}: speed-up over plain decoding (table / live), verify steps, plain steps, drafted, "
              "accepted")
        for label, row in rows.items():
            cells = []
            for mode in ("table", "live"):
                c = row.get(mode)
                if c is None:
                    continue
                extra = f" ({c['verify_steps']}v {c['plain_steps']}p {c['drafted']}d {c['accepted']}a)" \
                    if "verify_steps" in c else ""
                cells.append(f"{mode} {c['speedup']:.3f}x{extra}")
            print(f"  {label:18s} " + "   ".join(cells))
        best = []
        for group, fits in (("fixed k", lambda label: label.startswith("k=") and "," not in label),
                            ("fixed k with the stop", lambda label: label.startswith("k=") and "stop" in label)):
            for mode in ("table", "live"):
                cells = [(row[mode]["speedup"], label) for label, row in rows.items() if fits(label) and mode in row]
                if cells:
                    v, label = max(cells)
                    best.append(f"{group} {mode}: {label} {v:.3f}x")
        print("  best " + ", ".join(best))


def _row(r: Run, base: float) -> dict:
    return {"speedup": round(base / r.ms, 3), "verify_steps": r.verify_steps, "plain_steps": r.plain_steps,
            "drafted": r.drafted, "accepted": r.accepted}


def _mean(runs: list[Run]) -> Run:
    m = len(runs)
    return Run(ms=sum(r.ms for r in runs) / m, verify_steps=round(sum(r.verify_steps for r in runs) / m),
               plain_steps=round(sum(r.plain_steps for r in runs) / m), drafted=round(sum(r.drafted for r in runs) / m),
               accepted=round(sum(r.accepted for r in runs) / m))


if __name__ == "__main__":
    main()

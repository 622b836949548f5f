"""`trtbuild chat` as a user drives it: a real process, turns on stdin, answers streamed to stdout, the
history kept in the KV cache so a turn prefills only what is new (-v reports it per turn)."""

from __future__ import annotations

import re
import subprocess
import sys

from engine_builder import SamplingParams

TURN = re.compile(r"^\[turn (\d+): prompt (\d+) tokens, prefilled (\d+) \(reused (\d+)\)")
Q1, Q2 = "What is the capital of France?", "And what is the capital of Italy?"


def chat(engine, stdin: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine_builder.cli", "-v", "chat", str(engine),
                           "--max-new-tokens", "24", *args], input=stdin, capture_output=True, text=True,
                          timeout=600)


def test_multi_turn_chat_reuses_the_history_and_answers_like_a_fresh_prompt(smollm2_engine, smollm2_llm):
    proc = chat(smollm2_engine, f"{Q1}\n{Q2}\n/reset\n{Q1}\n/exit\nnever read\n")
    assert proc.returncode == 0, proc.stderr
    turns = [TURN.match(line) for line in proc.stderr.splitlines() if line.startswith("[turn")]
    assert len(turns) == 3, proc.stderr
    (_, p1, f1, r1), (_, p2, f2, r2), (_, p3, f3, r3) = [tuple(map(int, t.groups())) for t in turns]
    assert (f1, r1) == (p1, 0)  # nothing to reuse yet
    # turn 2: the whole first exchange comes from the cache; only the new turn (+ < 4 tokens) is prefilled
    q2_tokens = len(smollm2_llm.encode(Q2))
    assert r2 >= p1 and f2 <= q2_tokens + 12, (p2, f2, r2)
    assert (p3, f3, r3) == (p1, p1, 0)  # /reset: a new conversation, nothing reused
    assert "(conversation reset)" in proc.stderr and "Traceback" not in proc.stderr

    # the answers equal what a fresh, fully prefilled prompt of the same conversation gives
    params = SamplingParams(max_new_tokens=24, temperature=0)
    first = smollm2_llm.chat([{"role": "user", "content": Q1}], params)[0].text
    second = smollm2_llm.chat([{"role": "user", "content": Q1}, {"role": "assistant", "content": first},
                               {"role": "user", "content": Q2}], params)[0].text
    assert "Paris" in first and "Rome" in second
    assert proc.stdout == f"{first}\n{second}\n{first}\n"


def test_system_message_and_unknown_commands(smollm2_engine):
    proc = chat(smollm2_engine, "/help\nHi\n", "--system", "Answer in one word.")
    assert proc.returncode == 0, proc.stderr
    assert "unknown command /help" in proc.stderr and proc.stdout.strip()


def test_no_prefix_cache_prefills_every_turn_whole_with_the_same_answers(smollm2_engine, smollm2_llm):
    plain = chat(smollm2_engine, f"{Q1}\n{Q2}\n", "--no-prefix-cache")
    assert plain.returncode == 0, plain.stderr
    turns = [tuple(map(int, TURN.match(line).groups())) for line in plain.stderr.splitlines()
             if line.startswith("[turn")]
    assert len(turns) == 2 and all((f, r) == (p, 0) for _, p, f, r in turns)  # nothing reused, all prefilled
    params = SamplingParams(max_new_tokens=24, temperature=0)
    first = smollm2_llm.chat([{"role": "user", "content": Q1}], params)[0].text
    second = smollm2_llm.chat([{"role": "user", "content": Q1}, {"role": "assistant", "content": first},
                               {"role": "user", "content": Q2}], params)[0].text
    assert plain.stdout == f"{first}\n{second}\n"  # what the cached session answers too (the test above)


def test_answers_fit_the_context_and_a_failed_turn_exits_2(smollm2_engine):
    # an answer longer than the engine holds is capped at what the conversation leaves, not refused each turn
    proc = chat(smollm2_engine, f"{Q1}\n", "--max-new-tokens", "100000")
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout and "error" not in proc.stderr
    # a turn that cannot run says why, the REPL goes on to the next one, and the exit code tells a script
    proc = chat(smollm2_engine, "tell " * 5000 + f"\n{Q1}\n")
    assert proc.returncode == 2, proc.stderr
    assert "error:" in proc.stderr and "1 of 2 turns failed" in proc.stderr and "Traceback" not in proc.stderr
    assert "Paris" in proc.stdout

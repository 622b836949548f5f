"""A draft-model LLM opens its target and draft onnxruntime sessions as sessions that take turns (their threads
stop spinning when a Run returns, runner/ort_spinning.py); a plain or ngram LLM keeps onnxruntime's default."""

from __future__ import annotations

from engine_builder import LLM
from engine_builder.runner.speculative import SpeculativeConfig


def _stops(session) -> bool:
    try:
        return session.get_session_options().get_session_config_entry("session.force_spinning_stop") == "1"
    except RuntimeError:  # onnxruntime's answer for a key never set: its default, spinning goes on
        return False


def test_only_a_target_and_its_draft_stop_spinning_after_a_run(tiny_engine):
    engine, _ = tiny_engine("llama")
    draft = LLM(engine, backend="onnxruntime", speculative=SpeculativeConfig("draft", draft_engine=str(engine)))
    assert _stops(draft.backend.session) and _stops(draft.speculation.proposer.backend.session)
    for llm in (LLM(engine, backend="onnxruntime"), LLM(engine, backend="onnxruntime", speculative="ngram")):
        assert not _stops(llm.backend.session)

"""Stop tokens, stop strings (also across token boundaries), length, and streaming hold-back."""

from __future__ import annotations

import pytest

from engine_builder.runner.detokenizer import IncrementalDetokenizer
from engine_builder.runner.sampling_params import SamplingParams
from engine_builder.runner.stopping import StopChecker

EOS = 0


class ScriptedStream:
    """A detokenizer stand-in: token i >= 1 decodes to pieces[i - 1], EOS to "<eos>"."""

    def __init__(self, pieces: list[str], tail: str = "") -> None:
        self.pieces, self.tail, self.flushed = pieces, tail, False

    def add(self, token_id: int) -> str:
        return "<eos>" if token_id == EOS else self.pieces[token_id - 1]

    def flush(self) -> str:
        self.flushed = True
        return self.tail


def _run(params: SamplingParams, pieces: list[str], tokens: list[int] | None = None, tail: str = ""):
    stream = ScriptedStream(pieces, tail)
    checker = StopChecker(params, stream, eos_token_ids=[EOS])
    outputs = []
    for t in tokens or range(1, len(pieces) + 1):
        outputs.append(checker.step(t))
        if outputs[-1].finished:
            break
    return checker, outputs, stream


def test_length():
    checker, outs, stream = _run(SamplingParams(max_new_tokens=3), ["a", "b", "c", "d"])
    assert [o.text for o in outs] == ["a", "b", "c"]
    assert (checker.finish_reason, checker.stop_reason, checker.text) == ("length", None, "abc")
    assert stream.flushed  # the end of a sequence flushes the detokenizer


def test_eos_stops_and_its_text_is_dropped():
    checker, outs, _ = _run(SamplingParams(), ["a", "b"], tokens=[1, 2, EOS, 1])
    assert len(outs) == 3 and outs[-1].finished and outs[-1].text == ""
    assert (checker.finish_reason, checker.stop_reason, checker.text) == ("stop", None, "ab")


def test_ignore_eos_runs_to_length():
    checker, outs, _ = _run(SamplingParams(max_new_tokens=4, ignore_eos=True), ["x"], tokens=[1, EOS, 1, 1, 1])
    assert checker.finish_reason == "length" and len(outs) == 4
    assert checker.text == "x<eos>xx"  # EOS is an ordinary token now, text included


def test_stop_token_id_reports_itself():
    checker, _, _ = _run(SamplingParams(stop_token_ids=[3]), ["a", "b", "<end>"], tokens=[1, 2, 3])
    assert (checker.finish_reason, checker.stop_reason, checker.text) == ("stop", 3, "ab")


def test_stop_string_split_across_tokens_is_cut_and_never_streamed():
    checker, outs, _ = _run(SamplingParams(stop=["STOP"]), ["ab", "cS", "TO", "Pxyz", "more"])
    assert (checker.finish_reason, checker.stop_reason, checker.text) == ("stop", "STOP", "abc")
    assert [o.text for o in outs] == ["ab", "c", "", ""]
    assert len(outs) == 4 and "S" not in "".join(o.text for o in outs)


def test_false_start_of_a_stop_string_is_released():
    checker, outs, _ = _run(SamplingParams(stop=["STOP"], max_new_tokens=3), ["xS", "T", "ART"])
    assert [o.text for o in outs] == ["x", "", "START"]
    assert (checker.finish_reason, checker.text) == ("length", "xSTART")


def test_earliest_stop_string_wins_and_beats_length_on_the_same_step():
    checker, _, _ = _run(SamplingParams(stop=["world", "lo w"], max_new_tokens=2), ["hel", "lo world"])
    assert (checker.finish_reason, checker.stop_reason, checker.text) == ("stop", "lo w", "hel")


def test_stop_string_in_flushed_tail_is_found():
    checker, _, _ = _run(SamplingParams(stop=["\ufffd"], max_new_tokens=1), ["ok"], tail=" \ufffd")
    assert (checker.finish_reason, checker.text) == ("stop", "ok ")


def test_no_steps_after_finish():
    checker, _, _ = _run(SamplingParams(max_new_tokens=1), ["a"])
    with pytest.raises(RuntimeError, match="already finished"):
        checker.step(1)


def test_real_tokenizer_stop_string_spanning_tokens(smollm2_tokenizer):
    tok = smollm2_tokenizer
    ids = tok.encode("The capital of France is Paris.\nUser: and Spain?", add_special_tokens=False)
    stop = "\nUser:"
    assert not any(stop in tok.decode([i]) for i in ids)  # no single token holds the whole stop string
    checker = StopChecker(SamplingParams(stop=[stop], max_new_tokens=100), IncrementalDetokenizer(tok),
                          eos_token_ids=[tok.eos_token_id])
    streamed = ""
    for i in ids:
        out = checker.step(i)
        streamed += out.text
        assert "\n" not in streamed  # the stop string's first char was held back, never shown
        if out.finished:
            break
    assert (checker.finish_reason, checker.stop_reason) == ("stop", stop)
    assert streamed == checker.text == "The capital of France is Paris."

"""Generation through LLM on real onnxruntime sessions, against Hugging Face transformers.

SmolLM2-135M-Instruct (the real model, fp32) for greedy/ragged/sampling/stop/stream/chat; tiny
random models for beam search, refill past max_batch and generation_config defaults.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from runner_engines import GQA_PASSES
from sample_texts import MULTILINGUAL

from engine_builder import LLM, SamplingParams
from engine_builder.executor.executor import Executor
from engine_builder.formats.build_config import Limits
from engine_builder.util.errors import CapacityError, InputError

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "The three primary colors are", "Water boils at"]
GREEDY = SamplingParams(max_new_tokens=64, temperature=0)


def _hf_greedy_batch(hf, prompts: list[str], max_new_tokens: int) -> list[list[int]]:
    """HF generate, greedy, left-padded batch; tokens after EOS (HF pads them) dropped."""
    model, tok = hf
    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False)
    result = []
    for row in out[:, enc.input_ids.shape[1]:].tolist():
        if tok.eos_token_id in row:
            row = row[:row.index(tok.eos_token_id) + 1]
        result.append(row)
    return result


def test_greedy_matches_hf_generate(smollm2_llm, hf_smollm2):
    ours = smollm2_llm.generate(PROMPTS, GREEDY)
    reference = _hf_greedy_batch(hf_smollm2, PROMPTS, 64)
    for prompt, out, ref in zip(PROMPTS, ours, reference):
        assert list(out.token_ids) == ref, prompt
        assert out.finish_reason == ("stop" if len(ref) < 64 else "length")
        assert out.text == hf_smollm2[1].decode(ref, skip_special_tokens=True)
    assert sum(len(o.token_ids) == 64 for o in ours) >= 3  # most run the full 64 tokens
    assert ours[0].text.startswith(" Paris")  # DESIGN §5's reference answer


@pytest.fixture(scope="module")
def smollm2_gqa_llm(smollm2_gqa_engine):
    llm = LLM(smollm2_gqa_engine, backend="onnxruntime")
    yield llm
    llm.close()


@pytest.mark.parametrize("graph", ["default", "gqa"])
def test_ragged_batch_equals_each_prompt_alone(graph, smollm2_llm, smollm2_gqa_llm):
    llm = smollm2_llm if graph == "default" else smollm2_gqa_llm
    prompts = ["Hi", "The quick brown fox jumps over the lazy dog and then", "List three fruits:",
               "In 1905, Albert Einstein published four papers that"]
    assert len({len(llm.encode(p)) for p in prompts}) == 4  # really ragged
    params = [SamplingParams(max_new_tokens=12, temperature=0), SamplingParams(max_new_tokens=12, temperature=0),
              SamplingParams(max_new_tokens=12, temperature=0.9, top_p=0.9, seed=5),
              SamplingParams(max_new_tokens=8, temperature=0.7, top_k=20, seed=11)]
    batched = llm.generate(prompts, params)
    alone = [llm.generate(p, q)[0] for p, q in zip(prompts, params)]
    assert [o.token_ids for o in batched] == [o.token_ids for o in alone]
    assert [o.text for o in batched] == [o.text for o in alone]
    assert llm.backend.kv.num_free == llm.backend.kv.batch_slots  # every slot given back


def test_both_graph_kinds_update_the_cache_in_place(smollm2_llm, smollm2_gqa_llm):
    assert smollm2_gqa_llm.backend.kv_update == "in_place"
    assert "GroupQueryAttention" in smollm2_gqa_llm.backend.kv_update_reason
    assert smollm2_llm.backend.kv_update == "in_place"


def test_seeded_sampling_is_reproducible_and_top_k_1_is_greedy(smollm2_llm):
    prompt = "My favourite animal is"
    sampled = SamplingParams(max_new_tokens=16, temperature=1.0, top_p=0.95, seed=1234)
    first, again = smollm2_llm.generate(prompt, sampled)[0], smollm2_llm.generate(prompt, sampled)[0]
    other = smollm2_llm.generate(prompt, SamplingParams(max_new_tokens=16, temperature=1.0, top_p=0.95, seed=99))[0]
    assert first.token_ids == again.token_ids and first.text == again.text
    assert other.token_ids != first.token_ids  # the seed matters
    greedy = smollm2_llm.generate(prompt, SamplingParams(max_new_tokens=16, temperature=0))[0]
    top1 = smollm2_llm.generate(prompt, SamplingParams(max_new_tokens=16, temperature=1.3, top_k=1, seed=7))[0]
    assert top1.token_ids == greedy.token_ids


def test_stop_strings_cut_the_text_and_stream_holds_them_back(smollm2_llm):
    base = smollm2_llm.generate("1, 2, 3, 4,", SamplingParams(max_new_tokens=30, temperature=0))[0]
    assert " 7," in base.text  # the continuation counts on: a stop string that will occur
    params = SamplingParams(max_new_tokens=30, temperature=0, stop=(" 7,", "never there"))
    out = smollm2_llm.generate("1, 2, 3, 4,", params)[0]
    assert out.text == base.text[:base.text.index(" 7,")]
    assert (out.finish_reason, out.stop_reason) == ("stop", " 7,")
    assert len(out.token_ids) < len(base.token_ids)
    stream = smollm2_llm.stream("1, 2, 3, 4,", params)
    deltas = list(stream)
    assert "".join(deltas) == out.text and " 7" not in "".join(deltas)
    assert stream.output.text == out.text and stream.output.finish_reason == "stop"


@pytest.mark.parametrize("case", ["japanese", "sampled"])
def test_stream_round_trips_multilingual_text(case, smollm2_llm):
    """Deltas concatenate to the full decode, also when characters span several byte tokens."""
    tok = smollm2_llm.tokenizer
    if case == "japanese":  # the model continues in Japanese: 3-byte characters over byte tokens
        prompt = MULTILINGUAL["japanese"] + "\n"
        params = SamplingParams(max_new_tokens=40, temperature=0, ignore_eos=True)
    else:  # a hot sampler over a multilingual prompt emits many partial UTF-8 byte tokens
        prompt = f"{MULTILINGUAL['chinese']} {MULTILINGUAL['korean']}"
        params = SamplingParams(max_new_tokens=40, temperature=1.6, seed=3, ignore_eos=True)
    stream = smollm2_llm.stream(prompt, params)
    deltas = list(stream)
    out = stream.output
    full = tok.decode(list(out.token_ids), skip_special_tokens=True)
    assert "".join(deltas) == out.text == full
    assert any(ord(c) > 0x2000 for c in full)  # multi-byte characters really were generated
    if case == "japanese":
        assert "\ufffd" not in "".join(deltas)  # never half a character on screen
        assert sum(len(d) for d in deltas if d) > 0 and len([d for d in deltas if d]) > 5


def test_chat_applies_the_template(smollm2_llm, hf_smollm2):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    out = smollm2_llm.chat(messages, SamplingParams(max_new_tokens=40, temperature=0))[0]
    _, tok = hf_smollm2
    expected = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert list(out.prompt_token_ids) == tok(expected, add_special_tokens=False).input_ids
    assert "Paris" in out.text and out.finish_reason == "stop"  # ends with <|im_end|>
    assert out.token_ids[-1] == tok.convert_tokens_to_ids("<|im_end|>") and "<|im_end|>" not in out.text


def test_logprobs_match_hf_scores(smollm2_llm, hf_smollm2):
    model, tok = hf_smollm2
    prompt = "The capital of France is"
    out = smollm2_llm.generate(prompt, SamplingParams(max_new_tokens=6, temperature=0, logprobs=3))[0]
    ids = tok(prompt, return_tensors="pt")
    with torch.no_grad():
        ref = model.generate(**ids, max_new_tokens=6, do_sample=False, output_logits=True, return_dict_in_generate=True)
    assert len(out.logprobs) == len(out.token_ids) == 6
    for lp, logits in zip(out.logprobs, ref.logits):
        hf_logp = torch.log_softmax(logits[0].float(), -1)
        assert lp.rank == 1 and lp.top[0][0] == lp.token_id  # greedy: the chosen one is the best
        assert abs(lp.logprob - float(hf_logp[lp.token_id])) < 1e-3
        top = torch.topk(hf_logp, 3)
        assert [t for t, _ in lp.top] == top.indices.tolist()
        assert np.allclose([v for _, v in lp.top], top.values.numpy(), atol=1e-3)


def test_over_capacity_requests_get_clear_errors(smollm2_llm):
    llm = smollm2_llm  # max_input_len 128, max_seq_len 256, max_batch 4
    with pytest.raises(CapacityError, match=r"exceeds the engine's max_seq_len 256; lower max_new_tokens"):
        llm.generate("Hello", SamplingParams(max_new_tokens=300))
    with pytest.raises(InputError, match=r"at most 128 \(max_input_len\); shorten the prompt"):
        llm.generate("word " * 200, SamplingParams(max_new_tokens=4))
    with pytest.raises(CapacityError, match=r"num_beams 5 needs one KV slot per beam.*max_batch"):
        llm.generate("Hello", SamplingParams(max_new_tokens=4, num_beams=5))
    with pytest.raises(InputError, match="prompt is empty"):
        llm.generate("", SamplingParams(max_new_tokens=4))
    # nothing was admitted: a bad request in a batch fails the batch before any work
    with pytest.raises(CapacityError):
        llm.generate(["fine", "Hello"], [SamplingParams(max_new_tokens=4), SamplingParams(max_new_tokens=999)])
    assert llm.backend.kv.num_free == 4


def test_abandoned_stream_frees_its_slot(smollm2_llm):
    stream = smollm2_llm.stream("Tell me a story about", SamplingParams(max_new_tokens=40, temperature=0))
    next(stream)
    assert smollm2_llm.backend.kv.num_free == 3
    with pytest.raises(InputError, match="already generating"):
        smollm2_llm.generate("x", SamplingParams(max_new_tokens=2))
    stream.close()
    assert smollm2_llm.backend.kv.num_free == 4
    assert smollm2_llm.generate("x", SamplingParams(max_new_tokens=2))[0].token_ids  # usable again


def test_timings_are_reported(smollm2_llm):
    smollm2_llm.generate(PROMPTS[:2], SamplingParams(max_new_tokens=12, temperature=0, ignore_eos=True))
    t = smollm2_llm.last_timings
    assert t.prefill_ms > 0 and t.decode_tok_s > 0 and t.decode_steps == 11 and t.decode_tokens == 22
    assert 0 <= t.overhead_share < 0.25  # loose: shared CI machines; benchmarks/decode.py reports the figure
    assert set(t.to_json()) >= {"prefill_ms", "decode_tok_s"}


# --- tiny models ------------------------------------------------------------------------------

def _hf_model(hf_dir):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()


# num_beams, length_penalty, early_stopping, extra stop tokens. The stop tokens are ones this tiny
# model emits often, so hypotheses do finish early: the cases cover the length penalty (either
# sign), early_stopping True vs False (same search, different answers) and HF's "can a running
# beam still win" heuristic (the 229/71 case ends differently without it).
BEAM_CASES = [
    (4, 1.0, False, ()), (3, 0.5, True, ()), (4, 1.0, False, (71,)), (5, 2.0, True, (72,)), (4, -1.0, False, (32,)),
    (2, 2.0, True, (229, 192)), (2, 2.0, False, (229, 192)), (2, 1.0, False, (229, 71)),
]
BEAM_PROMPT = [1, 17, 42, 99, 7, 250]


def _hf_beams(model, num_beams, length_penalty, early_stopping, stops) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([BEAM_PROMPT]), num_beams=num_beams, length_penalty=length_penalty,
                             early_stopping=early_stopping, max_new_tokens=15, do_sample=False,
                             eos_token_id=[2, *stops], pad_token_id=0)
    return out[0, len(BEAM_PROMPT):].tolist()


@pytest.fixture(scope="module")
def beam_setup(tiny_engine):
    engine, hf_dir = tiny_engine("llama", Limits(max_batch=6, max_input_len=32, max_seq_len=64))
    return LLM(engine, backend="onnxruntime"), _hf_model(hf_dir)


@pytest.mark.parametrize("num_beams,length_penalty,early_stopping,stops", BEAM_CASES)
def test_beam_search_matches_hf(num_beams, length_penalty, early_stopping, stops, beam_setup):
    llm, model = beam_setup
    ref = _hf_beams(model, num_beams, length_penalty, early_stopping, stops)
    out = llm.generate(prompt_token_ids=[BEAM_PROMPT], params=SamplingParams(
        temperature=0, num_beams=num_beams, length_penalty=length_penalty, early_stopping=early_stopping,
        max_new_tokens=15, stop_token_ids=stops))[0]
    n = len(out.token_ids)
    assert ref[:n] == list(out.token_ids) and set(ref[n:]) <= {0}  # HF pads a shorter best beam
    assert out.finish_reason == ("stop" if out.token_ids[-1] in (2, *stops) else "length")
    assert llm.backend.kv.num_free == 6


def test_beam_cases_exercise_early_stopping(beam_setup):
    """Guards the case list: if the tiny model changes, early_stopping must still make a difference."""
    _, model = beam_setup
    assert _hf_beams(model, 2, 2.0, True, (229, 192)) != _hf_beams(model, 2, 2.0, False, (229, 192))
    assert len(_hf_beams(model, 2, 1.0, False, (229, 71))) < 15  # a finished hypothesis won early


def test_beam_search_shares_steps_with_sampled_requests(beam_setup):
    """Beam search is a step kind of the one loop: its beams decode in the same engine calls as the sampled
    requests beside it, and every request gets the tokens it gets alone (the beams HF's)."""
    llm, model = beam_setup
    greedy = SamplingParams(max_new_tokens=12, temperature=0, ignore_eos=True)
    beams = SamplingParams(temperature=0, num_beams=3, max_new_tokens=15)
    prompts, params = [[1, 5, 9, 30], BEAM_PROMPT, [1, 8, 13]], [greedy, beams, greedy]
    alone, steps = [], []
    for prompt, p in zip(prompts, params):
        alone.append(llm.generate(prompt_token_ids=[prompt], params=p)[0].token_ids)
        steps.append(llm.generator.timings.decode_steps)
    together = llm.generate(prompt_token_ids=prompts, params=params)
    assert [o.token_ids for o in together] == alone
    ref = _hf_beams(model, 3, 1.0, False, ())
    assert ref[:len(alone[1])] == list(alone[1])
    assert llm.generator.timings.decode_steps == max(steps) < sum(steps)  # one decode call per step for all
    assert llm.backend.kv.num_free == 6


def test_the_executor_runs_beam_search_as_llm_generate_does(beam_setup):
    """The server's driver runs the same steps: a beam request beside a greedy one streams the best hypothesis's
    tokens when the search ends, the answers LLM.generate gives."""
    llm, _ = beam_setup
    prompts = [BEAM_PROMPT, [1, 5, 9, 30]]
    params = [SamplingParams(temperature=0, num_beams=4, max_new_tokens=15, logprobs=1),
              SamplingParams(max_new_tokens=12, temperature=0, ignore_eos=True)]
    want = llm.generate(prompt_token_ids=prompts, params=params)
    with Executor(llm) as executor:
        handles = [executor.submit(p, q) for p, q in zip(prompts, params)]
        got = [h.result(timeout=60) for h in handles]
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert [g.text for g in got] == [w.text for w in want]
    assert [g.finish_reason for g in got] == [w.finish_reason for w in want]
    assert [lp.token_id for lp in got[0].logprobs] == list(want[0].token_ids)
    assert llm.backend.kv.num_free == 6


def test_preempted_beam_search_restarts_with_the_same_answer(beam_setup):
    """A beam search preempted for a more urgent request's growth (its KV recomputed) ends as it does alone."""
    llm, _ = beam_setup
    urgent = SamplingParams(max_new_tokens=50, temperature=0, ignore_eos=True)
    beams = SamplingParams(temperature=0, num_beams=3, max_new_tokens=40, ignore_eos=True, priority=1)
    prompts = [[1, 5, 9, 30], BEAM_PROMPT]
    alone = [llm.generate(prompt_token_ids=[p], params=q)[0].token_ids for p, q in zip(prompts, [urgent, beams])]
    # 11 blocks of 16 tokens: the beams' 3 x 3 blocks and the urgent request's first block, its second from the
    # last free one; its third (position 32) preempts the beams, which wait for it to finish and start again
    tight = LLM(llm.engine.path, backend="onnxruntime", kv_budget_tokens=11 * 16)
    together = tight.generate(prompt_token_ids=prompts, params=[urgent, beams])
    assert tight.generator.admission.scheduler.resumes.preemptions == 1
    assert [o.token_ids for o in together] == alone
    assert tight.backend.kv.num_free == 6


def test_beam_search_differs_from_greedy_and_reports_logprobs(tiny_engine):
    engine, _ = tiny_engine("llama", Limits(max_batch=6, max_input_len=32, max_seq_len=64))
    llm = LLM(engine, backend="onnxruntime")
    prompt = [[1, 17, 42, 99, 7, 250]]
    greedy = llm.generate(prompt_token_ids=prompt, params=SamplingParams(max_new_tokens=15, temperature=0))[0]
    beam = llm.generate(prompt_token_ids=prompt, params=SamplingParams(max_new_tokens=15, num_beams=4,
                                                                       logprobs=2))[0]
    assert beam.token_ids != greedy.token_ids  # the test model's best beam is not greedy's path
    assert len(beam.logprobs) == len(beam.token_ids)
    assert all(lp.token_id == t and len(lp.top) == 2 for lp, t in zip(beam.logprobs, beam.token_ids))
    assert beam.text.split() == [f"w{t}" for t in beam.token_ids]


def test_more_prompts_than_slots_refill_freed_slots(tiny_engine):
    engine, _ = tiny_engine("llama", Limits(max_batch=2, max_input_len=32, max_seq_len=96))
    llm = LLM(engine, backend="onnxruntime")
    prompts = [[1, 5 + i, 9, 30 + 3 * i][: 2 + i % 3] for i in range(5)]
    params = [SamplingParams(max_new_tokens=6 + 5 * i, temperature=0, ignore_eos=True) for i in range(5)]
    batched = llm.generate(prompt_token_ids=prompts, params=params)
    alone = [llm.generate(prompt_token_ids=[p], params=q)[0] for p, q in zip(prompts, params)]
    assert [o.token_ids for o in batched] == [o.token_ids for o in alone]
    assert [len(o.token_ids) for o in batched] == [6, 11, 16, 21, 26]


def test_generation_config_defaults_apply(tiny_engine):
    engine, _ = tiny_engine("llama_tied")
    config = json.loads((engine / "generation_config.json").read_text())
    (engine / "generation_config.json").write_text(json.dumps(
        {**config, "do_sample": True, "temperature": 0.5, "top_k": 5, "max_new_tokens": 7}))
    llm = LLM(engine, backend="onnxruntime")
    params = llm.default_params()
    assert (params.temperature, params.top_k, params.max_new_tokens) == (0.5, 5, 7)
    assert 2 in params.stop_token_ids  # eos_token_id from the file
    out = llm.generate(prompt_token_ids=[[1, 2, 3]])[0]  # no params: the file's defaults
    assert len(out.token_ids) <= 7
    assert llm.default_params(temperature=0).temperature == 0  # the caller wins
    # a bare SamplingParams() takes the engine's sampling too (issue 16), an explicit temperature wins
    resolved = llm._params(SamplingParams(max_new_tokens=3), 1)[0]
    assert (resolved.temperature, resolved.top_k, resolved.max_new_tokens) == (0.5, 5, 3)
    assert llm._params(SamplingParams(temperature=0.0), 1)[0].greedy


def test_bare_sampling_params_are_greedy_unless_the_engine_samples(tiny_engine):
    """The tiny llama's generation_config.json has no do_sample: SamplingParams() is greedy, the same
    tokens every run (no generation_config.json at all: test_sampling_params.py)."""
    engine, _ = tiny_engine("llama")
    assert "do_sample" not in json.loads((engine / "generation_config.json").read_text())
    llm = LLM(engine, backend="onnxruntime")
    prompt = [[1, 5, 9, 13]]
    runs = [llm.generate(prompt_token_ids=prompt, params=SamplingParams(max_new_tokens=8, ignore_eos=True))[0]
            for _ in range(3)]
    greedy = llm.generate(prompt_token_ids=prompt,
                          params=SamplingParams(max_new_tokens=8, temperature=0, ignore_eos=True))[0]
    assert all(r.token_ids == greedy.token_ids for r in runs)


def test_longrope_sequences_are_reprefilled_like_hf(tiny_engine):
    """phi3 longrope switches rotary tables past original_max_position_embeddings (64): the runner
    recomputes the whole sequence there, as transformers does, and stays on HF's greedy path."""
    engine, hf_dir = tiny_engine("phi3", Limits(max_batch=2, max_input_len=96, max_seq_len=128))
    llm = LLM(engine, backend="onnxruntime")
    assert llm.backend.reprefill_after is not None
    prompt = [1, 11, 22, 33, 44, 55]
    out = llm.generate(prompt_token_ids=[prompt], params=SamplingParams(max_new_tokens=90, temperature=0,
                                                                       ignore_eos=True))[0]
    model = _hf_model(hf_dir)
    with torch.no_grad():
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=90, do_sample=False, eos_token_id=None,
                             pad_token_id=0)[0, len(prompt):].tolist()
    assert list(out.token_ids) == ref


def test_gqa_lowered_tiny_graph_matches_the_default_graph(tiny_engine):
    prompts = [[1, 5, 9], [1, 7, 11, 13, 17, 19], [1, 2]]
    params = SamplingParams(max_new_tokens=12, temperature=0, ignore_eos=True)
    outputs = []
    for passes in (None, GQA_PASSES):
        engine, _ = tiny_engine("llama", ort_passes=passes)
        outputs.append([o.token_ids for o in LLM(engine, backend="onnxruntime").generate(
            prompt_token_ids=prompts, params=params)])
    assert outputs[0] == outputs[1]

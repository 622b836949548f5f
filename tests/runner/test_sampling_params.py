"""SamplingParams validation and merging with a checkpoint's generation_config.json."""

from __future__ import annotations

import pytest
from transformers import GenerationConfig

from engine_builder.runner.sampling_params import HF_DEFAULT_TOP_K, SamplingParams
from engine_builder.util.errors import InputError

BAD = [
    ("max_new_tokens", 0, ">= 1"),
    ("temperature", -0.1, "in [0, 100]"),
    ("temperature", float("nan"), "in [0, 100]"),
    ("temperature", 1e308, "in [0, 100]"),  # accepted before, and overflowed the scaled logits
    ("top_k", -1, ">= 0"),
    ("top_k", 2.5, ">= 0"),
    ("top_k", True, ">= 0"),
    ("top_p", 0.0, "in (0, 1]"),
    ("top_p", 1.5, "in (0, 1]"),
    ("min_p", -0.01, "in [0, 1]"),
    ("min_p", 1.01, "in [0, 1]"),
    ("repetition_penalty", 0.0, "in (0, 100]"),
    ("repetition_penalty", 1e308, "in (0, 100]"),
    ("presence_penalty", 2.5, "in [-2, 2]"),
    ("frequency_penalty", -3.0, "in [-2, 2]"),
    ("seed", -1, ">= 0"),
    ("stop", ["ok", ""], "non-empty strings"),
    ("stop", "", "non-empty strings"),  # one empty string, as [""]
    ("stop", 5, "a list"),
    ("stop_token_ids", [2, -1], "token ids >= 0"),
    ("logprobs", -1, "integer >= 0"),
    ("num_beams", 0, ">= 1"),
    ("length_penalty", float("inf"), "in [-100, 100]"),
    ("length_penalty", 1e308, "in [-100, 100]"),
    ("early_stopping", "never", "true or false"),
    ("ignore_eos", 1, "true or false"),
]


@pytest.mark.parametrize(("field", "value", "valid"), BAD, ids=[f"{f}={v!r}" for f, v, _ in BAD])
def test_out_of_range_values_are_rejected_with_the_valid_range(field, value, valid):
    with pytest.raises(InputError) as err:
        SamplingParams(**{field: value})
    message = str(err.value)
    assert field in message and valid in message and "\n" not in message


def test_defaults_and_boundaries_are_valid():
    p = SamplingParams()
    assert (p.max_new_tokens, p.temperature, p.top_k, p.top_p, p.min_p) == (16, None, 0, 1.0, 0.0)
    assert p.greedy  # None: the engine's generation_config.json decides, greedy without one
    SamplingParams(temperature=0.0, top_p=1.0, min_p=1.0, top_k=0, presence_penalty=-2, frequency_penalty=2,
                   seed=0, logprobs=0)
    assert SamplingParams(temperature=0).greedy and not SamplingParams(temperature=0.01).greedy
    assert SamplingParams(temperature=1e-9).greedy  # would overflow float32 logits to inf


def test_lists_become_tuples_and_params_are_frozen():
    p = SamplingParams(stop=["###", "\n\n"], stop_token_ids=[2, 7])
    assert p.stop == ("###", "\n\n") and p.stop_token_ids == (2, 7)
    assert SamplingParams(stop="END").stop == ("END",)  # one string, not its characters
    hash(p)
    with pytest.raises(AttributeError):
        p.temperature = 0.5


def test_greedy_checkpoint_config():
    p = SamplingParams.from_generation_config({"eos_token_id": 2, "temperature": 0.6, "max_new_tokens": 64})
    assert p.temperature == 0.0  # HF: without do_sample the temperature is not used
    assert p.max_new_tokens == 64 and p.stop_token_ids == (2,)


def test_sampling_checkpoint_config_and_hf_top_k_default():
    p = SamplingParams.from_generation_config({"do_sample": True, "temperature": 0.6, "top_p": 0.9,
                                               "eos_token_id": [2, 7], "repetition_penalty": 1.1})
    assert (p.temperature, p.top_p, p.repetition_penalty) == (0.6, 0.9, 1.1)
    assert p.top_k == HF_DEFAULT_TOP_K == 50
    assert p.stop_token_ids == (2, 7)
    assert SamplingParams.from_generation_config({"do_sample": True, "top_k": 0}).top_k == 0
    assert SamplingParams.from_generation_config({"do_sample": True}).temperature == 1.0


def test_user_values_win_and_none_means_not_given():
    gc = {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "max_new_tokens": 64, "eos_token_id": 2}
    p = SamplingParams.from_generation_config(gc, temperature=0.0, max_new_tokens=5, top_p=None, seed=None)
    assert (p.temperature, p.max_new_tokens, p.top_p, p.seed) == (0.0, 5, 0.9, None)


def test_user_stop_ids_add_to_eos_and_ignore_eos_drops_it():
    gc = {"eos_token_id": [2, 7]}
    assert SamplingParams.from_generation_config(gc, stop_token_ids=[9, 2]).stop_token_ids == (9, 2, 7)
    assert SamplingParams.from_generation_config(gc, ignore_eos=True).stop_token_ids == ()


def test_real_hf_generation_config_dict():
    # GenerationConfig.to_dict() carries dozens of keys, many None: all must be tolerated
    gc = GenerationConfig(do_sample=True, temperature=0.2, top_k=20, min_p=0.05, eos_token_id=[1, 2],
                          num_beams=2, early_stopping=True).to_dict()
    p = SamplingParams.from_generation_config(gc)
    assert (p.temperature, p.top_k, p.min_p, p.num_beams, p.early_stopping) == (0.2, 20, 0.05, 2, True)
    assert p.stop_token_ids == (1, 2)
    assert SamplingParams.from_generation_config(None) == SamplingParams.from_generation_config({})


def test_unknown_user_key_and_bad_merged_value_are_input_errors():
    with pytest.raises(InputError, match="unknown sampling parameter.*temprature"):
        SamplingParams.from_generation_config({}, temprature=0.5)
    with pytest.raises(InputError, match="top_p must be in"):
        SamplingParams.from_generation_config({"top_p": 0.0})


def test_engine_defaults_resolve_an_unset_temperature():
    assert SamplingParams().with_engine_defaults(None).temperature == 0.0  # no generation_config.json: greedy
    assert SamplingParams().with_engine_defaults({"do_sample": False, "temperature": 0.6}).temperature == 0.0
    sampled = SamplingParams(top_p=0.5).with_engine_defaults({"do_sample": True, "temperature": 0.6, "top_p": 0.9})
    assert (sampled.temperature, sampled.top_k, sampled.top_p) == (0.6, 50, 0.5)  # HF's top_k 50; ours win
    assert SamplingParams(temperature=1.0).with_engine_defaults(None).temperature == 1.0  # explicit: kept

"""Model-independent runtime pieces: sampling, stopping, streaming detokenization, KV cache.

The generation loop composes them per request:
    SamplingState(params, prompt_ids, vocab)  -> Sampler()(logits, states) picks tokens
    StopChecker(params, IncrementalDetokenizer(tok, prompt_ids), eos_ids).step(token)
    KVCacheManager(...).allocate(request_id, prompt_len, params.max_new_tokens) -> slot
"""

from engine_builder.runner.detokenizer import IncrementalDetokenizer
from engine_builder.runner.kv.kv_cache import KVCacheManager
from engine_builder.runner.sampler import SampleOutput, Sampler, SamplingState, TokenLogprobs
from engine_builder.runner.sampling_params import SamplingParams
from engine_builder.runner.stopping import StepOutput, StopChecker

__all__ = [
    "IncrementalDetokenizer", "KVCacheManager", "Sampler", "SampleOutput", "SamplingParams",
    "SamplingState", "StepOutput", "StopChecker", "TokenLogprobs",
]

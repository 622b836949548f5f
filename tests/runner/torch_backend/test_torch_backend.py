"""The torch backend end to end through LLM: the same tokens as HF transformers and as the onnxruntime twin.

On a CPU (CI) it runs float32 with the reference attention (gather + SDPA); on a CUDA GPU the same tests run
with the Triton kernel and CUDA graphs when TRTBUILD_TEST_DEVICE=cuda (benchmarks/gpu_run.sh). Every test
drives real components: engine dirs built by our own build, HF models as the reference, no mocks.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from engine_builder import LLM, SamplingParams
from engine_builder.formats.build_config import Limits
from engine_builder.runner.backend_choice import choose_backend
from engine_builder.runner.engine import EngineDir

ON_GPU = os.environ.get("TRTBUILD_TEST_DEVICE") == "cuda"
GREEDY = SamplingParams(max_new_tokens=12, ignore_eos=True, temperature=0.0)
PROMPTS = [[1, 5, 9, 33, 7], [1, 8, 100, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18], [1, 2]]


def tokens(outputs) -> list[tuple[int, ...]]:
    return [tuple(o.token_ids) for o in outputs]


@pytest.fixture(scope="module")
def llama(tiny_engine):
    engine, hf = tiny_engine("llama", Limits(max_batch=4, max_input_len=32, max_seq_len=96))
    return engine, hf


@pytest.fixture(scope="module")
def torch_llm(llama):
    llm = LLM(llama[0], backend="torch")
    yield llm
    llm.close()


def hf_greedy(hf_dir, prompt: list[int], new_tokens: int) -> tuple[int, ...]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    return tuple(out[0, len(prompt):].tolist())


def test_auto_passes_torch_over_without_a_gpu_and_takes_it_when_named(llama):
    engine = EngineDir.load(llama[0])
    named = choose_backend(engine, "torch")
    assert named.name == "torch"
    if not torch.cuda.is_available():
        auto = choose_backend(engine, "auto")
        assert auto.name == "onnxruntime" and "PyTorch not usable: no CUDA GPU" in auto.reason


@pytest.mark.parametrize("arch", ["llama", "qwen2", "phi3", "gemma2", "gemma3_text"])
def test_greedy_tokens_equal_hf_and_the_twin(tiny_engine, arch):
    """Tiny random models through our convert + build, then the torch backend: HF generate's tokens (the
    sliding-window families past their window of 8; phi3's longrope past its 64-token switch)."""
    limits = Limits(max_batch=4, max_input_len=32, max_seq_len=96)
    engine, hf = tiny_engine(arch, limits)
    prompt = PROMPTS[1]
    new = 60 if arch == "phi3" else 16  # phi3: past original_max_position_embeddings 64 (a re-prefill)
    params = SamplingParams(max_new_tokens=new, ignore_eos=True, temperature=0.0)
    llm = LLM(engine, backend="torch")
    try:
        ours = tokens(llm.generate(prompt_token_ids=[prompt], params=params))[0]
    finally:
        llm.close()
    twin = LLM(engine, backend="onnxruntime")
    try:
        assert ours == tokens(twin.generate(prompt_token_ids=[prompt], params=params))[0]
    finally:
        twin.close()
    if not ON_GPU:  # float32 on the CPU: transformers' own tokens
        assert ours == hf_greedy(hf, prompt, new)


def test_a_ragged_batch_gives_each_prompt_its_solo_tokens(torch_llm):
    together = tokens(torch_llm.generate(prompt_token_ids=PROMPTS, params=GREEDY))
    alone = [tokens(torch_llm.generate(prompt_token_ids=[p], params=GREEDY))[0] for p in PROMPTS]
    assert together == alone


def test_more_prompts_than_slots_and_beams_match_the_twin(llama, torch_llm):
    many = [[1, 3 + i, 40 + i, 7] for i in range(7)]  # 7 prompts on 4 slots: admitted as slots free up
    beams = SamplingParams(max_new_tokens=8, num_beams=3, temperature=0.0)
    twin = LLM(llama[0], backend="onnxruntime")
    try:
        assert tokens(torch_llm.generate(prompt_token_ids=many, params=GREEDY)) == \
            tokens(twin.generate(prompt_token_ids=many, params=GREEDY))
        assert tokens(torch_llm.generate(prompt_token_ids=PROMPTS[:1], params=beams)) == \
            tokens(twin.generate(prompt_token_ids=PROMPTS[:1], params=beams))
    finally:
        twin.close()


def test_seeded_sampling_is_reproducible_and_n_requests_differ(torch_llm):
    p = SamplingParams(max_new_tokens=10, ignore_eos=True, temperature=1.0, top_p=0.9, seed=7)
    first = tokens(torch_llm.generate(prompt_token_ids=[PROMPTS[0]], params=p))
    assert first == tokens(torch_llm.generate(prompt_token_ids=[PROMPTS[0]], params=p))
    others = [SamplingParams(max_new_tokens=10, ignore_eos=True, temperature=1.0, seed=s) for s in range(4)]
    assert len(set(tokens(torch_llm.generate(prompt_token_ids=[PROMPTS[0]] * 4, params=others)))) > 1


def test_a_shared_prefix_is_reused_by_reference(torch_llm):
    """The radix tree over the device pool: a second prompt with the same first blocks prefills only the rest,
    and gives the tokens a cold run gives."""
    system = list(range(3, 3 + 24))  # 24 tokens: one full block of 16 to share
    a, b = [1, *system, 50, 51], [1, *system, 60, 61, 62]
    cold = tokens(torch_llm.generate(prompt_token_ids=[b], params=GREEDY))
    torch_llm.generate(prompt_token_ids=[a], params=GREEDY)
    before = torch_llm.backend.kv.blocks.tree.stats().hit_tokens
    assert tokens(torch_llm.generate(prompt_token_ids=[b], params=GREEDY)) == cold
    assert torch_llm.backend.kv.blocks.tree.stats().hit_tokens - before >= 16


def test_speculative_ngram_gives_the_plain_greedy_tokens(llama):
    prompt = [1, *([20, 21, 22, 23] * 4)]  # repeats: ngram has drafts to propose
    plain = LLM(llama[0], backend="torch")
    spec = LLM(llama[0], backend="torch", speculative="ngram")
    try:
        assert tokens(spec.generate(prompt_token_ids=[prompt], params=GREEDY)) == \
            tokens(plain.generate(prompt_token_ids=[prompt], params=GREEDY))
    finally:
        plain.close()
        spec.close()


def test_kv_cache_memory_sizes_the_device_pool(llama):
    llm = LLM(llama[0], backend="torch", kv_cache_memory=1 << 20)
    try:
        pool = llm.backend.kv.pool
        assert pool.nbytes <= 1 << 20 and llm.backend.keys[0].shape[0] == pool.num_blocks
        assert tokens(llm.generate(prompt_token_ids=PROMPTS[:1], params=GREEDY))[0]
    finally:
        llm.close()


def test_smollm2_answers_as_hf_does(smollm2_engine, hf_smollm2):
    """The real model (SmolLM2-135M-Instruct, float32): the chat answer HF transformers gives, token for token."""
    model, tokenizer = hf_smollm2
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    llm = LLM(smollm2_engine, backend="torch")
    try:
        out = llm.chat(messages, SamplingParams(max_new_tokens=12, temperature=0.0))[0]
        ids = llm.encode_chat(messages)
    finally:
        llm.close()
    with torch.no_grad():
        ref = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                             attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    want = ref[0, len(ids):].tolist()
    assert list(out.token_ids) == want[:len(out.token_ids)]
    assert "Paris" in out.text


def test_gpu_memory_utilization_is_the_torch_backends_and_checked(llama):
    from engine_builder.util.errors import InputError

    with pytest.raises(InputError, match="must be in \\(0, 1\\]"):
        LLM(llama[0], backend="torch", gpu_memory_utilization=1.5)
    with pytest.raises(InputError, match="run it with --backend torch"):
        LLM(llama[0], backend="onnxruntime", gpu_memory_utilization=0.5)
    with pytest.raises(InputError, match="not both"):
        LLM(llama[0], backend="torch", gpu_memory_utilization=0.5, kv_cache_memory=1 << 20)
    llm = LLM(llama[0], backend="torch", gpu_memory_utilization=0.5)
    try:
        assert tokens(llm.generate(prompt_token_ids=PROMPTS[:1], params=GREEDY))[0]
    finally:
        llm.close()


@pytest.mark.skipif(ON_GPU, reason="the CPU's threads: on a GPU the products are cuBLAS's")
def test_on_a_cpu_the_stepping_thread_runs_torch_on_one_thread_and_openblas_on_threads(llama):
    """In a fresh process whose main thread ran a parallel torch op before LLM (its OpenMP count then stays its
    own), generate on threads=2 leaves that thread's torch count at 1 and OpenBLAS's at 2: torch's spinning workers
    kept OpenBLAS's threads off the cores (5x slower decode on 2 cores when the main thread kept 2)."""
    script = (
        "import sys, threadpoolctl, torch\n"
        "from engine_builder import LLM, SamplingParams\n"
        "torch.set_num_threads(2); torch.randn(512, 512) @ torch.randn(512, 512)\n"
        "llm = LLM(sys.argv[1], backend='torch', threads=2)\n"
        "llm.generate(prompt_token_ids=[[1, 5, 9]], params=SamplingParams(max_new_tokens=3, ignore_eos=True))\n"
        "blas = [p['num_threads'] for p in threadpoolctl.threadpool_info() if p['internal_api'] == 'openblas']\n"
        "print(torch.get_num_threads(), blas)\n")
    done = subprocess.run([sys.executable, "-c", script, str(llama[0])], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == "1 [2]", done.stdout

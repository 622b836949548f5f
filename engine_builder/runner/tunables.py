"""Every numeric default of the runtime that tunes its behaviour or speed, in one place (issue 32), each with why.

The modules that use one import it from here; docs/reference/tunables.md is generated from this file
(tests/docs/tunables_reference.py), so the table cannot drift from the code. What a user sets per run is a flag
or an argument (`--max-num-batched-tokens`, `LLM(kv_cache_memory=...)`): these are the defaults behind those and
the constants of the policies no flag reaches. The TRTBUILD_* environment variables are util/environment.py's
table; the HTTP server's limits are engine_builder/server/config.py's.
"""

from __future__ import annotations

# --- scheduling (runner/scheduling/) ----------------------------------------------------------------------------

KV_BUDGET_BLOCK_TOKENS = 16  # a slot engine counts its KV budget in blocks of this many tokens (kv_block_tokens)
WATERMARK_SHARE = 0.01  # of the KV blocks, kept free at admission for the running requests' growth (vLLM's)
MIN_CHUNK = 16  # prompt tokens a chunked prefill gives a request at least, and the auto budget's first size
PREFILL_SHARE = 1.0  # auto prefill budget: a step's prefill time over its decode time
MAX_AUTO_TOKENS = 2048  # the auto prefill budget's ceiling, in tokens per step
STEP_BUDGET_SMOOTHING = 0.3  # weight of the newest step-time measurement in the auto budget's averages
PREFILL_FIXED_TOKENS = 8.0  # batched prefill: a call's fixed cost in tokens' worth, before anything is measured
PREFILL_COST_FORGET = 0.97  # batched prefill's fitted call costs: weight of past observations per new one

# --- KV storage (runner/kv/, the backends) ------------------------------------------------------------------------

HOST_KV_RAM_FRACTION = 0.25  # of MemAvailable for a host block pool when no kv_cache_memory is given
PREFIX_CACHE_BYTES = 256 << 20  # LLM(prefix_cache_bytes=): the slot layout's copied prefix blocks
CHAT_BLOCK_TOKENS = 4  # chat history reuse granularity: at most 3 tokens of history are prefilled again per turn
CHAT_CACHE_BYTES = 512 << 20  # a chat session's cached history (runner/chat_session.py)
IMAGE_FEATURES_CACHE_BYTES = 64 << 20  # recent images' features (a 576-token CLIP-L image at 4,096 wide: 9 MB)
TORCH_KV_BLOCK_SIZE = 16  # the torch backend's block size where the build recorded none
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # --gpu-memory-utilization's default (vLLM's)
ACTIVATION_RESERVE = 2 << 30  # bytes kept out of the device KV pool: the largest step's activations, the graphs
TRT_POOL_MEMORY_FRACTION = 0.5  # of the device memory free after loading a TensorRT engine, for its paged pools

# --- speculative decoding (runner/speculative/) -------------------------------------------------------------------

DRAFT_STOP_MARGIN = 0.2  # logits: a draft proposal ends at a near tie this close (the adaptive length's)
NEAR_TIE_DECAY = 0.9  # weight of the past in the near-tie survival counts
NEAR_TIE_PRIOR = (0.5, 1.0)  # (survived, judged) near ties before any is seen
NEAR_TIE_FAILS = 0.15  # stop at near ties while at least this share of them fails
ALPHA_DECAY = 0.85  # weight of the past in the acceptance rate's counts: about the last 7 verify steps decide
PROBE_EVERY = 16  # plain steps, once drafts keep failing (length 0), between short probes of whether they pass again
REMEASURE_EVERY = 64  # steps between plain steps that keep a plain step's measured cost current
COST_EMA = 0.2  # weight of the newest step-cost measurement
MATCH_BUCKETS = 4  # ngram match lengths 1, 2, 3 and 4+ keep separate acceptance rates (0: no match length)
MATCH_REACH = 2  # an ngram proposal drafts at most this many tokens per matched token
PRIOR_WEIGHT = 2.0  # verify steps' worth of alpha in a draft position's survival rate
# what a position's failures keep per verify step that did not reach it, beside ALPHA_DECAY: without it one
# rejection at the 5th draft kept the length at 4 for the rest of a story (results/spec-replay-2026-11-26T1428.txt)
UNSEEN_FAILURES = 0.5

# --- CPU threads (runner/ort_spinning.py, cpu_busy.py, embedder.py) --------------------------------------------

SPIN_MEASURED_SLACK = 0.25  # cores a measured CPU-use window may misread (kernel threads, 1/100 s counters)
BUSY_MIN_WINDOW_S = 0.1  # /proc/stat counts in 1/100 s: a shorter window cannot tell 0.1 core from 0.3
BUSY_MAX_WINDOW_S = 60.0  # a CPU-use window older than the load average's own minute says nothing about now
# what one more encoder call costs, in padded tokens: a batch of mixed lengths is split where the padding saved is
# worth more (MiniLM, 32 sentences of 4..77 tokens: 2464 padded tokens in one call, 1100 in five)
EMBED_BATCH_OVERHEAD_TOKENS = 32

# --- the paged-attention kernel (runner/torch_backend/paged_attention_triton.py) -----------------------------------

KERNEL_DEFAULT_SMS = 132  # what Triton's interpreter (CPU) plans for: the H200's multiprocessors, as the GPU does
KERNEL_MAX_SPLITS = 32  # key splits of one sequence at most
KERNEL_MIN_TILES_PER_SPLIT = 2  # fewer key tiles per split and the partials and the combine outweigh the gain
# programs per multiprocessor the split choice aims for: two resident programs keep loads in flight, a third wave
# only adds partial traffic (benchmarks/gpu_paged_attention.py's split sweep)
KERNEL_PROGRAMS_PER_SM = 2
# split launches' counters made at once (int32, 256 KB): a launch splits only while its programs number fewer than
# KERNEL_PROGRAMS_PER_SM x the multiprocessors (264 on an H100), so only a forced num_splits ever needs more
KERNEL_SPLIT_COUNTERS = 1 << 16

# --- the fused decode layer (runner/torch_backend/fused_decode.py, decode_linear_triton.py) -----------------------

# a CUDA step of at most this many tokens may run each layer as six Triton launches (at most the kernel's 64
# rows): weight-bound, where more tokens are the tensor cores' work and cuBLAS's. The warm-up's trial keeps it up to
# 16 or up to this, or not at all (runtime.py settle_fused)
FUSED_DECODE_MAX_TOKENS = 64

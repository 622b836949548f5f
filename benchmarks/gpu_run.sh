#!/usr/bin/env bash
# The torch backend on the lent GPU machine (one H200): the GPU test subset, the paged-attention kernel
# benchmark and the decode benchmarks against HF transformers, logs under $OUT (benchmarks/results/ once
# fetched). Run from the repository root: `bash benchmarks/gpu_run.sh [tests|kernel|smollm2|8b ...]` (all parts
# by default; a device call is at most 10 minutes, so split them across calls). `tp` (not a default part: it
# needs 2 GPUs, nvidia-h200-x2 or larger) runs the torch backend's tensor-parallel test, its ranks over NCCL;
# `profile` (not a default part either) the kernels of one decode step (benchmarks/gpu_step_profile.py);
# `numerics` (nor this) where ours parts from transformers, layer by layer (benchmarks/gpu_numerics.py).
# The machine's torch 2.11 + CUDA 13 and Triton are used as found; the wheels it lacks (onnx-ir>=1.1, llguidance,
# gguf, onnxruntime>=1.31) sit in .whl/ (pip download ... -d .whl, see /work/.library/device/README.md) and go
# to /tmp/site first.
# The fused decode layer's A/B: SMOLLM2_ARGS=--unfused (or LLAMA8B_ARGS) runs ours a second time with steps of few
# tokens through the compiled layer, in the same process; TRTBUILD_FUSED_DECODE=off OUT=<dir> before the script
# turns it off for every part.
# BASE=<commit>: the parts again (tests excepted) on that commit's engine_builder/, logs under $OUT/base: a paired
# A/B on one machine, whose speed drifts between calls; engine_builder/ is back at HEAD after.
# TRTBUILD_MEMORY_GB: the host-RAM plan is the CPU twin's (formats/memory_plan.py); the torch backend's KV and
# activations live on the GPU, and Firecracker's MemTotal starts far below the machine's 128 GiB
export TRTBUILD_MEMORY_GB=${TRTBUILD_MEMORY_GB:-2000}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-build/gpu-run}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=$PWD:/tmp/site
else
  export PYTHONPATH=$PWD
fi
PARTS=${*:-tests kernel smollm2 8b}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, triton, transformers, onnxruntime; print("torch", torch.__version__, "cuda", torch.version.cuda,
"triton", triton.__version__, "transformers", transformers.__version__, "onnxruntime", onnxruntime.__version__)'
} 2>&1 | tee "$OUT/env.txt"
for part in $PARTS; do
  case $part in
    tests)  # the torch backend's tests on CUDA (the SmolLM2 GGUF, 98 MB, does not travel: its tests stay on CPU);
      # eager steps in the LLM tests (each LLM would compile anew), the compiled path in test_decode_inputs.py
      TRTBUILD_TEST_DEVICE=cuda TRTBUILD_TORCH_COMPILE=off timeout ${TESTS_S:-240} python3 -m pytest -q -x \
        -p no:cacheprovider tests/runner/torch_backend/test_paged_attention_triton.py \
        tests/runner/torch_backend/test_decode_inputs.py tests/runner/torch_backend/test_torch_backend.py \
        tests/runner/torch_backend/test_async_decode.py tests/runner/torch_backend/test_warm_up.py \
        tests/runner/torch_backend/test_rotary_kv_write_triton.py \
        tests/runner/torch_backend/test_decode_linear_triton.py tests/runner/torch_backend/test_fused_decode.py \
        tests/vision/test_torch_backend_images.py -k "not smollm2 and not in_interpreter" -rfE \
        > "$OUT/gpu-tests.log" 2>&1
      grep -E "passed|failed|^FAILED|^ERROR" "$OUT/gpu-tests.log" | tail -20
      # a device-side assert is reported at a later call: the failed tests again, each launch synchronous
      failed=$(grep -oE "^FAILED [^ ]+" "$OUT/gpu-tests.log" | cut -d" " -f2 | head -3)
      if [ -n "$failed" ]; then
        TRTBUILD_TEST_DEVICE=cuda TRTBUILD_TORCH_COMPILE=off CUDA_LAUNCH_BLOCKING=1 timeout 120 python3 -m pytest -q \
          -p no:cacheprovider $failed > "$OUT/gpu-tests-blocking.log" 2>&1
        grep -E "^E |^\S+\.py:[0-9]+: in" "$OUT/gpu-tests-blocking.log" | head -30
      fi ;;
    tp)  # 2 ranks, one per GPU, NCCL between them, decode steps captured with their collectives in CUDA graphs
      TRTBUILD_TEST_DEVICE=cuda timeout ${TP_S:-300} python3 -m pytest -q -x -p no:cacheprovider \
        tests/runner/torch_backend/test_torch_tp.py -rfE > "$OUT/gpu-tp-tests.log" 2>&1
      grep -E "passed|failed|^FAILED|^ERROR" "$OUT/gpu-tp-tests.log" | tail -20 ;;
    kernel)
      timeout ${KERNEL_S:-150} python3 benchmarks/gpu_paged_attention.py --json "$OUT/paged-attention.json" 2>&1 \
        | tail -60 | tee "$OUT/paged-attention.txt" ;;
    numerics)  # not a default part: ours vs transformers layer by layer, eager / compiled / warmed (gpu_numerics.py)
      timeout ${NUMERICS_S:-420} python3 benchmarks/gpu_numerics.py --shape ${NUMERICS_SHAPE:-llama3-8b} ${NUMERICS_ARGS:-} \
        --json "$OUT/gpu-numerics.json" 2>&1 | grep -v "Loading weights\|regex pattern" | tail -40 | tee "$OUT/gpu-numerics.txt" ;;
    profile)  # not a default part: the kernels of a decode step and the host around them (gpu_step_profile.py)
      timeout ${PROFILE_S:-240} python3 benchmarks/gpu_step_profile.py --shape ${PROFILE_SHAPE:-smollm2} ${PROFILE_ARGS:-} \
        --json "$OUT/gpu-step-profile.json" 2>&1 | grep -v "^USDT" | tail -60 | tee "$OUT/gpu-step-profile.txt" ;;
    smollm2)
      timeout ${SMOLLM2_S:-250} python3 benchmarks/gpu_decode.py --shapes smollm2 ${SMOLLM2_ARGS:-} --json "$OUT/gpu-decode-smollm2.json" 2>&1 \
        | tail -60 | tee "$OUT/gpu-decode-smollm2.txt" ;;
    8b)
      timeout ${LLAMA8B_S:-560} python3 benchmarks/gpu_decode.py --shapes llama3-8b --serve-len 128 1000 ${LLAMA8B_ARGS:-} --json "$OUT/gpu-decode-8b.json" 2>&1 \
        | tail -60 | tee "$OUT/gpu-decode-8b.txt" ;;
  esac
done
if [ -n "${BASE:-}" ]; then
  if ! git diff --quiet HEAD -- engine_builder; then
    echo "BASE=$BASE: engine_builder/ differs from HEAD; commit first (it is checked out at HEAD again after)"
    exit 2
  fi
  git checkout -q "$BASE" -- engine_builder && mkdir -p "$OUT/base" && OUT="$OUT/base" BASE= bash "$0" ${PARTS//tests/}
  git checkout -q HEAD -- engine_builder
fi
ls "$OUT"

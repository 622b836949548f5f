#!/usr/bin/env bash
# Issue 23 on a machine with 2+ GPUs: the tp/pp tests over NCCL, then the collectives benchmark with one rank
# per GPU (WORLD=4 on a 4-GPU machine adds the tp=4 test over NCCL and tp=4 to the decode part).
# Run from the repository root: `bash benchmarks/tp_on_gpus.sh [tests|collectives]` (both by default; one part
# each keeps a device call under its 10-minute limit). Wheels the machine lacks (onnx-ir>=1.1, fastapi, uvicorn, pydantic, llguidance)
# may sit in .whl/ (pip download ... -d .whl); they are installed into /tmp/site first.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-build/tp-on-gpus}
WORLD=${WORLD:-$(nvidia-smi -L | wc -l)}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=$PWD:/tmp/site
else
  export PYTHONPATH=$PWD
fi
python3 -c 'import torch, onnxruntime; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count(), "onnxruntime", onnxruntime.__version__)' | tee "$OUT/env.txt"
PART=${1:-all}
[ "$PART" = collectives ] || timeout 300 python3 -m pytest -q -p no:cacheprovider tests/runner/test_parallel_ranks.py tests/server/test_serve_parallel.py -rA 2>&1 \
  | grep -E "PASSED|FAILED|ERROR|passed|failed|Error" | tee "$OUT/tests.txt"
[ "$PART" = tests ] && { ls "$OUT"; exit 0; }
[ "$WORLD" -gt 2 ] || timeout 150 python3 benchmarks/collectives.py --backend nccl --model tiny --json > /dev/null \
  2> "$OUT/collectives-tiny.err"
timeout 420 python3 benchmarks/collectives.py --backend nccl --world-size "$WORLD" --model smollm2 --json > /dev/null \
  2> "$OUT/collectives.err"
cp benchmarks/results/collectives-nccl-*.json "$OUT/" 2>/dev/null
ls "$OUT"

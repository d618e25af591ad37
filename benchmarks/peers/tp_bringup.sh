#!/usr/bin/env bash
# Bring-up of the builtin engine's tensor parallelism on two GPUs, from the repository root on the GPU host:
#   1. the gpu-marked test (tests/test_engine_tp_gpu.py: two GPUs over NCCL decode the one-GPU engine's tokens,
#      CUDA graphs with the all-reduces captured, Triton kernels, steps run ahead, the adaptive width);
#   2. a short smoke of `serve --fast --tensor-parallel-size 2` on gemma-4-31B-it's shape with random weights
#      (--load-format dummy), through benchmarks/peers/two_clients.py: DFlash at synthetic tau 6.5, 8 requests at
#      concurrency 8, 32 tokens each (its rows and the server's log go to OUT).
# Usage: bash benchmarks/peers/tp_bringup.sh DATA_DIR OUT_DIR   (DATA_DIR: a copy of the prompt sets; about 5 min)
set -uo pipefail
data=${1:?usage: tp_bringup.sh DATA_DIR OUT_DIR}
out=${2:?usage: tp_bringup.sh DATA_DIR OUT_DIR}
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$out"
work=${TMPDIR:-/tmp}/tp_smoke  # the smoke's shape and server logs, on the host
nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv > "$out/gpus_before.csv" 2>&1
timeout 330 python -m pytest -q -m gpu -p no:cacheprovider tests/test_engine_tp_gpu.py > "$out/tp_gpu_test.txt" 2>&1
test_rc=$?
tail -5 "$out/tp_gpu_test.txt"
timeout 250 python -m benchmarks.peers.two_clients --engine builtin --shape gemma-4-31B-it --tensor-parallel-size 2 \
    --modes dflash --synthetic-tau 6.5 --concurrency 8 --new-tokens 32 --requests-per-slot 1 --time-limit 240 \
    --best-effort --data-dir "$data" --work "$work" --out "$out/tp_smoke.json"
smoke_rc=$?
cp "$work"/logs/*.log "$out/" 2>/dev/null
echo "gpu test exit $test_rc; smoke exit $smoke_rc"
exit $(( test_rc != 0 || smoke_rc != 0 ))

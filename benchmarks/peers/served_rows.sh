#!/usr/bin/env bash
# The served step as rows grow, in one call of the device tool on one GPU: the builtin engine (`serve --fast`), then
# vLLM 0.26.0, each serving the Qwen3-8B shape (random weights) AR at 32, 64 and 128 rows with 1024 tokens out,
# measured by `dflash-bench run` (benchmarks.peers.two_clients, one wave of requests a cell), each engine under a
# time limit of its own so that both fit the call's ten minutes (270 s and 280 s; the plans estimate 263 s, writing
# the 8B pair included, and 233 s; on an H200 the builtin server was ready in 57 s, vLLM's in 135 s). vLLM's own
# client is left out: with it both engines need about 13 minutes (two_clients.py --clients dflash-bench,vllm-bench,
# one engine a call).
#
#   OUT=DIR bash benchmarks/peers/served_rows.sh [--gpu h200] [--builtin-seconds S] [--vllm-seconds S] [--dry-run]
#
# Carry .vllm-bundle (sourced first: the GPU host's Python lacks the harness's packages; the builtin engine runs on
# the bundle's torch too) and .data (the prompt sets; DFLASH_BENCH_DATA points elsewhere). Results: rows added to
# OUT/two_clients_GPU_rows.json (copy it into benchmarks/results/ and run `python -m benchmarks.tables`), the
# servers' logs in OUT/logs, the console in OUT/served_rows.log. --dry-run: each engine's plan and estimate, no
# folder written, no bundle unpacked and no server started (the CPU rehearsal).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
gpu=h200 builtin_s=270 vllm_s=280 dry=""
while [ $# -gt 0 ]; do
  case $1 in
    --gpu) gpu=$2; shift 2 ;;
    --builtin-seconds) builtin_s=$2; shift 2 ;;
    --vllm-seconds) vllm_s=$2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    *) echo "served_rows.sh: unknown option $1 (the options are at the head of this file)" >&2; exit 2 ;;
  esac
done
[ -n "${OUT:-}" ] || { echo "served_rows.sh: set OUT to the folder the results go to" >&2; exit 2; }
data=${DFLASH_BENCH_DATA:-$PWD/.data}
[ -d "$data" ] || { echo "served_rows.sh: no prompt sets at $data: carry .data (a copy of the prompt sets)" >&2; exit 2; }
if [ -z "$dry" ]; then  # a plan needs no bundle: a dry run does not unpack one
  [ -f .vllm-bundle/setup.sh ] || {
    echo "served_rows.sh: .vllm-bundle is not on this machine: build it with tools/vllm_bundle/build.sh .vllm-bundle and carry it" >&2
    exit 2
  }
  . .vllm-bundle/setup.sh || exit 2
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
work=${SERVED_ROWS_WORK:-/tmp/served-rows}
# --best-effort: a slow start costs the last cells, not the whole engine (vLLM's plan counts writing the 8B pair
# when it is missing, as in a dry run, where the builtin step wrote nothing)
plan=()
[ -n "$dry" ] && plan=(--plan-only)
status=0
for engine in builtin vllm; do
  limit=$builtin_s
  [ "$engine" = vllm ] && limit=$vllm_s
  python3 -m benchmarks.peers.two_clients --engine "$engine" --shape qwen3-8b --modes ar --concurrency 32,64,128 \
    --new-tokens 1024 --requests-per-slot 1 --clients dflash-bench --time-limit "$limit" --data-dir "$data" \
    --work "$work" --out "$OUT/two_clients_${gpu}_rows.json" --best-effort "${plan[@]}" \
    2>&1 | tee -a "$OUT/served_rows.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
done
[ -n "$dry" ] || cp -r "$work/logs" "$OUT/logs" 2>/dev/null
exit $status

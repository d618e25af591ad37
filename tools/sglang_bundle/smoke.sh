#!/usr/bin/env bash
# smoke.sh TARGET DRAFTER [OUTDIR]: on the GPU host, from the project root with .sglang-bundle carried:
# unpack the bundle, print versions, then start an AR and a DFlash SGLang server in turn, wait for
# /health, send one /generate request to each and print its meta_info and the spec lines of /metrics.
# Logs go to OUTDIR (default ${OUT:-/tmp}/sglang-smoke). SGLANG_SMOKE_ARGS replaces the extra server flags (default:
# CUDA graphs up to batch 8 only, to keep the start short). Exit status: 0 when both servers answered.
set -uo pipefail
target=$(realpath "$1") drafter=$(realpath "$2")
logs=${3:-${OUT:-/tmp}/sglang-smoke}
mkdir -p "$logs"
. "${SGLANG_BUNDLE:-.sglang-bundle}/setup.sh" || exit 1
python3 - <<'EOF'
import importlib.metadata as md, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))
for p in ("sglang", "sglang-kernel", "transformers", "tokenizers", "triton", "xgrammar", "apache-tvm-ffi", "fastapi"):
    print(p, md.version(p))
import sgl_kernel  # loads sgl_kernel/sm90/common_ops.abi3.so on Hopper
print("sgl_kernel ops from", sgl_kernel.common_ops.__file__)
EOF
echo "nvcc: $(command -v nvcc || echo "not on PATH (CUDA_HOME=${CUDA_HOME:-unset})")"

port=30000 failed=0
for mode in ar dflash; do
  port=$((port + 1))
  args=(--model-path "$target" --port "$port" --attention-backend triton --sampling-backend pytorch
        --mem-fraction-static 0.5 --enable-metrics --log-level info ${SGLANG_SMOKE_ARGS:---cuda-graph-max-bs 8})
  [ "$mode" = dflash ] && args+=(--speculative-algorithm DFLASH --speculative-draft-model-path "$drafter"
                                 --speculative-draft-attention-backend triton)
  echo "== $mode: python3 -m sglang.launch_server ${args[*]}"
  t0=$(date +%s)
  python3 -m sglang.launch_server "${args[@]}" > "$logs/server-$mode.log" 2>&1 &
  pid=$!
  until curl -sf "localhost:$port/health" > /dev/null; do
    if ! kill -0 "$pid" 2> /dev/null || [ $(( $(date +%s) - t0 )) -gt 280 ]; then
      echo "$mode: no /health after $(( $(date +%s) - t0 )) s; the log ends:"; tail -40 "$logs/server-$mode.log"
      failed=1; break
    fi
    sleep 2
  done
  if kill -0 "$pid" 2> /dev/null && curl -sf "localhost:$port/health" > /dev/null; then
    echo "$mode: /health after $(( $(date +%s) - t0 )) s"
    curl -s "localhost:$port/generate" -H 'Content-Type: application/json' -d '{"text":
      "<|im_start|>user\nWrite a Python function that reverses a list.<|im_end|>\n<|im_start|>assistant\n",
      "sampling_params": {"max_new_tokens": 128, "temperature": 0}}' > "$logs/generate-$mode.json"
    python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); m = r.get("meta_info", {})
print("text:", repr(r.get("text", r)[:160]))
print("meta_info:", {k: v for k, v in m.items() if k in ("completion_tokens", "prompt_tokens", "e2e_latency") or k.startswith("spec_")})' \
      "$logs/generate-$mode.json" || { cat "$logs/generate-$mode.json"; failed=1; }
    curl -s "localhost:$port/metrics" | grep -E '^sglang:(spec_|generation_tokens_total|num_requests_total)' | head -20
  fi
  kill "$pid" 2> /dev/null  # launch_server ends its scheduler and detokenizer processes itself
  for _ in $(seq 30); do kill -0 "$pid" 2> /dev/null || break; sleep 1; done
  kill -9 "$pid" 2> /dev/null; wait "$pid" 2> /dev/null
  grep -iE "error|warn.*(jit|flashinfer)|DFLASH draft runner" "$logs/server-$mode.log" | head -15
done
exit $failed

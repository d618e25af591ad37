#!/usr/bin/env bash
# probe_dflash.sh TARGET DRAFTER OUTDIR: a DFLASH server as the harness starts it, then /generate three ways
# (plain; streamed; streamed with return_logprob and top 2, as `--save-token-ids` asks): raw replies and the
# server log into OUTDIR, to see what the harness sees.
set -uo pipefail
target=$(realpath "$1") drafter=$(realpath "$2") out=$3
mkdir -p "$out"
. "${SGLANG_BUNDLE:-.sglang-bundle}/setup.sh" || exit 1
port=30011
python3 -m sglang.launch_server --model-path "$target" --port "$port" --attention-backend triton \
  --sampling-backend pytorch --mem-fraction-static 0.5 --enable-metrics --speculative-algorithm DFLASH \
  --speculative-draft-model-path "$drafter" --speculative-num-draft-tokens 16 > "$out/server.log" 2>&1 &
pid=$!
for _ in $(seq 150); do curl -sf "localhost:$port/health" > /dev/null && break; sleep 2; done
text='<|im_start|>user\nWrite a Python function that reverses a list.<|im_end|>\n<|im_start|>assistant\n'
sp='"sampling_params": {"max_new_tokens": 64, "temperature": 0}'
for kind in plain stream stream_logprob; do
  extra=""
  [ "$kind" != plain ] && extra=', "stream": true'
  [ "$kind" = stream_logprob ] && extra="$extra"', "return_logprob": true, "top_logprobs_num": 2'
  t0=$(date +%s.%N)
  curl -s "localhost:$port/generate" -H 'Content-Type: application/json' -d "{\"text\": \"$text\", $sp$extra}" > "$out/$kind.txt"
  echo "$kind: $(echo "$(date +%s.%N) - $t0" | bc) s, $(wc -c < "$out/$kind.txt") bytes"
  tail -c 1500 "$out/$kind.txt" | tr -d '\n' | grep -o '"meta_info":{[^}]*' | tail -1 | cut -c1-700; echo
done
curl -s "localhost:$port/metrics" | grep -E '^sglang:(spec|num_requests)' | head
kill "$pid"; sleep 5; kill -9 "$pid" 2> /dev/null
grep -iE "error|exception|traceback|warn" "$out/server.log" | head -20

#!/usr/bin/env bash
# The mission's table on the GPU host: a large pair's shape (random weights, --load-format dummy; gemma-4-31B-it unless
# --pair names another of dflash_bench/model_shapes.py) through vLLM, SGLang and the builtin engine, AR and DFlash,
# one call of the device tool at a time (10 minutes, 64 MiB carried).
#
#   bash benchmarks/peers/mission.sh [--pair P] [--gpu h100|h200] [--tp N] [--seconds S] [--suites A,B] [-n N]
#        [--waves W] [-c 1,8,32] [--max-tokens N] [--synthetic-acceptance TAU|card] [--modes ar,dflash[,eagle3]]
#        [--input-len 128,1k,4k] [--long-c 1,8] [--long-tokens N] [--batched-tokens N] [--parallel] STEP...
#
# STEP, run in the order given, each in a shell of its own (one engine's bundle at a time), until S seconds
# (default 570) have passed since the start; a step that cannot finish in the time left is cut (SIGTERM: the
# sweep stops its server and records the cell as interrupted) and the steps after it are skipped, saying so.
# --parallel: the steps run at once instead, each on GPUs of its own (the first GPU step on the first --tp GPUs,
# the next on the next --tp; an emulator step on none), each cut at the same deadline, each step's console in
# OUT/logs/STEP.console and then in this one's: two one-GPU steps share one two-GPU call. Refused where the
# machine has fewer GPUs than the GPU steps take, or a step is named twice. The steps:
#
#   vllm-pair     vLLM 0.26.0 (.vllm-bundle) on one GPU: benchmarks.peers.two_clients, DFlash then AR at concurrency 1
#                 and 8, 128 new tokens, measured by `dflash-bench run` and `vllm bench serve`
#   vllm          dflash-bench sweep --engine vllm    (.vllm-bundle)      } AR and DFlash, --suites (gsm8k,mt-bench),
#   sglang        dflash-bench sweep --engine sglang  (.sglang-bundle)    } -c (1,8,32), -n prompts a cell (8, raised
#   builtin       dflash-bench sweep --engine builtin (either bundle)     } to the concurrency; with --waves W, W x the
#                 concurrency and at least -n), --max-tokens new tokens (128); DFlash with the shape's random drafter
#   vllm-tau      DFlash only, at synthetic acceptance --synthetic-acceptance (default card: each suite's tau from
#   builtin-tau   the model card, the card's mean for a suite it has no row for): one profile for both engines,
#                 a server per suite's profile; their AR cells are the vllm and builtin steps'. SGLang has none.
#   vllm-long     the input-length axis: AR and DFlash at the same acceptance over gsm8k and prompts of about
#   builtin-long  --input-len tokens of real text (128,1k,4k: the long-<N> suites), -c --long-c (1,8), --long-tokens
#                 new tokens (512)
#   emulator      the same sweeps through the emulator (no GPU, no bundle needed): the CPU rehearsal of the whole
#   emulator-tau  path (shape, sweep, profiles, deadline, saving, resuming), and the report's test folders
#   emulator-long
#
# --batched-tokens N: the vllm steps' --max-num-batched-tokens (8192, for every vLLM row alike): vLLM's DFlash sets
# aside (block - 2) of it a row for drafting, so a concurrency whose verify does not fit (the sweep says so before it
# launches, or refuses where nothing is left) needs more: N >= c x (2 x block - 2) lets every row verify in a step.
# --tp N: GPUs per server (tensor parallel: vLLM, SGLang, and the builtin engine's fast path, `serve --fast
# --tensor-parallel-size`). --synthetic-acceptance and --modes go to the vllm and emulator steps' sweeps as they
# are (their DFlash and EAGLE-3 servers draw the acceptance, EAGLE-3's with the head big_shape writes for the pair;
# SGLang's servers speculate with the shape's random drafter, tau about 1); --modes goes to the builtin step's too,
# less eagle3 (`--modes ar vllm builtin`: the AR cells the -tau steps' DFlash cells are read against); the -tau and
# -long steps take only
# --synthetic-acceptance. Everything is written under $OUT: each step's sweep folder
# (OUT/sweeps/NAME-PAIR-GPU-tpN/<sweep>/, kept on the machine too and resumed by a later call of the same step
# with the same --modes and --synthetic-acceptance; other ones start a sweep of their own beside it),
# all of them as OUT/sweeps.tar.gz, two_clients' results file, the server logs and this command's console
# (OUT/mission.log). On a fresh machine an earlier call's sweeps resume from a carried .mission/sweeps.tar.gz (that
# OUT/sweeps.tar.gz), or .mission/sweeps.tar.xz (the same, recompressed by `xz -9`: about half the size, for when
# the 64 MiB of carried files leave too little room; $MISSION_CARRY names another folder than .mission). A step
# whose bundle is not on this machine (neither carried nor left by an earlier call) is skipped in one sentence.
# Shape folders are written once into $MISSION_WORK (default /tmp/mission), kept for later calls on a warm machine.
#
# CPU rehearsal of every step's plan (no server starts): MISSION_DRY_RUN=1 OUT=/tmp/o bash benchmarks/peers/mission.sh ...
# (MISSION_PORT=N: the servers listen on port N instead of a free port each)
set -uo pipefail
set -m  # each step runs in a process group of its own, which the deadline can stop whole
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
STEPS="vllm-pair vllm vllm-tau vllm-long sglang builtin builtin-tau builtin-long emulator emulator-tau emulator-long"
gpu=h100 tp=1 seconds=570 suites=gsm8k,mt-bench prompts=8 waves="" conc=1,8,32 tokens=128 steps=() pair=gemma-4-31B-it
parallel=""
tau="" modes="" input_len=128,1k,4k long_conc=1,8 long_tokens=512 batched=8192
while [ $# -gt 0 ]; do
  case $1 in
    --pair) pair=$2; shift 2 ;;
    --synthetic-acceptance) tau=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --gpu) gpu=$2; shift 2 ;;
    --tp) tp=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --suites) suites=$2; shift 2 ;;
    -n) prompts=$2; shift 2 ;;
    --waves) waves=$2; shift 2 ;;
    -c) conc=$2; shift 2 ;;
    --max-tokens) tokens=$2; shift 2 ;;
    --input-len) input_len=$2; shift 2 ;;
    --long-c) long_conc=$2; shift 2 ;;
    --long-tokens) long_tokens=$2; shift 2 ;;
    --batched-tokens) batched=$2; shift 2 ;;
    --parallel) parallel=1; shift ;;
    -*) echo "mission.sh: unknown option '$1'" >&2; exit 2 ;;
    *) case " $STEPS " in *" $1 "*) steps+=("$1"); shift ;;
         *) echo "mission.sh: unknown argument '$1' (steps: $STEPS)" >&2; exit 2 ;; esac ;;
  esac
done
case $gpu in h100|h200) ;; *) echo "mission.sh: --gpu takes h100 or h200, not '$gpu'" >&2; exit 2 ;; esac
case $batched in ""|*[!0-9]*|0) echo "mission.sh: --batched-tokens takes a positive number of tokens, not '$batched'" >&2; exit 2 ;; esac
[ ${#steps[@]} -gt 0 ] || { echo "mission.sh: name at least one step ($STEPS)" >&2; exit 2; }
[ -n "${OUT:-}" ] || { echo "mission.sh: set OUT to the folder that receives the results" >&2; exit 2; }
shapes=$(python3 -c "from dflash_bench.model_shapes import SHAPES; print(' '.join(SHAPES))" 2>/dev/null)
case " $shapes " in *" $pair "*) ;; *) echo "mission.sh: no recorded shape for --pair '$pair': use one of $shapes" >&2; exit 2 ;; esac
declare -A devices=()  # --parallel: each step's CUDA_VISIBLE_DEVICES
if [ -n "$parallel" ]; then
  gpu_steps=() seen=" "
  for s in "${steps[@]}"; do
    case $seen in *" $s "*) echo "mission.sh: --parallel runs each step once, and '$s' is named twice" >&2; exit 2 ;; esac
    seen+="$s "
    case $s in emulator*) devices[$s]="" ;; *) gpu_steps+=("$s") ;; esac
  done
  have=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  want=$(( ${#gpu_steps[@]} * tp ))
  if [ -z "${MISSION_DRY_RUN:-}" ] && [ "$want" -gt "$have" ]; then
    echo "mission.sh: --parallel gives ${#gpu_steps[@]} GPU step(s) $tp GPU(s) each, $want in all, and this machine has $have" >&2
    exit 2
  fi
  command -v flock > /dev/null || { echo "mission.sh: --parallel needs flock (util-linux) to set the steps up one at a time" >&2; exit 2; }
  k=0
  for s in "${gpu_steps[@]}"; do
    devices[$s]=$(seq -s, $((k * tp)) $((k * tp + tp - 1)))
    k=$((k + 1))
  done
fi
mkdir -p "$OUT/sweeps" "$OUT/logs"
exec > >(tee -a "$OUT/mission.log") 2>&1

start=$(date +%s)
deadline=$((start + seconds))
work=${MISSION_WORK:-/tmp/mission}
data=${DFLASH_BENCH_DATA:-$PWD/.data}
dry=${MISSION_DRY_RUN:-}
spec=()  # what the vllm and emulator steps' sweeps take of --synthetic-acceptance and --modes
[ -n "$tau" ] && spec+=(--synthetic-acceptance "$tau")
[ -n "$modes" ] && spec+=(--modes "$modes")
case ,$modes, in *,eagle3,*) spec+=(--eagle3 "$work/$pair-EAGLE3") ;; esac
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DFLASH_BENCH_DATA=$data
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
base_path=$PYTHONPATH
[ -d "$data" ] || { echo "mission.sh: no prompt sets at $data: carry .data (a copy of shared/datasets)" >&2; exit 2; }
echo "mission.sh: steps ${steps[*]} of $pair on --gpu $gpu --tp $tp, until $(date -u -d "@$deadline" +%H:%M:%S) UTC ($seconds s)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
for carried in "${MISSION_CARRY:-.mission}"/sweeps.tar.{gz,xz}; do  # an earlier call's OUT/sweeps.tar.gz (or it
  # recompressed), carried to a fresh machine: resumed; tar reads either compression
  [ -f "$carried" ] || continue
  mkdir -p "$work" && tar -xf "$carried" -C "$work" --skip-old-files \
    && echo "mission.sh: the sweeps of $carried are resumed where this machine has none of its own"
done

setup_lock() { # --parallel: one step at a time unpacks its bundle and writes the shape (both in shared folders of
  # $work); the lock goes with the step's shell, or when its sweep starts (setup_done)
  [ -n "$parallel" ] || return 0
  mkdir -p "$work" && exec 9> "$work/.setup.lock" && flock 9
}

setup_done() {
  [ -n "$parallel" ] || return 0
  flock -u 9 2> /dev/null; exec 9>&-
}

shape() { # shape hf|sglang: the pair's folders in $work, written once (configs and a trained tokenizer)
  local target=$work/$pair; [ "$1" = sglang ] && target=$work/sglang/$pair
  [ -f "$target/config.json" ] && [ -f "$work/$pair-DFlash/config.json" ] && return 0
  python3 -m benchmarks.peers.big_shape --pair "$pair" --out "$work" --data-dir "$data" --naming "$1" > /dev/null
}

bundle() { # bundle DIR: source DIR/setup.sh in this (sub)shell, or say why not; a dry run sources none (a plan
  # needs no bundle, and sourcing one unpacks it). Status 3: the bundle is not here (the step is skipped); 1: it is,
  # and it did not set up (the step fails)
  if [ ! -f "$1/setup.sh" ]; then
    local tool=${1#.}
    echo "skipped: $1 is not on this machine: build it with tools/${tool/-/_}/build.sh $1 and carry it"
    [ -n "$dry" ] && return 0  # a dry run goes on without it
    return 3
  fi
  if [ -n "$dry" ]; then
    echo "dry run: $1 is not unpacked"
    return 0
  fi
  if [ "$1" = .vllm-bundle ]; then
    # vLLM inspects each model class in a subprocess the first time a machine serves it (30 s each: the target's
    # and the drafter's) and caches what it found by the module file's hash; these are that cache for the bundle's
    # vLLM, written by vLLM itself (tools/vllm_bundle/README.md). A file of another vLLM is stale and re-made.
    local mi=${VLLM_CACHE_ROOT:-$HOME/.cache/vllm}/modelinfos
    mkdir -p "$mi" && cp -n tools/vllm_bundle/modelinfos/*.json "$mi/" 2> /dev/null
  fi
  # shellcheck disable=SC1090,SC1091
  . "$1/setup.sh" || { echo "failed: $1/setup.sh did not set the bundle up (its lines above say why)"; return 1; }
  export PYTHONPATH="$base_path:$PYTHONPATH"
}

harness_env() { # the harness's own Python packages the host lacks (pydantic, orjson, fastapi, uvicorn), and those only: symlinks in
  # $work/harness-site to a bundle's unpacked copies. Not the bundle's whole site: the SGLang bundle's transformers
  # 5.12.1 would shadow the host's 5.17, which the builtin engine's Gemma 4 reads (per-layer head sizes).
  python3 -c "import pydantic, orjson, fastapi, uvicorn" 2> /dev/null && return 0
  [ -z "$dry" ] || { echo "skipped: the harness needs pydantic and orjson here, and a dry run unpacks no bundle"; return 1; }
  local site=""
  if [ -f .vllm-bundle/unpack.py ]; then
    site=${VLLM_SITE:-${TMPDIR:-/tmp}/vllm-site}; python3 .vllm-bundle/unpack.py "$site" > /dev/null || site=""
  fi
  if [ -z "$site" ] && [ -f .sglang-bundle/unpack.py ]; then
    site=${SGLANG_SITE:-${TMPDIR:-/tmp}/sglang-site}; python3 .sglang-bundle/unpack.py "$site" > /dev/null || site=""
  fi
  [ -n "$site" ] || { echo "skipped: the harness needs pydantic and orjson here: carry .vllm-bundle or .sglang-bundle"; return 1; }
  local h=$work/harness-site p
  mkdir -p "$h"
  for p in pydantic pydantic_core annotated_types typing_inspection orjson fastapi starlette uvicorn; do
    ln -sfn "$site/$p" "$h/$p"
    for d in "$site/$p"-*.dist-info; do [ -e "$d" ] && ln -sfn "$d" "$h/$(basename "$d")"; done
  done
  export PYTHONPATH="$base_path:$h"
  python3 -c "import pydantic, orjson, fastapi, uvicorn" || { echo "skipped: the harness's packages from $site do not import"; return 1; }
}

sweep() { # sweep NAME ENGINE TARGET [extra sweep args...]: one sweep folder in $work/sweeps/NAME-GPU-tpN, copied
  # to $OUT/sweeps/ when it ends; a folder left there by an earlier call on this machine is resumed (--resume:
  # complete cells kept, the rest run), so a step the deadline cut goes on where it stopped
  local name=$1 engine=$2 target=$3; shift 3
  setup_done
  local dir=$work/sweeps/$name-$pair-$gpu-tp$tp
  mkdir -p "$dir"
  local cmd=(python3 -m dflash_bench sweep --model "$target" --drafter "$work/$pair-DFlash" --engine "$engine"
             --runner process --gpu "$gpu" --suites "$suites" -c "$conc" -n "$prompts" --max-tokens "$tokens"
             --data-dir "$data" --out "$dir" "$@")
  [ -z "$waves" ] || cmd+=(--waves "$waves")
  [ "$engine" = emulator ] || cmd+=(--tensor-parallel-size "$tp")
  [ -z "${MISSION_PORT:-}" ] || cmd+=(--port "$MISSION_PORT")  # the servers' port (default: a free one each)
  # gpt-oss: vLLM renders its chats with the Harmony encoding, whose vocabulary it downloads at the first chat (an
  # offline host has none) and whose parser fails on some of a random model's answers (`could not decode header`):
  # the shape's chat template (Harmony's turns) is rendered by the client and sent as completions
  case $pair in gpt-oss-*) [ "$engine" = sglang ] || cmd+=(--api completions) ;; esac
  local last
  last=$(resumable "$dir" "$@")
  [ -n "$last" ] && cmd+=(--resume "$last")
  if [ -n "$dry" ]; then cmd+=(--dry-run); fi
  echo "+ ${cmd[*]}"
  "${cmd[@]}"
  local rc=$?
  save
  return $rc
}

resumable() { # resumable DIR [sweep args...]: the newest sweep folder in DIR made with the same --modes,
  # --synthetic-acceptance (the sweep's defaults where they give none) and --engine-args as these args, so a step run
  # again with other modes (the random drafter's DFlash after the AR cells) or another --batched-tokens starts a
  # sweep of its own rather than failing to resume
  local dir=$1; shift
  python3 - "$dir" "$@" <<'PY'
import json, sys
from pathlib import Path
from dflash_bench.settings import DEFAULT_MODES

def tau(text):  # "7.8" and "7.80" are one acceptance; "card" is itself
    try:
        return float(text)
    except (TypeError, ValueError):
        return text

args = sys.argv[2:]
flag = {a: args[i + 1] for i, a in enumerate(args[:-1]) if a in ("--modes", "--synthetic-acceptance")}
engine_args = [a.split("=", 1)[1] for a in args if a.startswith("--engine-arg=")]
want = (sorted(flag.get("--modes", ",".join(DEFAULT_MODES)).split(",")), tau(flag.get("--synthetic-acceptance")),
        engine_args)
for manifest in sorted(Path(sys.argv[1]).glob("*/manifest.json"), reverse=True):
    try:
        have = json.loads(manifest.read_text())["settings"]
    except (OSError, ValueError, KeyError):
        continue
    if (sorted(have.get("modes") or []), tau(have.get("synthetic_acceptance")), have.get("engine_args") or []) == want:
        print(manifest.parent)
        break
PY
}

save() { # every sweep folder of this machine into $OUT/sweeps, and as one $OUT/sweeps.tar.gz: the device tool
  # brings back files at most two folders down, and a sweep folder's cells are deeper (each call's $OUT starts empty);
  # one step's save at a time (--parallel)
  [ -d "$work/sweeps" ] || return 0
  ( command -v flock > /dev/null && flock 8
    cp -r "$work/sweeps/." "$OUT/sweeps/" 2>/dev/null
    tar -czf "$OUT/sweeps.tar.gz" -C "$work" sweeps 2>/dev/null ) 8> "$work/.save.lock"
  return 0
}

variant() { # variant STEP ENGINE TARGET [args...]: the step's sweep; *-tau: DFlash only at --synthetic-acceptance
  # (card by default; its AR cells are the plain step's), *-long: AR and DFlash at it over the input lengths; a plain
  # step takes --synthetic-acceptance and --modes as given (spec)
  local name=$1; shift
  case $name in
    *-tau) sweep "$name" "$@" --modes dflash --synthetic-acceptance "${tau:-card}" ;;
    *-long) local suites=gsm8k conc=$long_conc tokens=$long_tokens
            sweep "$name" "$@" --input-len "$input_len" --synthetic-acceptance "${tau:-card}" ;;
    *) sweep "$name" "$@" "${spec[@]}" ;;
  esac
}

step() { # the body of one step, in a subshell
  setup_lock
  case $1 in
    vllm-pair)
      [ "$pair" = gemma-4-31B-it ] || { echo "skipped: vllm-pair measures gemma-4-31B-it only (two_clients.py's shapes)"; return 0; }
      bundle .vllm-bundle || { [ $? = 3 ] && return 0; return 1; }
      local cmd=(python3 -m benchmarks.peers.two_clients --engine vllm --shape gemma-4-31B-it --modes dflash,ar
                 --concurrency 1,8 --new-tokens 128 --requests-per-slot 2 --best-effort --data-dir "$data"
                 --work "$work" --out "$OUT/two_clients_vllm_gemma.json" --time-limit "$2")
      echo "+ ${cmd[*]}"
      [ -n "$dry" ] && return 0
      shape hf && setup_done && "${cmd[@]}"
      cp -r "$work/logs" "$OUT/logs/two_clients" 2>/dev/null ;;
    vllm|vllm-tau|vllm-long)
      bundle .vllm-bundle || { [ $? = 3 ] && return 0; return 1; }
      # Gemma 4 needs vLLM's triton attention for its 512-wide full-attention heads; the others keep the default
      local attention=()
      case $pair in gemma-4-*) attention=(--engine-arg=--attention-backend=triton_attn) ;; esac
      shape hf && variant "$1" vllm "$work/$pair" --engine-arg=--load-format=dummy "${attention[@]}" \
        --engine-arg=--max-num-batched-tokens="$batched" --engine-arg=--seed=0 ;;
    sglang)
      bundle .sglang-bundle || { [ $? = 3 ] && return 0; return 1; }
      shape sglang && sweep sglang sglang "$work/sglang/$pair" --engine-arg=--load-format=dummy \
        --engine-arg=--attention-backend=triton --engine-arg=--sampling-backend=pytorch --engine-arg=--random-seed=0 ;;
    emulator|emulator-tau|emulator-long)
      harness_env && shape hf && variant "$1" emulator "$work/$pair" ;;
    builtin|builtin-tau|builtin-long)
      harness_env || return 0
      local args=(--engine-arg=--fast --engine-arg=--load-format=dummy)
      if [ "$1" = builtin ]; then  # the plain builtin step: DFlash with the random drafter; --modes as given but eagle3
        local m=",$modes,"; m=${m//,eagle3,/,}; m=${m#,}; m=${m%,}
        spec=(); [ -z "$m" ] || spec=(--modes "$m")
      fi
      shape hf && variant "$1" builtin "$work/$pair" "${args[@]}" ;;
  esac
}

declare -A pids=() watchdogs=() started=()
launch() { # launch STEP: the step in a process group of its own, and its watchdog
  local s=$1 left=$((deadline - $(date +%s)))
  if [ "$left" -lt "${MISSION_MIN_STEP_S:-90}" ]; then
    echo "== $s: skipped, ${left} s left of $seconds"
    return 1
  fi
  started[$s]=$(date +%s)
  if [ -n "$parallel" ]; then
    local on="on no GPU"; [ -z "${devices[$s]}" ] || on="on CUDA_VISIBLE_DEVICES=${devices[$s]}"
    echo "== $s: $(date -u +%H:%M:%S) UTC, ${left} s left, $on; its console: $OUT/logs/$s.console"
    ( export CUDA_VISIBLE_DEVICES=${devices[$s]}; step "$s" $((left - 15)) ) > "$OUT/logs/$s.console" 2>&1 &
  else
    echo "== $s: $(date -u +%H:%M:%S) UTC, ${left} s left"
    ( step "$s" $((left - 15)) ) &
  fi
  local pid=$!
  pids[$s]=$pid
  # the step's own limit: SIGTERM to its process group at the deadline, read off the same clock as `left` (the sweep
  # records the cell as interrupted and stops its server), SIGKILL 10 s later
  ( while [ "$(date +%s)" -lt $((deadline - 5)) ]; do sleep 1; done
    echo "== $s: the deadline: stopping it"; kill -TERM -- -"$pid" 2>/dev/null; sleep 10
    kill -KILL -- -"$pid" 2>/dev/null ) &
  watchdogs[$s]=$!
}

finish() { # finish STEP: wait for a launched step, and for everything in its group
  local s=$1 pid=${pids[$1]} rc
  wait "$pid"; rc=$?
  # a step the deadline stopped: its shell ends at once, the sweep in its group only once it has recorded the cut
  # cell and stopped its server (bounded by the watchdog's SIGKILL), and nothing of it may outlive the step
  while kill -0 -- -"$pid" 2>/dev/null; do sleep 1; done
  kill -- -"${watchdogs[$s]}" 2>/dev/null; wait "${watchdogs[$s]}" 2>/dev/null
  if [ -n "$parallel" ]; then
    echo "== $s: its console"
    cat "$OUT/logs/$s.console"
  fi
  echo "== $s: exit $rc after $(( $(date +%s) - ${started[$s]} )) s"
}

if [ -n "$parallel" ]; then
  for s in "${steps[@]}"; do launch "$s"; done
  for s in "${steps[@]}"; do [ -n "${pids[$s]:-}" ] && finish "$s"; done
else
  for s in "${steps[@]}"; do launch "$s" && finish "$s"; done
fi
save  # the servers' logs are in each sweep folder; the two_clients logs were copied above
echo "mission.sh: done after $(( $(date +%s) - start )) s; results under $OUT"

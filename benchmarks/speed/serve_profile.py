"""Where a served run's host time goes: `serve --fast` under load, sampled by py-spy.

    python -m benchmarks.speed.serve_profile --py-spy PATH --data-dir DIR --out profile.json

Starts `dflash-bench serve --fast` (AR unless `--mode dflash`) for each `--model` (a model folder, or `shape`:
the Qwen3-8B-shaped random pair benchmarks/fixtures/shapes.py writes), runs `dflash-bench run` against it (GSM8K,
`--ignore-eos`), and meanwhile samples the server with `py-spy record --gil --nonblocking`: one sample per
tick of whichever thread holds the GIL. So the samples say how busy the interpreter was (samples / ticks)
and what held it: the engine thread (launching steps, bookkeeping, detokenizing) or the event loop (HTTP,
SSE). Each model's result: tok/s, TPOT, the engine thread's phases from /metrics, GIL-held share per
thread, and the top functions (inclusive and self) per thread. py-spy is a separate wheel
(`pip download py-spy`), unpacked with `pip install --no-index --target DIR`.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.fixtures.engine_metrics import engine_counters
from benchmarks.fixtures.shapes import ensure_shape_pair

from dflash_bench.errors import UserError
from dflash_bench.launch import launch_command
from dflash_bench.store import SweepDir

PAIR = Path(__file__).resolve().parents[2] / "dflash_bench" / "assets" / "default_pair" / "target"


def summarise(raw: Path, ticks: float, top: int) -> dict:
    """py-spy's raw output (`thread;frame;...;frame count` per line) -> per thread: share of ticks, top frames."""
    per_thread: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    self_time: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    held: collections.Counter = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        thread = re.sub(r"^thread \(\d+\): ", "", frames[0])
        held[thread] += int(n)
        for f in set(frames[1:]):
            per_thread[thread][f] += int(n)
        self_time[thread][frames[-1]] += int(n)
    return {t: dict(gil_share=round(n / ticks, 3), samples=n,
                    inclusive=per_thread[t].most_common(top), self=self_time[t].most_common(top))
            for t, n in held.most_common()}


def load_and_sample(args, server, tag: str, work: Path) -> tuple[dict, dict, float, Path]:
    """A warm-up, then the measured run under py-spy; the engine's counters before and after it."""
    load = [sys.executable, "-m", "dflash_bench", "run", "--url", server.url, "--suite", "gsm8k", "-c",
            str(args.concurrency), "--max-tokens", str(args.max_tokens), "--ignore-eos", "--engine", "builtin",
            "--data-dir", args.data_dir, "--out", str(work / "runs")] + args.run_arg
    subprocess.run(load + ["-n", str(args.concurrency), "--name", f"{tag}-warm"], stdout=subprocess.DEVNULL)
    before = engine_counters(server.url)
    raw = work / f"{tag}.raw"
    spy = subprocess.Popen([args.py_spy, "record", "-p", str(server.info.pid), "--gil", "--nonblocking", "--threads",
                            "-r", str(args.rate), "-f", "raw", "-o", str(raw)],
                           stdout=subprocess.DEVNULL, stderr=(work / f"{tag}.py-spy.log").open("w"))
    time.sleep(1.0)
    t = time.monotonic()
    subprocess.run(load + ["-n", str(args.prompts_per_slot * args.concurrency), "--name", tag],
                   stdout=subprocess.DEVNULL)
    seconds = time.monotonic() - t + 1.0
    spy.send_signal(signal.SIGINT)
    spy.wait(60)
    after = engine_counters(server.url)
    return after, before, seconds, raw


def profile(args, model: Path, draft: Path | None, tag: str, work: Path) -> dict:
    cmd = [sys.executable, "-m", "dflash_bench", "serve", "--model", str(model), "--port", str(args.port), "--fast",
           "--device", args.device, "--max-slots", str(args.concurrency), "--max-model-len", "1536",
           "--served-model-name", tag, "--mode", args.mode] + (["--draft", str(draft)] if draft else [])
    try:
        with launch_command(cmd, port=args.port, log_path=work / f"serve-{tag}.log", ready_timeout=480,
                            name=tag) as server:
            after, before, seconds, raw = load_and_sample(args, server, tag, work)
    except UserError as err:  # the server died or never answered: the sentence carries its log tail
        raise SystemExit(str(err)) from None
    [s] = SweepDir.open(work / "runs" / tag).summaries()
    root = str(PAIR.parents[3]) + "/"  # the results keep no path of the machine they ran on
    out = dict(model=str(model).replace(root, ""), mode=args.mode, concurrency=args.concurrency, max_tokens=args.max_tokens,
               tok_s=s.output_throughput, tpot_ms_p50=(s.tpot_ms.p50 if s.tpot_ms else None),
               ttft_ms_p50=(s.ttft_ms.p50 if s.ttft_ms else None), wall_s=round(seconds, 2),
               engine_thread_s={k: round(after[k] - before.get(k, 0.0), 3) for k in after if k not in ("groups", "steps")},
               threads=summarise(raw, args.rate * seconds, args.top) if raw.exists() else {},
               py_spy_log=(work / f"{tag}.py-spy.log").read_text()[-2000:])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", help="a model folder, or 'shape' (default: shape and the "
                    "embedded pair's target)")
    ap.add_argument("--mode", choices=["ar", "dflash"], default="ar")
    ap.add_argument("--py-spy", required=True, help="the py-spy binary")
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--prompts-per-slot", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rate", type=int, default=500, help="py-spy samples per second")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--port", type=int, default=8795)
    ap.add_argument("--work", default=".bench-work")
    ap.add_argument("--run-arg", action="append", default=[], help="passed to `dflash-bench run`, e.g. "
                    "--run-arg=--save-token-ids (token ids and logprobs in every chunk, as a sweep's lossless check asks)")
    ap.add_argument("--out")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    results = {}
    for m in args.model or ["shape", str(PAIR)]:
        if m == "shape":
            target, draft = ensure_shape_pair(work, args.device, "qwen3-8b")
        else:
            target = Path(m)
            draft = target.parent / "drafter" if (target.parent / "drafter").exists() else None
        tag = f"{'shape' if m == 'shape' else target.parent.name}-{args.mode}{'-'.join([''] + args.run_arg)}" \
              f"-{time.strftime('%H%M%S')}"
        r = profile(args, target, draft if args.mode == "dflash" else None, tag, work)
        results[tag] = r
        print(f"{tag}: {r['tok_s']:.1f} tok/s, TPOT p50 {r['tpot_ms_p50']:.2f} ms, engine thread {r['engine_thread_s']}",
              flush=True)
        for thread, t in r["threads"].items():
            print(f"  {thread}: GIL held {100 * t['gil_share']:.1f}% of ticks", flush=True)
            for f, n in t["self"][:12]:
                print(f"    self {n:>6}  {f[:140]}", flush=True)
        if args.out:
            tmp = Path(args.out + ".tmp")
            tmp.write_text(json.dumps(results, indent=2))
            tmp.replace(args.out)


if __name__ == "__main__":
    main()

"""Where a served run's host time goes as rows grow: `serve --fast` under load at each concurrency, sampled by
py-spy, beside the same engine driven in process without the server.

    python -m benchmarks.speed.serve_profile --py-spy PATH --data-dir DIR --out profile.json      # GPU
    python -m benchmarks.speed.serve_profile --py-spy PATH --data-dir DIR --shape host --device cpu \\
        --concurrency 32,64,128 --max-tokens 256 --in-process --out F                            # CPU, ~10 min

Starts one `dflash-bench serve --fast` (AR unless `--mode dflash`) per `--model` (a model folder) or `--shape`
(a random pair of benchmarks/fixtures/shapes.py, written into `--work` once; `host`: a step a CPU runs in a few
ms, so that the serving path's own cost shows), with a slot for each row of the highest concurrency, and at each
concurrency runs `dflash-bench run` against it (GSM8K, `--ignore-eos`, closed loop) while `py-spy record --gil
--nonblocking --subprocesses` samples the server and its engine's process: one sample per tick of whichever thread
holds a process's GIL. So the samples say how long each interpreter was held, and by what: the engine thread
(scheduling and launching steps, committing each row's tokens, detokenizing, handing results over) or the event
loop (taking requests in, making SSE chunks, writing them). Random weights: the tokens are noise, as in the GPU runs of the same shapes (their ids mostly
outside the small tokenizer's vocabulary).

Each cell's result: tok/s, TPOT and TTFT p50 as the client measured them, decode steps and ms per step (the
cell's wall time over the steps /metrics counted), tokens per SSE chunk, the engine thread's phases from
/metrics, and per part of the serving path (`PARTS`) the microseconds the GIL was held per output token (AR: per
row per step), as well as per thread the GIL-held share and top functions. With `--in-process`, the same model
driven in process on the same prompts (closed_loop.py: the `EngineLoop`, no HTTP), after the server is gone: its
tok/s and ms per step, the serving path's cost being the difference. py-spy is a separate wheel (`pip install
--target DIR py-spy`: DIR/bin/py-spy).
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
from benchmarks.fixtures.shapes import SHAPES, ensure_shape_pair

from dflash_bench.errors import UserError
from dflash_bench.launch import launch_command
from dflash_bench.store import SweepDir

ROOT = Path(__file__).resolve().parents[2]
PAIR = ROOT / "dflash_bench" / "assets" / "default_pair" / "target"

# The parts of the serving path, each a rule on a sample's stack: `whole` frames (any frame, root first) decide
# first, then `leaf` frames (the innermost frame that matches any part's). A frame is "function (file)".
WHOLE = (("admission (prefill)", ("EngineLoop._admit",)),
         ("request intake", ("build_app.<locals>._serve", "build_app.<locals>.chat ", "build_app.<locals>.completions ",
                             "build_app.<locals>.metrics ")))
LEAF = (("detokenize", ("engine/detok.py", "transformers/", "tokenizers/")),
        ("commit (bookkeeping)", ("engine/bookkeeping.py",)),
        ("SSE chunks", ("serving/api.py", "openai_format.py", "_sse (", "_stream (", "orjson")),
        ("hand-over", ("serving/loop.py", "serving/engine_process.py", "Outbox", "Results.", "_deliver (",
                        "asyncio/queues.py", "asyncio/locks.py")),
        ("engine step (FastEngine.step)", ("engine/fast/engine.py",)),
        ("schedule, launch, collect", ("engine/fast/", "torch/")),
        ("HTTP (ASGI, h11, socket)", ("starlette/", "uvicorn/", "h11/", "httptools", "anyio/", "fastapi/",
                                      "asyncio/selector_events.py", "asyncio/transports.py")))
PARTS = [p for p, _ in WHOLE] + [p for p, _ in LEAF] + ["event loop, other", "engine thread, other"]


# py-spy --subprocesses roots each stack in its processes (`process PID:"command line";`), the server's first: a
# stack under two is the engine's process's (engine_process.py), its threads named "engine process: NAME"
PROCESSES = re.compile(r'^(?:process \d+:"[^"]*";)+')


def _frames(line: str) -> tuple[str, list[str], int] | None:
    stack, _, n = line.rpartition(" ")
    if not stack:
        return None
    procs = PROCESSES.match(stack)
    depth = procs.group(0).count('";process ') + 1 if procs else 0
    frames = [re.sub(r":\d+\)$", ")", f) for f in stack[procs.end() if procs else 0:].split(";")]
    thread = re.sub(r"^thread \(\d+\): ", "", frames[0])
    return ("engine process: " + thread if depth > 1 else thread), frames[1:], int(n)


def part_of(thread: str, frames: list[str]) -> str:
    """The part of the serving path a sample's stack (root first) was in (`PARTS`)."""
    for part, marks in WHOLE:
        if any(m in f for f in frames for m in marks):
            return part
    for f in reversed(frames):
        for part, marks in LEAF:
            if any(m in f for m in marks):
                return part
    return "engine thread, other" if thread.endswith("dflash-engine") else "event loop, other"


def summarise(raw: Path, ticks: float, top: int) -> dict:
    """py-spy's raw output (`thread;frame;...;frame count` per line) -> per thread: share of ticks, top frames."""
    per_thread: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    self_time: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    held: collections.Counter = collections.Counter()
    for line in raw.read_text().splitlines():
        got = _frames(line)
        if got is None:
            continue
        thread, frames, n = got
        held[thread] += n
        for f in set(frames):
            per_thread[thread][f] += n
        if frames:
            self_time[thread][frames[-1]] += n
    return {t: dict(gil_share=round(n / ticks, 3), samples=n,
                    inclusive=per_thread[t].most_common(top), self=self_time[t].most_common(top))
            for t, n in held.most_common()}


def parts(raw: Path) -> dict[str, int]:
    """py-spy's raw output -> samples per part of the serving path (`PARTS`)."""
    out: collections.Counter = collections.Counter()
    for line in raw.read_text().splitlines():
        got = _frames(line)
        if got is not None:
            out[part_of(got[0], got[1])] += got[2]
    return {p: out[p] for p in PARTS if out[p]}


def by_process(raw: Path) -> dict[str, int]:
    """py-spy's raw output -> samples of the server's process and of the engine's (each holds a GIL of its own)."""
    out = {"server": 0, "engine process": 0}
    for line in raw.read_text().splitlines():
        got = _frames(line)
        if got is not None:
            out["engine process" if got[0].startswith("engine process: ") else "server"] += got[2]
    return out


def sample(args, server, c: int, tag: str, work: Path) -> dict:
    """A warm-up, then the measured run at concurrency `c` under py-spy; what it says of the cell."""
    def load(n: int, max_tokens: int, name: str) -> list[str]:
        return [sys.executable, "-m", "dflash_bench", "run", "--url", server.url, "--suite", "gsm8k", "-c", str(c),
                "-n", str(n), "--max-tokens", str(max_tokens), "--ignore-eos", "--engine", "builtin", "--label",
                args.mode, "--data-dir", args.data_dir, "--out", str(work / "runs"), "--name", name] + args.run_arg

    subprocess.run(load(c, 16, f"{tag}-warm"), stdout=subprocess.DEVNULL)
    before = engine_counters(server.url)
    raw = work / f"{tag}.raw"
    spy = subprocess.Popen([args.py_spy, "record", "-p", str(server.info.pid), "--gil", "--nonblocking", "--threads",
                            "--subprocesses",
                            "-r", str(args.rate), "-f", "raw", "-o", str(raw)],
                           stdout=subprocess.DEVNULL, stderr=(work / f"{tag}.py-spy.log").open("w"))
    time.sleep(1.0)
    t = time.monotonic()
    run = subprocess.run(load(args.prompts_per_slot * c, args.max_tokens, tag), stdout=subprocess.DEVNULL)
    seconds = time.monotonic() - t + 1.0
    spy.send_signal(signal.SIGINT)
    spy.wait(120)
    after = engine_counters(server.url)
    if run.returncode:
        raise SystemExit(f"dflash-bench run exited {run.returncode} at concurrency {c} (its error is above)")
    [s] = SweepDir.open(work / "runs" / tag).summaries()
    steps = after.get("steps", 0.0) - before.get("steps", 0.0)
    tokens = s.total_output_tokens
    by_part = parts(raw) if raw.exists() else {}
    us = lambda n: round(1e6 * n / args.rate / tokens, 2) if tokens else None  # noqa: E731
    return dict(concurrency=c, requests=s.num_ok, failed=s.num_failed, tok_s=s.output_throughput,
                tpot_ms_p50=(s.tpot_ms.p50 if s.tpot_ms else None), ttft_ms_p50=(s.ttft_ms.p50 if s.ttft_ms else None),
                tokens_per_chunk=(s.tokens_per_chunk.mean if s.tokens_per_chunk else None), output_tokens=tokens,
                decode_steps=int(steps), ms_per_step=round(1e3 * s.duration_s / steps, 3) if steps and s.duration_s else None,
                engine_thread_s={k: round(after[k] - before.get(k, 0.0), 3) for k in ("prefill", "step", "emit")
                                 if k in after},
                gil_us_per_token={p: us(n) for p, n in by_part.items()},
                gil_us_per_token_total=us(sum(by_part.values())),
                gil_us_per_token_by_process={k: us(n) for k, n in (by_process(raw) if raw.exists() else {}).items()},
                sampled_s=round(seconds, 2),
                threads=summarise(raw, args.rate * seconds, args.top) if raw.exists() else {},
                py_spy_log=(work / f"{tag}.py-spy.log").read_text()[-2000:])


def served(args, model: Path, draft: Path | None, name: str, cs: list[int], work: Path) -> list[dict]:
    """One server with a slot per row of the highest concurrency, each concurrency measured against it in turn."""
    cmd = [sys.executable, "-m", "dflash_bench", "serve", "--model", str(model), "--port", str(args.port), "--fast",
           "--device", args.device, "--max-slots", str(max(cs)), "--max-model-len", str(args.max_model_len),
           "--served-model-name", name, "--mode", args.mode] + (["--draft", str(draft)] if draft else [])
    cells = []
    try:
        with launch_command(cmd, port=args.port, log_path=work / f"serve-{name}.log", ready_timeout=900,
                            name=name) as server:
            for c in cs:
                cells.append(sample(args, server, c, f"{name}-c{c}-{time.strftime('%H%M%S')}", work))
                print_cell(name, cells[-1])
    except UserError as err:  # the server died or never answered: the sentence carries its log tail
        raise SystemExit(str(err)) from None
    return cells


def in_process(args, model: Path, draft: Path | None, cs: list[int]) -> list[dict]:
    """The same engine driven in process on the same suite (closed_loop.py), with no server running."""
    from benchmarks.speed.closed_loop import closed_loop, suite_prompts

    from dflash_bench.engine.build import build
    from dflash_bench.engine.config import EngineConfig

    engine = build(EngineConfig.from_options(
        str(model), str(draft) if draft else None, mode=args.mode, device=args.device, max_slots=max(cs),
        max_model_len=args.max_model_len, fast=True))
    out = []
    for c in cs:
        prompts = suite_prompts(engine.tok, "gsm8k", args.prompts_per_slot * c, Path(args.data_dir))
        closed_loop(engine, prompts[:c], c, 16)  # a warm-up, as the served cell has
        r = closed_loop(engine, prompts, c, args.max_tokens)
        r["ms_per_step"] = round(1e3 * r["wall_s"] / r["decode_steps"], 3) if r["decode_steps"] else None
        print(f"  in process c={c}: {r['output_tok_s']:.1f} tok/s, {r['ms_per_step']} ms per step", flush=True)
        out.append(r)
    return out


def print_cell(name: str, r: dict) -> None:
    print(f"{name} c={r['concurrency']}: {r['tok_s']:.1f} tok/s, TPOT p50 {r['tpot_ms_p50']:.2f} ms, "
          f"{r['ms_per_step']} ms per step, {r['tokens_per_chunk']} tokens a chunk, engine thread "
          f"{r['engine_thread_s']}; GIL-held us per token {r['gil_us_per_token_total']} "
          f"{r['gil_us_per_token_by_process']}: "
          + ", ".join(f"{p} {v}" for p, v in r["gil_us_per_token"].items()), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", default=[], help="a model folder (its drafter: the folder beside "
                    "it named drafter)")
    ap.add_argument("--shape", action="append", default=[], choices=sorted(SHAPES), help="a random pair of this "
                    "shape (default, with no --model: qwen3-8b and the embedded pair's target)")
    ap.add_argument("--mode", choices=["ar", "dflash"], default="ar")
    ap.add_argument("--py-spy", required=True, help="the py-spy binary")
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--concurrency", default="32", help="comma-separated, e.g. 32,64,128")
    ap.add_argument("--prompts-per-slot", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-model-len", type=int, default=1536)
    ap.add_argument("--in-process", action="store_true", help="also drive the same engine in process (no server)")
    ap.add_argument("--rate", type=int, default=500, help="py-spy samples per second")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--port", type=int, default=8795)
    ap.add_argument("--work", default=".bench-work")
    ap.add_argument("--run-arg", action="append", default=[], help="passed to `dflash-bench run`, e.g. "
                    "--run-arg=--save-token-ids (token ids and logprobs in every chunk, as a sweep's lossless check asks)")
    ap.add_argument("--out")
    args = ap.parse_args()
    try:
        cs = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError:
        raise SystemExit(f"--concurrency {args.concurrency!r}: give whole numbers, as in 32,64,128") from None
    if not cs or min(cs) < 1:
        raise SystemExit("--concurrency: give at least one concurrency of 1 or more")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    models: list[tuple[str, str, Path, Path | None]] = []  # (label, what the results call it, target, drafter)
    for shape in args.shape or ([] if args.model else ["qwen3-8b"]):
        target, draft = ensure_shape_pair(work, args.device, shape)
        models.append((f"shape-{shape}", f"the random {shape}-shaped pair", target, draft))
    for m in args.model or ([] if args.shape else [str(PAIR)]):
        target = Path(m).resolve()
        draft = target.parent / "drafter" if (target.parent / "drafter").exists() else None
        shown = str(target.relative_to(ROOT)) if target.is_relative_to(ROOT) else target.name  # no path of this machine
        models.append((target.parent.name, shown, target, draft))
    res: dict = {"command": " ".join(["python -m benchmarks.speed.serve_profile"] + sys.argv[1:]),
                 "parts": PARTS, "runs": {}}
    for label, shown, target, draft in models:
        draft = draft if args.mode == "dflash" else None
        name = f"{label}-{args.mode}{'-'.join([''] + args.run_arg)}"
        run = {"model": shown, "mode": args.mode, "max_tokens": args.max_tokens,
               "served": served(args, target, draft, name, cs, work)}
        if args.in_process:
            run["in_process"] = in_process(args, target, draft, cs)
        res["runs"][name] = run
        if args.out:
            tmp = Path(args.out + ".tmp")
            tmp.write_text(json.dumps(res, indent=1))
            tmp.replace(args.out)


if __name__ == "__main__":
    main()

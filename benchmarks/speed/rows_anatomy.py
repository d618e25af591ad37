"""Where a decode step's time goes as rows grow: device time per step by kernel class, the engine loop's host time,
against the weight-read and KV-read floors, AR and DFlash, at several row counts.

Per shape and row count it prefills that many random prompts of `--context` tokens, then steps them as the served
engine's core does (`EngineCore.schedule` then `collect`, the next step launched before this one's tokens are read:
the scheduler, the launches, the device-to-host read; not the bookkeeping or the HTTP server), three times over the
same trajectory: a warm-up pass (it captures the CUDA graphs the steps need), a timed pass (wall time per step; the
host's own time, the loop without its wait for the device; the wait), and a profiled pass (the kernels of the
replayed graphs, each summed into a class: weight GEMMs, attention, sampling + commit, norms/rope/elementwise,
other; busy = the kernels' time, span = first kernel start to last kernel end). AR steps; DFlash at synthetic
acceptance `--tau` verifying the whole block ("full") and the width the engine's chooser picks at that row count
after `--learn` steps of its own ("auto": then measured at that width). Floors: the weights one step reads
(`weight_bytes`: the target's, plus the drafter's for DFlash) and the KV the rows read at the profiled steps' mean
context (rows x context x KV bytes per token, a sliding layer's at most its window), each over the copy bandwidth
measured in the same run (a device-to-device copy, bytes read plus written). Growth: least-squares us per added
row of each class over the row counts from 32 up.

The default context, 640 tokens, is the middle of the served measurement's (benchmarks/peers/two_clients.py: random
prompts of about 128 tokens, 1024 out, so each row's KV grows from 128 to 1152): prompt 128 + 512 out. On one H200
(nvidia-h200, nothing carried; expected 3-5 minutes: the 8B pair built once, then gemma-4-31B-it's shape, each
core capturing only the graphs its steps use), it writes benchmarks/results/rows_anatomy_h200.json:

    mkdir -p $OUT && PYTHONUNBUFFERED=1 timeout 570 python -m benchmarks.speed.rows_anatomy \\
        --shape qwen3-8b=1,32,64,128 --shape gemma-4-31B-it=32 --out $OUT/rows_anatomy_h200.json 2>&1 | tee $OUT/rows_anatomy_h200.log

On a CPU (the script itself, C kernels, no graphs, no device profile):

    python -m benchmarks.speed.rows_anatomy --device cpu --shape tiny=1,2,4 --steps 2 --out anatomy.json
"""

from __future__ import annotations

import argparse
import gc
import shlex
import sys
import tempfile
from pathlib import Path

from benchmarks.speed.rows_steps import SHAPES, RowsAnatomy, bandwidth, build, growth, measure_point, Point

def parse_plan(specs: list[str]) -> dict[str, list[int]]:
    """`NAME=1,32,64` options -> {NAME: rows}; one sentence for a malformed one."""
    plan: dict[str, list[int]] = {}
    for spec in specs:
        name, _, rows = spec.partition("=")
        if name not in SHAPES:
            raise SystemExit(f"--shape {spec!r}: unknown shape {name!r}; known: {', '.join(SHAPES)}")
        try:
            plan[name] = sorted({int(r) for r in rows.split(",") if r.strip()})
        except ValueError:
            raise SystemExit(f"--shape {spec!r}: the rows must be whole numbers, as in {name}=1,32,64") from None
        if not plan[name] or min(plan[name]) < 1:
            raise SystemExit(f"--shape {spec!r}: give at least one row count of 1 or more, as in {name}=1,32")
    return plan


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", action="append", default=[], metavar="NAME=ROWS",
                    help="a shape and its row counts (repeatable); default qwen3-8b=1,32,64,128 and gemma-4-31B-it=32")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--context", type=int, default=640, help="prompt tokens: the context at the first step")
    ap.add_argument("--tau", type=float, default=6.5, help="DFlash's synthetic acceptance (mean tokens a verify)")
    ap.add_argument("--steps", type=int, default=12, help="steps per pass (warm-up, timed, profiled)")
    ap.add_argument("--learn", type=int, default=24, help="steps the auto width's chooser learns from")
    ap.add_argument("--modes", default="ar,full,auto", help="ar, full (DFlash, the whole block), auto (DFlash)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    plan = parse_plan(a.shape or ["qwen3-8b=1,32,64,128", "gemma-4-31B-it=32"])
    modes = [m for m in a.modes.split(",") if m]
    if not modes or set(modes) - {"ar", "full", "auto"}:
        raise SystemExit(f"--modes {a.modes!r}: a comma-separated list of ar, full and auto")
    if a.steps < 2 or a.context < 1:
        raise SystemExit("--steps must be at least 2 and --context at least 1")
    import torch

    if a.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("rows_anatomy profiles CUDA graphs on a GPU: none is visible here (or pass --device cpu)")
    dtype = torch.bfloat16 if a.device.startswith("cuda") else torch.float32
    res = RowsAnatomy(command=shlex.join(["python", "-m", "benchmarks.speed.rows_anatomy", *(argv or sys.argv[1:])]),
                      device=torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu",
                      torch=torch.__version__, dtype=str(dtype).removeprefix("torch."), context=a.context, tau=a.tau,
                      bandwidth_GBps=bandwidth(a.device) / 1e9)
    save(res, a.out)
    for name, rows in plan.items():
        with tempfile.TemporaryDirectory(prefix="rows-anatomy-") as work:
            try:
                built = build(name, a.device, dtype, slots=max(rows), context=a.context, steps=max(a.steps, a.learn),
                              tau=a.tau,
                              work=Path(work))
            except (RuntimeError, SystemExit) as err:  # out of memory, a shape this torch cannot build
                res.errors[name] = f"{type(err).__name__}: {str(err)[:400]}"
                save(res, a.out)
                continue
            res.shapes[name] = built.info
            for r in rows:
                for mode in modes:
                    res.points.append(measure_point(built, mode, r, steps=a.steps, learn=a.learn,
                                                    bandwidth=res.bandwidth_GBps * 1e9))
                    print(row_line(res.points[-1]), flush=True)
                    save(res, a.out)
            built.close()
            del built
            gc.collect()
            if a.device.startswith("cuda"):
                torch.cuda.empty_cache()
    res.growth = growth(res.points)
    save(res, a.out)
    print_table(res)


def save(res: RowsAnatomy, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(res.model_dump_json(indent=1))
    tmp.replace(out)


def _f(x: float | None, width: int = 7) -> str:
    return f"{x:>{width}.0f}" if x is not None else f"{'-':>{width}}"


HEADER = (f"{'shape':<15} {'policy':<5} {'rows':>4} {'w':>3} {'tok/row':>7} {'wall':>7} {'host':>6} {'busy':>7} "
          f"{'span':>7} | {'gemm':>7} {'attn':>6} {'samp':>5} {'elem':>6} {'other':>6} | {'W floor':>7} {'KV fl':>6}")


def row_line(p: Point) -> str:
    c = p.classes_us
    return (f"{p.shape:<15} {p.width_policy:<5} {p.rows:>4} {p.width:>3} {p.tokens_per_row_step:>7.2f} "
            f"{_f(p.wall_us)} {_f(p.host_us, 6)} {_f(p.busy_us)} {_f(p.span_us)} | {_f(c.get('gemm'))} "
            f"{_f(c.get('attention'), 6)} {_f(c.get('sampling+commit'), 5)} {_f(c.get('norms/rope/elementwise'), 6)} "
            f"{_f(c.get('other'), 6)} | {_f(p.weight_floor_us)} {_f(p.kv_floor_us, 6)}")


def print_table(res: RowsAnatomy) -> None:
    print(f"\n{res.device} | {res.dtype} | copy bandwidth {res.bandwidth_GBps:.0f} GB/s | prompt {res.context} tokens, "
          f"synthetic tau {res.tau} | us per step")
    print(HEADER)
    for p in res.points:
        print(row_line(p))
    for g in res.growth:
        parts = ", ".join(f"{k} {v:+.2f}" for k, v in g.us_per_row.items())
        print(f"growth {g.shape} {g.width_policy} (rows {g.rows}): us per added row: {parts}")
    for name, why in res.errors.items():
        print(f"{name}: not measured: {why}")


if __name__ == "__main__":
    main()

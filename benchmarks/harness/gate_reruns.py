"""Does a rerun of the same code pass its own gate, and does a real regression fail it? The README's recipe, as a
user runs it: `dflash-bench demo` (its defaults), a baseline exported from one run, another run gated against it.

    python -m benchmarks.harness.gate_reruns --runs 5 --regressions 5 --data-dir DATA --work W \
        --out benchmarks/results/gate_reruns_cpu.json

- RUNS runs of `dflash-bench demo --data-dir DATA` (benchmarks/harness/demo_repeats.py times each and records its
  speedups, τ and the machine's load before and after; the demo's ranges in README and docs/results/demo.md come
  from these runs);
- REGRESSIONS runs of the demo's sweep (the same settings, read from the demo's own constants) with one thing
  broken, in turn: the DFlash server verifying one token a step (`--verify-width 1`: no draft is ever checked),
  the DFlash server 30% slower (the demo's two servers measured by URL, the DFlash one behind
  benchmarks/fixtures/slow_proxy.py, which hands its answers on 1/0.7 times as late, whatever the machine's
  load), and a drafter that accepts less (the embedded drafter's weights with seeded noise, 30% of each tensor's
  spread);
- every ordered pair of the runs gated both ways (`gate --export-baseline RUN_A -o FILE`, then `gate RUN_B
  --baseline FILE`: the noise band comes from the baseline's own repeats, nothing from the gated run), and every
  regression run gated against every run's baseline.

A rerun's gate should pass and a regression's fail; the file keeps every gate's checks and failures, and
`python -m benchmarks.tables` renders it (docs/results/harness.md, README, docs/results/demo.md). The demo takes
minutes a run on a loaded 2-core box: run it in the background with a log.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.fixtures.slow_proxy import SlowProxy
from benchmarks.harness.demo_repeats import c1_range, commit, cpu_name, one_run
from dflash_bench import gate
from dflash_bench.gate.baseline import export_baseline
from dflash_bench.launch import free_port
from dflash_bench.store import SweepDir, atomic_write_text

REPO = Path(__file__).resolve().parents[2]
SLOWER = 0.3  # the slower DFlash server's output tok/s: 1 - SLOWER of the server's (benchmarks/fixtures/slow_proxy.py)
DRAFTER_NOISE = 0.3  # seeded noise on the weaker drafter's weights, in each tensor's standard deviations
REGRESSIONS_HOW = ("the demo's sweep with its DFlash server verifying 1 token a step (no draft checked); or the demo's "
                   "two servers, started with its flags, measured by URL with the DFlash server behind a proxy that "
                   f"hands on every piece of its answers {1 / (1 - SLOWER):.2f} times as late (its output tok/s "
                   f"{round(100 * SLOWER)}% lower, whatever the load); or drafting with the embedded drafter's weights "
                   f"plus seeded noise ({DRAFTER_NOISE} of each tensor's standard deviation)")
KINDS = ("DFlash at width 1", f"DFlash server {round(100 * SLOWER)}% slower", "a drafter that accepts less")


def demo_argv(data_dir: Path, suites: list[str], *, width: str | None = None, drafter: Path | None = None,
              port: int | None = None, urls: tuple[str, str] | None = None, record: bool = False) -> list[str]:
    """`dflash-bench sweep` arguments of the sweep `dflash-bench demo` runs (its constants: the same model paths, so
    that the gate sees the same pair), with a DFlash server verifying `width` tokens a step or drafting with
    `drafter` instead, or measuring the servers at `urls` (AR, DFlash) rather than launching its own; `record`: the
    pair's paths relative to the repository, as the results file records them."""
    path = shown if record else str
    from dflash_bench.cli import DEMO_MAX_TOKENS, DEMO_PROMPTS, DEMO_REPEATS
    from dflash_bench.sweep.commands import DEMO_CONCURRENCY, DEMO_ENGINE_ARGS, default_pair

    target, pair_drafter, _ = default_pair(Path("."))
    engine = list(DEMO_ENGINE_ARGS)
    if width is not None:
        engine[engine.index("--verify-width") + 1] = width
    servers = (["--url-ar", urls[0], "--url-dflash", urls[1]] if urls else
               ["--runner", "process", *(f"--engine-arg={a}" for a in engine)])
    return ["--model", path(target), "--drafter", path(drafter or pair_drafter), "--engine", "builtin", *servers,
            "--paired", "--interleave",
            "--save-token-ids", "--suites", ",".join(suites), "-c", ",".join(map(str, DEMO_CONCURRENCY)),
            "-n", str(DEMO_PROMPTS), "--max-tokens", str(DEMO_MAX_TOKENS), "--repeats", str(DEMO_REPEATS),
            "--data-dir", str(data_dir)] + (["--port", str(port)] if port else [])


def demo_suites(data_dir: Path) -> list[str]:
    """The suites the demo runs from this data folder (those that load)."""
    from dflash_bench.console import new_console
    from dflash_bench.sweep.commands import _demo_suites

    return _demo_suites(data_dir, new_console(stderr=True))


def shown(path: Path) -> str:
    """A path as given to the sweep and recorded: relative to the repository where it lies inside (the sweep runs
    there), else absolute."""
    path = path.resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def weaker_drafter(out: Path, noise: float = DRAFTER_NOISE) -> Path:
    """The embedded drafter with seeded noise on its weights: a real drafter that accepts less."""
    import torch
    from safetensors.torch import load_file, save_file

    from dflash_bench.sweep.commands import default_pair

    _, source, _ = default_pair(Path("."))
    shutil.copytree(source, out, dirs_exist_ok=True)
    weights = load_file(str(source / "model.safetensors"))
    g = torch.Generator().manual_seed(0)
    noisy = {k: (v.float() + noise * v.float().std() * torch.randn(v.shape, generator=g)).to(v.dtype)
             if v.numel() > 1 else v for k, v in weights.items()}
    save_file(noisy, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@contextmanager
def demo_servers(out: Path) -> Iterator[tuple[str, str]]:
    """The demo's AR and DFlash servers, started as its sweep starts them (the same `serve` flags), for a sweep
    given their URLs; stopped, process group and all, whatever happens."""
    from dflash_bench.sweep.commands import DEMO_ENGINE_ARGS, default_pair

    target, drafter, _ = default_pair(Path("."))
    procs, urls = [], []
    try:
        for mode in ("ar", "dflash"):
            port = free_port()
            argv = [sys.executable, "-m", "dflash_bench", "serve", "--model", str(target), "--mode", mode,
                    *(["--draft", str(drafter)] if mode == "dflash" else []), "--port", str(port), "--host",
                    "127.0.0.1", *DEMO_ENGINE_ARGS]
            with open(out / f"server-{mode}.log", "ab") as log:
                procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                              start_new_session=True, cwd=REPO))
            urls.append(f"http://127.0.0.1:{port}")
        for proc, url in zip(procs, urls):
            wait_ready(proc, url)
        yield urls[0], urls[1]
    finally:
        for proc in procs:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def wait_ready(proc: subprocess.Popen[bytes], url: str, timeout: float = 900.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the server for {url} exited with code {proc.returncode} before it was ready")
        try:
            if httpx.get(f"{url}/v1/models", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    sys.exit(f"the server for {url} was not ready in {timeout:.0f} s")


def keep(out: Path, record: dict[str, Any]) -> dict[str, Any]:
    """A run's record, kept beside its sweep folder (`--reuse` reads it back instead of running again)."""
    atomic_write_text(out / "record.json", json.dumps(record) + "\n")
    return record


def kept(out: Path, reuse: bool) -> dict[str, Any] | None:
    """The run's record where `reuse` and the run in `out` finished; else None, with `out` emptied for a fresh run
    (a run cut short, or one not to reuse, would leave a second sweep folder beside the new one)."""
    try:
        record: dict[str, Any] | None = json.loads((out / "record.json").read_text()) if reuse else None
    except (OSError, ValueError):
        record = None
    if record is not None and any((p / "manifest.json").exists() for p in out.iterdir()):
        return record
    shutil.rmtree(out, ignore_errors=True)
    return None


def sweep_run(out: Path, argv: list[str]) -> dict[str, Any]:
    """One `dflash-bench sweep` into `out`: its record."""
    out.mkdir(parents=True, exist_ok=True)
    load, t0 = os.getloadavg()[0], time.monotonic()
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    proc = subprocess.Popen([sys.executable, "-m", "dflash_bench", "sweep", *argv, "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    log, _ = proc.communicate()
    (out / "sweep.log").write_text(log)
    folders = [p for p in out.iterdir() if (p / "manifest.json").exists()]
    if len(folders) != 1:
        sys.exit(f"sweep into {out} wrote no sweep folder (exit {proc.returncode}): {log.strip()[-500:]}")
    return {"name": out.name, "started": started, "seconds": round(time.monotonic() - t0, 1), "exit": proc.returncode,
            "load_avg_1min_before": round(load, 2), "load_avg_1min_after": round(os.getloadavg()[0], 2)}


def judged(case: str, sweep_name: str, sweep_dir: Path, base_name: str, baseline: Path) -> dict[str, Any]:
    """`sweep_dir` gated against the baseline file, as `dflash-bench gate SWEEP --baseline FILE` does."""
    result = gate.gate(sweep_dir, baseline)
    speedups = {c.cell: [round(x, 4) for x in (c.change or 0.0, *(c.ci or ()))] for c in result.checks
                if c.metric.name == "speedup"}
    speeds = result.machine
    return {"case": case, "sweep": sweep_name, "baseline": base_name, "checks": len(result.checks),
            "failures": len(result.failures), "notes": result.notes, "speedup_change_and_interval": speedups,
            # how many times longer the sweep's machine-speed probe took than the baseline's (None: not both probed),
            # and whether that set its absolute checks aside (gate/machine.py)
            "machine_slower": None if speeds is None or speeds.slower is None else round(speeds.slower, 3),
            "absolute_not_comparable": speeds is not None and not speeds.comparable,
            "failed": [f"{c.cell} {c.metric.label}: change {c.change if c.change is None else round(c.change, 4)}, "
                       f"interval {None if c.ci is None else [round(x, 4) for x in c.ci]}, allowed {round(c.allowed, 4)}"
                       for c in result.failures][:20]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5, help="Runs of the demo (every ordered pair gated).")
    ap.add_argument("--regressions", type=int, default=5, help="Runs with one thing broken (the kinds in turn).")
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True, help="Where the runs and baselines go.")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reuse", action="store_true", help="Keep the runs already in --work (each its record.json) and "
                    "run only what is missing, then gate them all.")
    ap.add_argument("extra", nargs="*", help="After --: options for every demo and broken sweep (-n, --max-tokens, -c, "
                    "--repeats), to make a smaller run than the README's recipe (the tests do).")
    args = ap.parse_args()
    at = commit()  # the code that gates (the runs' own: their manifests' revision; --reuse may gate them later)
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    folders: list[Path] = []
    broken: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    weaker = weaker_drafter(work / "weaker-drafter")
    suites: list[str] = []
    for i in range(max(args.runs, args.regressions)):  # in turn, so that the machine's drift falls on both
        if i < args.runs:
            out = work / f"run-{i}"
            run = kept(out, args.reuse)
            try:
                run = run or keep(out, one_run(["--data-dir", str(args.data_dir), *args.extra], out))
            except SystemExit as err:  # a run of the recipe that failed is a finding: recorded, the others go on
                failed.append({"name": out.name, "why": str(err)[-2000:]})
                print(f"{out.name} failed: {str(err)[-300:]}", flush=True)
                continue
            run["name"] = out.name
            runs.append(run)
            folders.append(next(p for p in out.iterdir() if (p / "manifest.json").exists()))
            suites = suites or list(dict.fromkeys(c["suite"] for c in run["cells"]))
            print(f"{out.name}: {run['seconds']} s, load {run['load_avg_1min_before']}->{run['load_avg_1min_after']}",
                  flush=True)
        if i < args.regressions:
            kind = KINDS[i % len(KINDS)]
            argv = demo_argv(args.data_dir, suites or demo_suites(args.data_dir), port=free_port(),
                             width="1" if kind == KINDS[0] else None, drafter=weaker if kind == KINDS[2] else None)
            out = work / f"broken-{i}"
            record = kept(out, args.reuse)
            if record is None and kind == KINDS[1]:
                out.mkdir(parents=True, exist_ok=True)
                with demo_servers(out) as (ar, dflash), SlowProxy(dflash, 1 / (1 - SLOWER)) as proxy:
                    urls = demo_argv(args.data_dir, suites or demo_suites(args.data_dir), urls=(ar, proxy.url))
                    record = keep(out, sweep_run(out, urls + args.extra))
            elif record is None:
                record = keep(out, sweep_run(out, argv + args.extra))
            record.update(kind=kind, folder=next(p for p in out.iterdir() if (p / "manifest.json").exists()))
            broken.append(record)
            print(f"{record['name']} ({kind}): {record['seconds']} s", flush=True)
    baselines = []
    for name, folder in zip((r["name"] for r in runs), folders):
        baselines.append(work / f"baseline-{name}.json")
        export_baseline(folder, baselines[-1])

    revisions = {SweepDir.open(f).read_manifest().versions.get("git_revision") for f in [*folders, *(b["folder"] for b in broken)]}
    gates = []
    for ra, ba in zip(runs, baselines):
        for rb, fb in zip(runs, folders):
            if rb is not ra:
                gates.append(judged("rerun of the same code", rb["name"], fb, ra["name"], ba))
        for b in broken:
            gates.append(judged(b["kind"], b["name"], b["folder"], ra["name"], ba))
    for b in broken:
        b.pop("folder")

    result = {
        "command": f"python -m benchmarks.harness.gate_reruns --runs {args.runs} --regressions {args.regressions} "
                   "--data-dir DATA --work W --out " + (shown(args.out) if args.out.resolve().is_relative_to(REPO) else "F")
                   + (" -- " + " ".join(args.extra) if args.extra else ""),
        "how": "the README's recipe: `dflash-bench demo --data-dir DATA` run after run, a baseline exported from "
               "each run, every other run gated against it",
        "machine": {"cpu": f"{cpu_name()}, shared with other jobs", "cores": len(os.sched_getaffinity(0))},
        "commit": ", ".join(sorted(str(r)[:7] for r in revisions)), "gated_at": at, "regression_sweep": "dflash-bench sweep " + " ".join(demo_argv(Path("DATA"), suites, record=True)),
        "runs": runs, "c1_speedup_range": c1_range(runs),
        "seconds_range": [min(r["seconds"] for r in runs), max(r["seconds"] for r in runs)],
        "regressions": broken, "regressions_how": REGRESSIONS_HOW, "failed_runs": failed, "gates": gates,
    }
    atomic_write_text(args.out, json.dumps(result, indent=1) + "\n")
    for g in gates:
        print(f"{g['case']}: {g['sweep']} against {g['baseline']}: {g['failures']} of {g['checks']} checks failed")


if __name__ == "__main__":
    main()

"""One engine served on one model shape, measured by two clients in consecutive commands: the
project's `dflash-bench run` and vLLM's own `vllm bench serve`, at each concurrency x output length.

    python -m benchmarks.peers.two_clients --engine builtin|vllm|sglang --shape qwen3-8b|gemma-4-31B-it \
        --modes ar,dflash --concurrency 1,8,32 --new-tokens 128,1024 [--synthetic-tau 6.5] [--steady-requests N] \
        [--tensor-parallel-size N] --data-dir DATA --work WORK --out results.json

Two engines measured at once, one a GPU of one host (CUDA_VISIBLE_DEVICES=0 and 1, a --work and an --out each), are
joined afterwards, as if their commands had run one after another:

    python -m benchmarks.peers.two_clients merge A.json B.json --out results.json

It writes the shape's folders into WORK when they are missing (the Qwen3-8B-shaped random pair of
`real_engines.py`; gemma-4-31B-it's configs and tokenizer from `fixtures/shape_folders.py`, random weights made at load
with `--load-format dummy`), starts each mode's server through `dflash_bench.launch` with the engine's profile
(the sweep's command, sizing flags and refusals), and at each (new tokens, concurrency) measures with
`dflash-bench run` (the suite's prompts, `--ignore-eos`) and then `vllm bench serve` (random prompts of the
suite's mean length in the target's tokens, `--ignore-eos`, the same number of requests). Rows are added to
`--out` as each cell ends (benchmarks/peers/two_clients_measure.py: Results), keyed by (engine, shape, mode,
synthetic tau, concurrency, new tokens, client), so separate commands build one file; `python -m
benchmarks.tables` renders it (tables/renderers_gpu.py two_clients) once it is in benchmarks/results/.

It prints the plan with an estimate first and refuses, in one sentence, a plan that cannot fit `--time-limit`
seconds; cells the GPU's memory cannot hold at the context limit (dflash_bench/sweep/fit.py) are skipped with
the sizing sentence, and a cell that would end past the time limit is skipped rather than cut by the host.

On the GPU host (`run`: 10 minutes a command, 30 minutes of device time a session, a fresh machine after 30 s
idle), one command per call, in this order (Qwen3-8B's AR rows first, then DFlash, then gemma-4-31B's rows).
Each call starts with the environment line of its engine, and every command ends with `...`:

    vLLM's bundle (builtin and vLLM lines; carry .vllm-bundle, built here first by
    `tools/vllm_bundle/build.sh .vllm-bundle` where pip reaches PyPI: it brings the transformers Gemma 4 needs):
        . .vllm-bundle/setup.sh && export PYTHONPATH=.:$PYTHONPATH PYTHONUNBUFFERED=1 && <the command>
    SGLang's bundle (carry .sglang-bundle only: with vLLM's the tree passes the 64 MiB carry, so vLLM's client
    is skipped there, saying so):
        . .sglang-bundle/setup.sh && export PYTHONPATH=.:$PYTHONPATH PYTHONUNBUFFERED=1 && <the command>
    ... (the command's end) = --data-dir .data --work /tmp/tc --out benchmarks/results/two_clients_h100.json;
                              cp benchmarks/results/two_clients_h100.json $OUT/   (.data: a copy of the prompt sets)

    1. python -m benchmarks.peers.two_clients --engine builtin --shape qwen3-8b --modes ar --concurrency 1,8,32 --new-tokens 1024 ...
    2. python -m benchmarks.peers.two_clients --engine vllm --shape qwen3-8b --modes ar --concurrency 1,8,32 --new-tokens 1024 ...
    3. python -m benchmarks.peers.two_clients --engine builtin --shape qwen3-8b --modes ar,dflash --concurrency 1,8,32 --new-tokens 128 ...
    4. python -m benchmarks.peers.two_clients --engine vllm --shape qwen3-8b --modes ar --concurrency 1,8,32 --new-tokens 128 ...
    5. python -m benchmarks.peers.two_clients --engine vllm --shape qwen3-8b --modes dflash --concurrency 1,8,32 --new-tokens 128 ...
    6. python -m benchmarks.peers.two_clients --engine builtin --shape qwen3-8b --modes dflash --concurrency 1,8,32 --new-tokens 1024 ...
    7. python -m benchmarks.peers.two_clients --engine vllm --shape qwen3-8b --modes dflash --concurrency 1,8 --new-tokens 1024 ...
    8. python -m benchmarks.peers.two_clients --engine builtin --shape qwen3-8b --modes dflash --synthetic-tau 6.5 --concurrency 1,8,32 --new-tokens 128,1024 ...
    9. python -m benchmarks.peers.two_clients --engine builtin --shape qwen3-8b --modes dflash --synthetic-tau 6.5 --concurrency 32 --new-tokens 1024 --steady-requests 96 ...
   10. the same pairs of lines at --concurrency 64,128 (--new-tokens 128 with --modes ar,dflash; 1024 with --modes ar)
   11. python -m benchmarks.peers.two_clients --engine vllm --shape gemma-4-31B-it --modes ar --concurrency 1,8,32 --new-tokens 128 ...
   12. python -m benchmarks.peers.two_clients --engine builtin --shape gemma-4-31B-it --modes ar --concurrency 1,8,32 --new-tokens 128 ...
   13. python -m benchmarks.peers.two_clients --engine builtin --shape gemma-4-31B-it --modes dflash --concurrency 1,8,32 --new-tokens 128 ...
   14. (SGLang's bundle) python -m benchmarks.peers.two_clients --engine sglang --shape qwen3-8b --modes ar,dflash --concurrency 1,8,32 --new-tokens 128 ...

On two GPUs (`run` kind nvidia-h100-x2), tensor parallel 2, gemma-4-31B-it's shape, into their own file
(... = --data-dir .data --work /tmp/tc --out benchmarks/results/two_clients_h100_tp2.json;
cp benchmarks/results/two_clients_h100_tp2.json $OUT/), after `bash benchmarks/peers/tp_bringup.sh .data $OUT`:

   15. python -m benchmarks.peers.two_clients --engine vllm --shape gemma-4-31B-it --tensor-parallel-size 2 --modes ar --concurrency 1,8,32 --new-tokens 128 ...
   16. python -m benchmarks.peers.two_clients --engine builtin --shape gemma-4-31B-it --tensor-parallel-size 2 --modes ar --concurrency 1,8,32 --new-tokens 128 ...
   17. python -m benchmarks.peers.two_clients --engine builtin --shape gemma-4-31B-it --tensor-parallel-size 2 --modes dflash --concurrency 1,8,32 --new-tokens 128 ...
   18. python -m benchmarks.peers.two_clients --engine builtin --shape gemma-4-31B-it --tensor-parallel-size 2 --modes dflash --synthetic-tau 6.5 --concurrency 1,8,32 --new-tokens 128 ...
   19. python -m benchmarks.peers.two_clients --engine vllm --shape gemma-4-31B-it --tensor-parallel-size 2 --modes dflash --concurrency 1,8,32 --new-tokens 128 ...

Each estimate above is under 540 s on a fresh machine (writing the 8B pair, about 90 s, included); where the
plan refuses, split by mode. The results file comes back from $OUT: copy it into this tree's
benchmarks/results/ before the next call, so that every call adds to the same file (a file from an H200 gets
its own name), then commit it and run `python -m benchmarks.tables` (its entry in tables.AWAITING renders
once the file is there). The CPU rehearsal, with the tiny random pair:

    python -m benchmarks.peers.two_clients --engine builtin --shape tiny --device cpu --modes ar,dflash \
        --concurrency 1,2 --new-tokens 16 --requests-per-slot 2 --data-dir DATA --work W --out F
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from pathlib import Path

from benchmarks.peers.two_clients_measure import (CLIENTS, Machine, Row, Run, load, merge_files, ours, run_key, save,
                                                  vllm_missing, vllms)

from dflash_bench.errors import UserError

SHAPES = ("qwen3-8b", "gemma-4-31B-it", "tiny")
ENGINES = ("builtin", "vllm", "sglang")
GEMMA = "gemma-4-31B-it"
# The plan's estimate, rough and on the long side: an AR decode step in ms at concurrency c is
# base x (1 + c / scale) (Qwen3-8B on an H100: 6.0 ms at 1, 8.2 at 32; gemma-4-31B: 22.6 at 1),
# a server's start in seconds, and a client's own start (vLLM's imports torch and reads the tokenizer).
STEP_MS = {"qwen3-8b": (6.5, 64.0), GEMMA: (24.0, 64.0), "tiny": (4.0, 2.0)}
READY_S = {("builtin", "cuda"): 60.0, ("vllm", "cuda"): 120.0, ("sglang", "cuda"): 150.0, ("builtin", "cpu"): 15.0}
CLIENT_START_S = {"dflash-bench": 5.0, "vllm-bench": 20.0}
WRITE_S = {"qwen3-8b": 90.0, GEMMA: 40.0, "tiny": 5.0}  # the shape's folders, where --work lacks them
MIN_START_S = 60.0  # a server is not started with less of --time-limit left


# ------------------------------------------------------------------ folders, prompts, sizes


def shape_paths(args) -> tuple[Path, Path, str]:
    """(target, drafter, served name) of the shape in --work."""
    work = Path(args.work)
    if args.shape == GEMMA:  # SGLang 0.5.16 reads Gemma 4 in its own naming (big_shape.py --naming sglang)
        target = work / GEMMA if args.engine != "sglang" else work / "sglang" / GEMMA
        return target, work / f"{GEMMA}-DFlash", GEMMA
    return work / args.shape / "target", work / args.shape / "drafter", f"random-{args.shape}"


def folders(args) -> tuple[Path, Path, str]:
    """(target, drafter, served name) of the shape in --work, written there when missing."""
    work = Path(args.work)
    target, drafter, served = shape_paths(args)
    if (target / "config.json").exists() and (drafter / "config.json").exists():
        return target, drafter, served
    if args.shape == GEMMA:
        from benchmarks.fixtures.shape_folders import write_shape

        write_shape(GEMMA, work, Path(args.data_dir), "sglang" if args.engine == "sglang" else "hf")
    else:
        from benchmarks.fixtures.shapes import ensure_shape_pair

        # in a process of its own, so that this one holds no CUDA context beside the servers it starts
        proc = multiprocessing.get_context("spawn").Process(target=ensure_shape_pair,
                                                            args=(work, args.device, args.shape))
        proc.start()
        proc.join()
        if proc.exitcode:
            raise UserError(f"writing the {args.shape}-shaped pair into {work} failed (exit {proc.exitcode}; see above)")
    return target, drafter, served


def prompt_tokens(suite: str, data_dir: str, target: Path) -> tuple[float, int]:
    """Mean and longest prompt of the suite in the target's tokens, as the chat API renders them."""
    from transformers import AutoTokenizer

    from dflash_bench.suites import load_prompts

    tok = AutoTokenizer.from_pretrained(str(target))
    texts = [tok.apply_chat_template([{"role": "user", "content": p.turns[0]}], tokenize=False, add_generation_prompt=True)
             for p in load_prompts(suite, data_dir=Path(data_dir))]
    counts = [len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]]
    return sum(counts) / len(counts), max(counts)


def machine() -> Machine:
    from dflash_bench.store.provenance import versions
    from dflash_bench.telemetry.nvml import gpu_inventory

    found = {k: v for k, v in versions().items() if k in ("torch", "transformers", "vllm", "sglang") and v}
    gpus = gpu_inventory()
    if not gpus:
        return Machine(gpu="cpu", versions=found)
    g = gpus[0]
    mem = g.get("memory_total_mib")
    return Machine(gpu=g.get("name") or "?", driver=g.get("driver_version"),
                   gpu_memory_gib=round(mem / 1024, 1) if mem else None, versions=found)


def does_not_fit(engine: str, pair, context: int, concurrency: int, mode: str, gpu_gib: float | None,
                 gpus: int = 1) -> str | None:
    """The sweep's sizing sentence (sweep/fit.py) when `concurrency` sequences of `context` tokens do not fit
    `gpus` GPUs (a tensor-parallel server's)."""
    from dflash_bench.model_shapes import pair_configs
    from dflash_bench.sweep.fit import builtin_kv, fit, geometry, refusal, usable_gib

    if gpu_gib is None:
        return None
    target_cfg, drafter_cfg = pair_configs(pair)
    target = geometry(target_cfg)
    draft = geometry(drafter_cfg, drafter=True) if mode == "dflash" else None
    if target is None:
        return None
    usable = usable_gib(engine, gpu_gib)
    # the builtin engine's own slot layout (`serve --fast`, a rank's share on each GPU), as the sweep sizes it;
    # else the configs' formula
    def kv_at(n: int):
        return builtin_kv(target_cfg, drafter_cfg if draft else None, fast=True, tp=n) if engine == "builtin" else None
    kv = kv_at(gpus)
    f = fit(target, draft, usable=usable, gpus=gpus, context=context, concurrency=concurrency, kv=kv)
    return None if f.fits else refusal(f, gpu="GPU", gpus=gpus, context=context, max_tokens=None, target=target,
                                       drafter=draft, usable=usable, kv=kv, engine=engine, kv_at=kv_at)


# ------------------------------------------------------------------ the plan


def cell_seconds(args, mode: str, c: int, new: int, client: str) -> float:
    base, scale = STEP_MS[args.shape]
    step = base * (1 + c / scale) / 1000
    if mode == "dflash":  # a random drafter's steps cost more; synthetic acceptance commits tau tokens a step
        step *= 1.3 / max(1.0, 0.4 * (args.synthetic_tau or 0.0))
    waves = (args.steady_requests + c) / c if args.steady_requests else args.requests_per_slot
    return CLIENT_START_S[client] + (waves + 1) * (new * step + 0.2)


def plan_seconds(args, clients: list[str]) -> float:
    dev = "cpu" if args.device == "cpu" else "cuda"
    ready = READY_S.get((args.engine, dev), 120.0) * (2 if args.shape == GEMMA else 1)
    cells = sum(cell_seconds(args, m, c, n, cl) for m in args.mode_list for n in args.new_list for c in args.c_list
                for cl in clients)
    write = 0.0 if all((p / "config.json").exists() for p in shape_paths(args)[:2]) else WRITE_S[args.shape]
    return write + len(args.mode_list) * (ready + 10) + cells


# ------------------------------------------------------------------ the run


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["merge"]:
        return merge(argv[1:])
    args = parse(argv)
    try:
        run(args)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def run(args) -> None:
    from benchmarks.peers.real_engines import shown as shown_cmd

    from dflash_bench import models, profiles
    from dflash_bench.launch import free_port, launch_server
    from dflash_bench.sweep.fit import round_up

    t_start = time.monotonic()
    clients = [cl for cl in args.client_list if cl != "vllm-bench" or not vllm_missing()]
    estimate = plan_seconds(args, clients)
    print(f"plan: {args.engine} on {args.shape} ({args.tp} GPU{'s' if args.tp > 1 else ''}), modes {','.join(args.mode_list)}, concurrency "
          f"{','.join(map(str, args.c_list))} x new tokens {','.join(map(str, args.new_list))}, clients "
          f"{' and '.join(clients)}; estimate {estimate:.0f} s of --time-limit {args.time_limit:.0f} s", flush=True)
    if estimate > args.time_limit and not args.best_effort:
        raise UserError(f"this plan needs about {estimate:.0f} s, more than --time-limit {args.time_limit:.0f} s: "
                        "split it into commands of fewer modes, concurrencies, output lengths or clients.")
    if args.plan_only:
        return
    work, out = Path(args.work).resolve(), Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    target, drafter, served = folders(args)
    mean_in, longest_in = prompt_tokens(args.suite, args.data_dir, target)
    context = round_up(longest_in + max(args.new_list) + 32)
    pair = models.resolve(str(target), drafter=str(drafter))
    profile = profiles.get(args.engine)
    box = machine()
    gpu_gib = box.gpu_memory_gib if args.device != "cpu" else None

    data = str(Path(args.data_dir).resolve())

    def shown(cmd: list[str]) -> str:  # no path of this machine: WORK, DATA
        return shown_cmd(["DATA" if a in (args.data_dir, data) else a for a in cmd], str(work))

    command = shown([sys.executable, "-m", "benchmarks.peers.two_clients",
                     *(Path(a).name if a == args.out else a for a in args.argv)])
    rec = Run(command=command, machine=box, suite=args.suite, input_tokens=round(mean_in, 1), context_len=context,
              estimate_s=round(estimate, 1))
    res = load(out)
    key = run_key(args.engine, args.shape, args.tp)
    res.add_run(key, rec)
    save(res, out)

    def keep(rows: list[Row]) -> None:  # saved as each cell ends: a run killed mid-way keeps what it measured
        res.merge(rows)
        res.add_run(key, rec)
        save(res, out)

    for mode in args.mode_list:
        tau = args.synthetic_tau if mode == "dflash" else None
        label = mode if tau is None else f"{mode}-tau{tau:g}"
        rows = [Row(engine=args.engine, shape=args.shape, gpus=args.tp, mode=mode, synthetic_tau=tau, concurrency=c, new_tokens=n,
                    client=cl, status="skipped") for n in args.new_list for c in args.c_list for cl in args.client_list]
        fits = {c: does_not_fit(args.engine, pair, context, c, mode, gpu_gib, args.tp) for c in args.c_list}
        version = profile.version("process", None)
        why_not = profile.refusal(pair, mode, version)
        if not why_not and (note := profile.caveat(pair, mode, version)):
            print(f"{label}: note: {note}", flush=True)
        sized = [c for c in args.c_list if fits[c] is None]
        if why_not or not sized:
            keep([r.model_copy(update={"reason": why_not or fits[r.concurrency]}) for r in rows])
            print(f"{label}: not launched: {why_not or fits[args.c_list[0]]}", flush=True)
            continue
        left = args.time_limit - (time.monotonic() - t_start)
        if left < MIN_START_S:  # --best-effort: no server started that could not answer before the limit
            keep([r.model_copy(update={"reason": f"not launched: --time-limit {args.time_limit:.0f} s would pass"})
                  for r in rows])
            print(f"{label}: not launched: {left:.0f} s of --time-limit left", flush=True)
            continue
        extra = profile.sizing_flags(context, max(sized), args.tp if args.tp > 1 else None) + engine_args(args, mode, served)
        written: set[tuple] = set()
        try:
            with launch_server(args.engine, pair, mode, runner="process", port=free_port(), extra_args=extra,
                               log_path=work / "logs" / f"{args.engine}-{args.shape}-{label}.log",
                               ready_timeout=max(MIN_START_S, args.time_limit - (time.monotonic() - t_start))) as server:
                rec.ready_s[label] = server.info.ready_s or 0.0
                rec.servers[label] = shown(server.info.command)
                for r in rows:
                    keep([measure(args, r, fits, server.url, served, target, mean_in, t_start, shown)])
                    written.add(r.key)
                    if r.client == args.client_list[-1]:
                        print(f"{label} n={r.new_tokens} c={r.concurrency}: " + "; ".join(
                            brief(x) for x in res.rows if x.key[:6] == r.key[:6]), flush=True)
        except UserError as err:  # the server died or never answered: the sentence carries its log tail
            reason = profile.failure(str(err)) or str(err)
            print(f"{label}: {reason}", flush=True)
            keep([r.model_copy(update={"status": "failed", "reason": f"server: {reason}"[:4000]})
                  for r in rows if r.key not in written])
    rec.wall_s = round(time.monotonic() - t_start, 1)
    keep([])
    print(f"done in {rec.wall_s:.0f} s (estimate {estimate:.0f} s); rows in {out}", flush=True)


def brief(r: Row) -> str:
    if r.status != "ok":
        return f"{r.client} {r.status}: {r.reason}"
    tau = f", tau {r.tau:.2f}" if r.tau is not None else ""
    return (f"{r.client} {r.output_tok_s or 0:.1f} tok/s, TTFT p50 {r.ttft_ms_p50 or 0:.1f} ms, "
            f"TPOT p50 {r.tpot_ms_p50 or 0:.2f} ms{tau}")


def measure(args, r: Row, fits: dict[int, str | None], url: str, served: str, target: Path, mean_in: float,
            t_start: float, shown) -> Row:
    if fits[r.concurrency]:
        return r.model_copy(update={"reason": fits[r.concurrency]})
    if r.client == "vllm-bench" and (why := vllm_missing()):
        return r.model_copy(update={"reason": why})
    left = args.time_limit - (time.monotonic() - t_start)
    if cell_seconds(args, r.mode, r.concurrency, r.new_tokens, r.client) > left:
        return r.model_copy(update={"reason": f"not measured: --time-limit {args.time_limit:.0f} s would pass"})
    c, n = r.concurrency, r.new_tokens
    requests = (args.steady_requests + c) if args.steady_requests else args.requests_per_slot * c
    seed = 1000 * c + n  # each cell its own prompts: no cell reads the one before from a prefix cache
    folder = Path(args.work).resolve() / "runs"
    if r.client == "dflash-bench":
        return ours(r, url=url, suite=args.suite, requests=requests, steady=args.steady_requests, seed=seed,
                    data_dir=args.data_dir, folder=folder, tokenizer=target, timeout=left, shown=shown)
    return vllms(r, url=url, model=served, tokenizer=target, input_tokens=max(1, round(mean_in)), requests=requests,
                 seed=seed, folder=folder / "vllm-bench", timeout=left, shown=shown)


def engine_args(args, mode: str, served: str) -> list[str]:
    """What each engine needs beyond its profile's command and sizing flags (the latter win over earlier flags)."""
    dummy = ["--load-format", "dummy"] if args.shape == GEMMA else []
    if args.engine == "builtin":
        out = ["--fast", "--device", args.device, "--served-model-name", served, *dummy]
        if mode == "dflash" and args.synthetic_tau is not None:
            out += ["--synthetic-acceptance", str(args.synthetic_tau), "--benchmark-only"]
        return out
    if args.engine == "vllm":  # gemma: docs/results/gemma-4-31b.md's flags (triton attention, 8k batched tokens)
        gemma = ["--attention-backend", "triton_attn", "--max-num-batched-tokens", "8192"] if args.shape == GEMMA else []
        return ["--served-model-name", served, "--seed", "0", *dummy, *gemma]
    # SGLang's offline bundle: triton attention, torch sampling; 0.7 of the GPU beside the 8B weights (real_engines.py)
    fraction = [] if args.shape == GEMMA else ["--mem-fraction-static", "0.7"]
    return ["--served-model-name", served, "--attention-backend", "triton", "--sampling-backend", "pytorch",
            "--random-seed", "0", *fraction, *dummy]


def merge(argv: list[str]) -> int:
    """`merge FILE... --out F`: the rows and runs of commands that ran at once (an engine a GPU of one host, each into
    a file of its own) into one results file, as if they had run one after another."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.peers.two_clients merge", description=merge.__doc__)
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    try:
        res = merge_files(args.files, args.out)
    except (OSError, ValueError) as err:
        print(f"error: cannot merge {' '.join(map(str, args.files))}: {err}", file=sys.stderr)
        return 2
    print(f"{args.out}: {len(res.runs)} runs, {len(res.rows)} rows")
    return 0


def parse(argv: list[str] | None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.peers.two_clients", description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", choices=ENGINES, required=True)
    ap.add_argument("--shape", choices=SHAPES, required=True)
    ap.add_argument("--modes", default="ar,dflash")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--new-tokens", default="128,1024")
    ap.add_argument("--synthetic-tau", type=float, help="builtin DFlash: serve with --synthetic-acceptance TAU "
                                                        "(random weights accept nothing: tau 1 without it)")
    ap.add_argument("--steady-requests", type=int, help="dflash-bench: a steady stream measured over this many "
                                                        "completions; vllm bench serve: this many plus the concurrency")
    ap.add_argument("--requests-per-slot", type=int, default=3, help="closed loop: requests per cell = this x concurrency")
    ap.add_argument("--suite", default="gsm8k", help="dflash-bench's prompts; vLLM's random prompts take its mean length")
    ap.add_argument("--tensor-parallel-size", "--tp", dest="tp", type=int, default=1,
                    help="GPUs per server (each engine's tensor-parallel flag; the builtin engine's serve --fast)")
    ap.add_argument("--device", default="cuda", help="builtin: --device of `serve` (cpu: the tiny rehearsal)")
    ap.add_argument("--data-dir", default=os.environ.get("DFLASH_BENCH_DATA", ".data"))
    ap.add_argument("--work", default="/tmp/two_clients", help="shape folders, server logs, both clients' outputs")
    ap.add_argument("--out", required=True, help="the results JSON (rows are added to what it holds)")
    ap.add_argument("--clients", default=",".join(CLIENTS), help="which clients measure each cell, in this order "
                    f"(default {','.join(CLIENTS)}): fewer clients, fewer cells in a call's ten minutes")
    ap.add_argument("--plan-only", action="store_true", help="print the plan and its estimate (refusing one past "
                    "--time-limit, as a run does) and stop: no folder written, no server started")
    ap.add_argument("--time-limit", type=float, default=540.0, help="seconds this command may take (default 540)")
    ap.add_argument("--best-effort", action="store_true",
                    help="start even when the estimate passes --time-limit: what would end past it is skipped, "
                         "saying so, and every cell measured before is kept")
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args.mode_list = [m for m in args.modes.split(",") if m]
        args.c_list = sorted({int(x) for x in args.concurrency.split(",")})
        args.new_list = sorted({int(x) for x in args.new_tokens.split(",")})
        args.client_list = [c for c in args.clients.split(",") if c]
    except ValueError:
        ap.error("--concurrency and --new-tokens take whole numbers separated by commas")
    if set(args.client_list) - set(CLIENTS) or not args.client_list:
        ap.error(f"--clients takes {', '.join(CLIENTS)} or both, separated by a comma")
    if set(args.mode_list) - {"ar", "dflash"} or not args.mode_list:
        ap.error("--modes takes ar, dflash or ar,dflash")
    if min(args.c_list) < 1 or min(args.new_list) < 1:
        ap.error("--concurrency and --new-tokens must be at least 1")
    if args.synthetic_tau is not None and (args.engine != "builtin" or args.synthetic_tau < 1):
        ap.error("--synthetic-tau is the builtin engine's (serve --synthetic-acceptance), at least 1")
    if args.steady_requests is not None and args.steady_requests < max(args.c_list):
        ap.error(f"--steady-requests must be at least the largest concurrency ({max(args.c_list)}): the window holds "
                 "one completion per request in flight or more")
    if args.tp < 1:
        ap.error("--tensor-parallel-size must be at least 1")
    if args.shape == "tiny" and args.engine != "builtin":
        ap.error("--shape tiny is the builtin engine's CPU rehearsal")
    return args


if __name__ == "__main__":
    sys.exit(main())

"""The harness against real engines on one GPU host: vLLM (the offline bundle) beside the builtin engine.

    . .vllm-bundle/setup.sh    # tools/vllm_bundle/build.sh .vllm-bundle, carried to the host
    python -m benchmarks.peers.real_engines pair --data-dir DIR --out real_engines.json
    python -m benchmarks.peers.real_engines shape --engines vllm --out real_engines.json
    python -m benchmarks.peers.real_engines shape --engines builtin --out real_engines.json
    . .sglang-bundle/setup.sh  # tools/sglang_bundle/build.sh .sglang-bundle; not in the same shell as vLLM's
    python -m benchmarks.peers.real_engines pair --engines sglang --data-dir DIR --out real_engines.json

`pair`: the embedded default pair swept through `dflash-bench sweep` on each engine (vLLM, the builtin
reference engine, the builtin `--fast` path): GSM8K, HumanEval and MT-Bench at concurrency 1, 8 and 32, token
ids saved, so each DFlash cell carries its token agreement with its AR partner (the sweep's lossless check).
`shape`: the Qwen3-8B-shaped random bf16 target (and a random drafter of Qwen3-8B-DFlash-b16's shape, whose
tau is about 1: what the speculative path costs) written to `--work`, served by vLLM and by `serve --fast`,
and measured by `dflash-bench run` at each concurrency with the same GSM8K prompts and `--ignore-eos`, so both
sides generate exactly `--new-tokens` per request. The builtin rows add where the engine thread's time went
(`dflash_bench:engine_thread_seconds` on /metrics, per phase, over the cell).

Each call adds its rows to `--out` (one JSON file, `Results` below; rows of the same key are replaced), so
the parts can run as separate commands within a 10-minute limit. Random weights: only the timing means
anything in `shape`.
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
from pathlib import Path

from pydantic import BaseModel, Field

from benchmarks.fixtures.engine_metrics import engine_counters
from benchmarks.fixtures.shapes import ensure_shape_pair

from dflash_bench.errors import UserError
from dflash_bench.launch import free_port, launch_command
from dflash_bench.store import SweepDir, atomic_write_text

SUITES = "gsm8k,humaneval,mt-bench"
ROOT = Path(__file__).resolve().parents[2]  # the repository: the in-process row runs `-m benchmarks.speed.closed_loop` there
PAIR = ROOT / "dflash_bench" / "assets" / "default_pair"
VARIANTS = {  # pair part: engine variant -> (--engine, extra --engine-arg values)
    "vllm": ("vllm", []),
    "builtin": ("builtin", []),
    "builtin-fast": ("builtin", ["--fast"]),
    # the offline bundle of tools/sglang_bundle has no FlashInfer and no FlashAttention 3: triton attention,
    # torch sampling; half the GPU for the KV pool, as its smoke test ran
    "sglang": ("sglang", ["--attention-backend", "triton", "--sampling-backend", "pytorch",
                          "--mem-fraction-static", "0.5"]),
}


class Row(BaseModel):
    part: str  # pair | shape
    engine: str  # vllm | builtin | builtin-fast
    mode: str  # ar | dflash
    suite: str
    concurrency: int
    status: str
    num_ok: int
    num_failed: int
    output_tok_s: float | None
    tau: float | None
    ttft_ms_p50: float | None
    tpot_ms_p50: float | None
    agreement: float | None = None  # DFlash cells: share of turns whose token ids equal the AR cell's
    first_divergence_p50: float | None = None
    engine_thread_s: dict[str, float] = Field(default_factory=dict)  # builtin: seconds per phase over the cell
    prefill_groups: int | None = None  # builtin: prefill groups over the cell (requests / groups: prompts per forward)
    decode_steps: int | None = None  # builtin: decode steps over the cell (in process at 32 rows, 128 tokens: ~127 a wave)
    mixed_prefills: int | None = None  # builtin `--prefill mixed`: prompts of the cell prefilled inside a decode step
    # vLLM: prompt tokens looked up in its prefix cache over the cell, and those found (a cell's prompts that an
    # earlier cell sent: at 32 the first 32 prompts are the cell at 8's)
    prefix_cache_queries: int | None = None
    prefix_cache_hits: int | None = None
    wall_s: float | None = None  # the cell's measured window

    @property
    def key(self) -> tuple:
        return (self.part, self.engine, self.mode, self.suite, self.concurrency)


class Results(BaseModel):
    """The file `--out`: every row measured so far, with the machine and versions of each part's run."""

    device: str = ""
    versions: dict[str, str] = Field(default_factory=dict)
    ready_s: dict[str, float] = Field(default_factory=dict)  # server -> seconds from start to /health
    commands: dict[str, str] = Field(default_factory=dict)  # part -> the command line that measured it
    rows: list[Row] = Field(default_factory=list)

    def merge(self, rows: list[Row]) -> None:
        keys = {r.key for r in rows}
        self.rows = [r for r in self.rows if r.key not in keys] + rows


def load(path: Path) -> Results:
    return Results.model_validate_json(path.read_text()) if path.exists() else Results()


def save(res: Results, path: Path) -> None:
    atomic_write_text(path, res.model_dump_json(indent=1))


def machine() -> tuple[str, dict[str, str]]:
    import torch

    versions = {"torch": torch.__version__}
    try:
        import vllm

        versions["vllm"] = vllm.__version__
    except ImportError:
        pass
    try:  # the version only: importing SGLang starts its CUDA set-up
        from importlib.metadata import version

        versions["sglang"] = version("sglang")
    except Exception:
        pass
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(), versions
    return "cpu", versions


def shown(cmd: list[str], work: str | None = None) -> str:
    """A command as the results file keeps it: no path of the machine it ran on (`--work` becomes WORK)."""
    root = str(PAIR.parents[2]) + "/"

    def one(a: str) -> str:
        a = a.replace(root, "")
        return a.replace(str(work).rstrip("/"), "WORK") if work else a
    return " ".join("python" if a == sys.executable else one(a) for a in cmd)


def row_of(part: str, engine: str, s, busy: dict[str, float] | None = None, groups: int | None = None,
           steps: int | None = None) -> Row:
    lossless = s.lossless
    agree = lossless.exact_match_rate if lossless and lossless.status == "ok" else None
    first = (lossless.first_divergence or {}).get("p50") if lossless else None
    return Row(part=part, engine=engine, mode=s.mode, suite=s.suite, concurrency=s.concurrency, status=s.status,
               num_ok=s.num_ok, num_failed=s.num_failed, output_tok_s=s.output_throughput, tau=s.acceptance_length,
               ttft_ms_p50=s.ttft_ms.p50 if s.ttft_ms else None, tpot_ms_p50=s.tpot_ms.p50 if s.tpot_ms else None,
               agreement=agree, first_divergence_p50=first, engine_thread_s=busy or {}, prefill_groups=groups,
               decode_steps=steps, wall_s=s.duration_s)


# ------------------------------------------------------------------ pair: dflash-bench sweep per engine


def run_pair(args, res: Results, keep) -> None:
    for variant in args.engines.split(","):
        engine, extra = VARIANTS[variant]
        out = Path(args.work) / "pair" / variant
        cmd = [sys.executable, "-m", "dflash_bench", "sweep", "--model", str(PAIR / "target"), "--drafter",
               str(PAIR / "drafter"), "--engine", engine, "--runner", "process", "--suites", args.suites,
               "-c", args.concurrency, "--max-tokens", str(args.new_tokens),
               "--data-dir", args.data_dir, "--out", str(out), "--port", str(args.port)]
        if engine != "sglang":  # SGLang 0.5.16's DFLASH aborts requests that ask for logprobs (H100, 11d71ba)
            cmd.append("--save-token-ids")
        if args.num_prompts:
            cmd += ["-n", str(args.num_prompts)]
        for a in extra + (["--device", args.device] if engine == "builtin" else []):
            cmd.append(f"--engine-arg={a}")
        t = time.monotonic()
        code = subprocess.run(cmd).returncode
        print(f"{variant}: sweep exited {code} after {time.monotonic() - t:.0f} s", flush=True)
        folders = sorted(out.glob("*/manifest.json"), key=lambda p: p.stat().st_mtime)
        if not folders:
            print(f"{variant}: no sweep folder was written", flush=True)
            continue
        res.commands[f"pair/{variant}"] = shown(cmd, args.work)
        keep([row_of("pair", variant, s) for s in SweepDir.open(folders[-1].parent).summaries()])


# ------------------------------------------------------------------ shape: the 8B random pair, served


def server_command(engine: str, mode: str, target: Path, draft: Path, args) -> list[str]:
    if engine in ("vllm", "vllm-nocache"):  # vllm-nocache: its prefix cache off, as the builtin engine has none
        cmd = ["vllm", "serve", str(target), "--served-model-name", "random-8b", "--port", str(args.port),
               "--max-model-len", str(args.max_model_len), "--max-num-batched-tokens", "32768",
               "--attention-backend", "flash_attn", "--seed", "0", "--max-num-seqs", str(max(64, max(args.c_list)))]
        if engine == "vllm-nocache":
            cmd.append("--no-enable-prefix-caching")
        # vLLM sizes its sampler for --max-num-seqs (default 1024): 1024 x 16 drafted rows of float32 logits
        # over a 151,936-token vocabulary ran out of memory on an 80 GB H100 beside the 8B weights
        if mode == "dflash":
            cmd += ["--speculative-config", json.dumps({"method": "dflash", "model": str(draft),
                                                        "num_speculative_tokens": 15})]
        return cmd
    if engine == "sglang":  # the bundle's backends (VARIANTS); 0.7 of the GPU holds the 8B weights and a KV pool
        cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(target), "--served-model-name",
               "random-8b", "--port", str(args.port), "--context-length", str(args.max_model_len),
               "--random-seed", "0", "--max-running-requests", str(max(64, max(args.c_list))), "--enable-metrics",
               *VARIANTS["sglang"][1][:-2], "--mem-fraction-static", "0.7", "--dtype", "bfloat16"]
        if mode == "dflash":
            cmd += ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(draft),
                    "--speculative-num-draft-tokens", "16"]
        return cmd
    cmd = [sys.executable, "-m", "dflash_bench", "serve", "--model", str(target), "--port", str(args.port), "--fast",
           "--device", args.device, "--max-slots", str(max(args.c_list)), "--max-model-len", str(args.max_model_len),
           "--served-model-name", "random-8b", "--mode", mode]
    if engine.startswith("builtin-"):  # builtin-first, builtin-mixed: that `serve --prefill`
        cmd += ["--prefill", engine.split("-", 1)[1]]
    return cmd + (["--draft", str(draft)] if mode == "dflash" else [])


def run_shape(args, res: Results, keep) -> None:
    work = Path(args.work)
    target, draft = ensure_shape_pair(work, args.device, args.shape)
    for engine in args.engines.split(","):
        for mode in args.modes.split(","):
            if engine == "inprocess":
                keep(measure_inprocess(args, mode, target, draft))
                continue
            args.port = free_port()  # a server a killed run left behind must not answer for this one
            cmd = server_command(engine, mode, target, draft, args)
            try:
                with launch_command(cmd, port=args.port, log_path=work / f"shape-{engine}-{mode}.log",
                                    ready_timeout=480, name=f"{engine}-{mode}") as server:
                    res.ready_s[f"shape/{engine}/{mode}"] = server.info.ready_s or 0.0
                    res.commands[f"shape/{engine}/{mode}"] = shown(cmd, args.work)
                    for c in args.c_list:  # each cell saved as it ends: a run killed mid-way keeps the cells before
                        keep([measure_served(args, server.url, engine, mode, c, work)])
            except UserError as err:  # the server died or never answered (the sentence carries its log tail)
                print(f"shape {engine} {mode}: {err}", flush=True)


def measure_inprocess(args, mode: str, target: Path, draft: Path) -> list[Row]:
    """The builtin engine's own throughput on the served rows' workload (closed_loop.py, in its own process so
    that the GPU is free again for the next server)."""
    cmd = [sys.executable, "-m", "benchmarks.speed.closed_loop", "--model", str(target),
           "--data-dir", args.data_dir, "--concurrency", args.concurrency, "--prompts-per-slot",
           str(args.prompts_per_slot), "--new-tokens", str(args.new_tokens), "--max-model-len",
           str(args.max_model_len), "--device", args.device] + (["--draft", str(draft)] if mode == "dflash" else [])
    got = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    rows = []
    for line in got.stdout.splitlines():
        if line.startswith("{"):
            c = json.loads(line)
            rows.append(Row(part="shape", engine="inprocess", mode=mode, suite="gsm8k", concurrency=c["concurrency"],
                            status="ok", num_ok=c["requests"], num_failed=0, output_tok_s=c["output_tok_s"],
                            tau=c["tau"], ttft_ms_p50=c["ttft_ms_p50"], tpot_ms_p50=None, wall_s=c["wall_s"],
                            decode_steps=c["decode_steps"]))
            print(f"shape inprocess {mode} c={c['concurrency']}: {c['output_tok_s']:.1f} tok/s", flush=True)
    if got.returncode:
        print(f"shape inprocess {mode}: closed_loop.py exited {got.returncode}", flush=True)
    return rows


def measure_served(args, url: str, engine: str, mode: str, c: int, work: Path) -> Row:
    name = f"shape-{engine}-{mode}-c{c}"
    builtin = engine.startswith("builtin")
    counted = builtin or engine.startswith("vllm")
    shutil.rmtree(work / "runs" / name, ignore_errors=True)  # a cell of an earlier call would be resumed, not re-measured
    before = engine_counters(url) if counted else {}
    cmd = [sys.executable, "-m", "dflash_bench", "run", "--url", url, "--suite", "gsm8k", "-c", str(c),
           "-n", str(args.prompts_per_slot * c), "--max-tokens", str(args.new_tokens), "--ignore-eos",
           "--label", mode, "--engine", "builtin" if builtin else engine.split("-")[0], "--data-dir", args.data_dir, "--out", str(work / "runs"),
           "--name", name] + (["--api", "generate", "--tokenizer", str(work / args.shape / "target")]
                                if engine == "sglang" else [])  # SGLang's tau: /generate's meta_info only
    cmd += ["--seed", str(c)] if args.fresh_prompts else []
    subprocess.run(cmd, stdout=subprocess.DEVNULL)
    after = engine_counters(url) if counted else {}
    busy = {k: round(after[k] - before.get(k, 0.0), 3) for k in after}
    count = lambda k: int(busy.pop(k)) if k in busy else None  # noqa: E731
    groups, steps, queries, hits, mixed = (count(k) for k in ("groups", "steps", "queries", "hits", "mixed"))
    [s] = SweepDir.open(work / "runs" / name).summaries()
    row = row_of("shape", engine, s, busy, groups, steps)
    row.prefix_cache_queries, row.prefix_cache_hits, row.mixed_prefills = queries, hits, mixed
    print(f"shape {engine} {mode} c={c}: {row.output_tok_s} tok/s, tau {row.tau}, TPOT p50 {row.tpot_ms_p50} ms, "
          f"engine thread {busy}, prefill groups {groups} (mixed {mixed}), decode steps {steps}, prefix cache hits {hits} of "
          f"{queries} tokens", flush=True)
    return row


# ------------------------------------------------------------------ the table


def print_table(res: Results) -> None:
    print(f"\n{res.device} | {json.dumps(res.versions)}")
    print(f"{'part':>5} | {'engine':>12} | {'mode':>6} | {'suite':>9} | {'c':>3} | {'tok/s':>8} | {'tau':>5} | "
          f"{'TTFT':>7} | {'TPOT':>6} | {'agree':>5} | ok/failed")
    for r in sorted(res.rows, key=lambda r: r.key):
        f = lambda v, spec: format(v, spec) if v is not None else "-"  # noqa: E731
        print(f"{r.part:>5} | {r.engine:>12} | {r.mode:>6} | {r.suite:>9} | {r.concurrency:>3} | "
              f"{f(r.output_tok_s, '8.1f'):>8} | {f(r.tau, '5.2f'):>5} | {f(r.ttft_ms_p50, '7.1f'):>7} | "
              f"{f(r.tpot_ms_p50, '6.2f'):>6} | {f(r.agreement, '5.2f'):>5} | {r.num_ok}/{r.num_failed}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("part", choices=["pair", "shape", "table"])
    ap.add_argument("--out", required=True, help="the results JSON (rows are added to what it holds)")
    ap.add_argument("--data-dir", default=os.environ.get("DFLASH_BENCH_DATA", "../shared/datasets"))
    ap.add_argument("--engines", help="pair: vllm,builtin,builtin-fast (default), sglang; shape: vllm,builtin "
                                      "(default), sglang, builtin-first / -mixed (that "
                                      "`serve --prefill`), inprocess (the "
                                      "builtin engine without its server)")
    ap.add_argument("--modes", default="ar,dflash")
    ap.add_argument("--suites", default=SUITES)
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--num-prompts", type=int, help="pair: prompts per cell (default: the sweep's)")
    ap.add_argument("--prompts-per-slot", type=int, default=4, help="shape: requests per cell = this x concurrency")
    ap.add_argument("--fresh-prompts", action="store_true",
                    help="shape: each cell draws its own prompts (`run --seed C`), so that no cell re-sends the "
                         "prompts of the one before and reads them from a prefix cache")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--max-model-len", type=int, default=1536)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", default="qwen3-8b", help="shape: the random pair's shape (tiny: a CPU rehearsal)")
    ap.add_argument("--port", type=int, default=8790)
    ap.add_argument("--work", default="/tmp/real_engines", help="the shape pair, server logs and sweep folders")
    args = ap.parse_args()
    # killed by `timeout` (SIGTERM), unwind: the `finally` blocks stop the server they started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.c_list = [int(x) for x in args.concurrency.split(",")]
    out = Path(args.out)
    res = load(out)
    if args.part != "table":
        res.device, versions = machine()
        res.versions.update(versions)
        Path(args.work).mkdir(parents=True, exist_ok=True)

        def keep(rows: list[Row]) -> None:  # saved as each server's rows come in: a killed run keeps them
            res.merge(rows)
            save(res, out)
        if args.part == "pair":
            args.engines = args.engines or "vllm,builtin,builtin-fast"
            run_pair(args, res, keep)
        else:
            args.engines = args.engines or "vllm,builtin"
            run_shape(args, res, keep)
    print_table(res)


if __name__ == "__main__":
    main()

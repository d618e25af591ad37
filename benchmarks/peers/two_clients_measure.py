"""The two clients of benchmarks/peers/two_clients.py, one cell each against a server it started, and the results file.

`ours()`: `dflash-bench run` (the project's client: a suite's prompts through the chat API, `--ignore-eos`,
warm-up requests first). `vllms()`: vLLM's own `vllm bench serve` (random prompts of the suite's mean length
through /v1/completions, `--ignore-eos`, greedy, as many warm-ups as the concurrency, `--save-result`), or a
skipped row saying why when the `vllm` CLI is not importable here. Each returns one Row.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel, Field, model_validator

from dflash_bench.store import atomic_write_text

CLIENTS = ("dflash-bench", "vllm-bench")


class Machine(BaseModel):
    gpu: str  # NVML's name, or "cpu"
    driver: str | None = None
    gpu_memory_gib: float | None = None
    versions: dict[str, str] = Field(default_factory=dict)  # torch, transformers, vllm, sglang (those installed)


class Run(BaseModel):
    """One command of benchmarks/peers/two_clients.py: one engine on one shape, its servers and the machine."""

    command: str  # the command line, with WORK for --work and DATA for --data-dir
    machine: Machine
    suite: str
    input_tokens: float  # the suite's mean prompt in the target's tokens, chat template included (vLLM's random length)
    context_len: int  # the servers' context limit
    servers: dict[str, str] = Field(default_factory=dict)  # mode label -> the server's command line
    ready_s: dict[str, float] = Field(default_factory=dict)  # mode label -> seconds from start to ready
    estimate_s: float = 0.0  # the plan's estimate
    wall_s: float | None = None  # what the run took


def run_key(engine: str, shape: str, gpus: int) -> str:
    """The key under Results.runs of one command of benchmarks/peers/two_clients.py: its engine and shape."""
    return f"{engine}/{shape}" + (f"/tp{gpus}" if gpus > 1 else "")


class Row(BaseModel):
    engine: str  # builtin | vllm | sglang
    shape: str  # qwen3-8b | gemma-4-31B-it | tiny
    gpus: int = 1  # the server's GPUs (its tensor-parallel size); output_tok_s is the server's, all of them
    mode: str  # ar | dflash
    synthetic_tau: float | None = None  # DFlash with `serve --synthetic-acceptance` (builtin only); None: the real drafter's
    concurrency: int
    new_tokens: int
    client: str  # dflash-bench | vllm-bench
    status: str  # ok | failed | skipped
    reason: str | None = None  # why a row is failed or skipped, in one sentence (a server's log tail after it)
    requests: int = 0  # measured requests that completed
    failed: int = 0
    steady: bool = False  # dflash-bench: a steady stream (--steady-requests), measured over its window
    output_tok_s: float | None = None
    ttft_ms_p50: float | None = None
    tpot_ms_p50: float | None = None
    tau: float | None = None  # from the server's counters over the cell, where it reports them
    # the builtin server's /metrics over the client's window (either client): the verify widths it used (width ->
    # row-steps) and tau at the full block from the acceptance profile, so that a gap between the two clients' tau
    # shows whether the widths differed (the load) or the acceptance did (the requests)
    verify_widths: dict[int, int] | None = None
    tau_full_block: float | None = None
    input_tokens_mean: float | None = None  # prompt tokens per request, as the server counted them
    duration_s: float | None = None
    command: str | None = None  # the client's command line
    run: str = ""  # the key in Results.runs of the command that measured it (unset: its engine/shape's, run_key)

    @model_validator(mode="after")
    def _names_its_run(self) -> "Row":
        """A row made, or read from a file written, without its run gets its engine/shape's (`run_key`)."""
        self.run = self.run or run_key(self.engine, self.shape, self.gpus)
        return self

    @property
    def key(self) -> tuple:
        return (self.engine, self.shape, self.gpus, self.mode, self.synthetic_tau, self.concurrency, self.new_tokens,
                self.client)


class Results(BaseModel):
    """The file `--out`: rows of every command so far, keyed by Row.key (a later command replaces its own rows)."""

    kind: str = "two_clients"
    device: str = ""  # the GPUs of the runs, for the table's source line
    command: str = ""  # the runs' commands, for the table's source line
    runs: dict[str, Run] = Field(default_factory=dict)  # "<engine>/<shape>" -> its run
    rows: list[Row] = Field(default_factory=list)

    def merge(self, rows: list[Row]) -> None:
        """`rows` replace the rows of the same key, except that a row skipped (not measured) leaves a measured one
        in place: a later command that ran out of time does not undo an earlier one's measurement. Runs left with
        no row are dropped."""
        measured = {r.key for r in self.rows if r.status != "skipped"}
        rows = [r for r in rows if not (r.status == "skipped" and r.key in measured)]
        keys = {r.key for r in rows}
        self.rows = [r for r in self.rows if r.key not in keys] + rows
        owners = {r.run for r in self.rows}
        self.runs = {k: v for k, v in self.runs.items() if k in owners}

    def add_run(self, key: str, run: Run) -> None:
        """Record `run` under `key`. Another command already there under that key keeps its rows: it moves to
        "KEY, earlier" (then "earlier 2", ...), and its rows name it there."""
        held = self.runs.get(key)
        if held is not None and held.command != run.command:
            n = 1
            while (moved := f"{key}, earlier" + (f" {n}" if n > 1 else "")) in self.runs:
                n += 1
            self.runs[moved] = held
            self.rows = [r.model_copy(update={"run": moved}) if r.run == key else r for r in self.rows]
        self.runs[key] = run
        self.device = "; ".join(sorted({r.machine.gpu for r in self.runs.values()}))
        self.command = "; ".join(r.command for _, r in sorted(self.runs.items()))


def merge_files(paths: list[Path], out: Path) -> Results:
    """Each results file's runs and rows into `out` (a later file's rows replace the same keys), as if its commands
    had run one after another: two engines measured at once on two GPUs of one host, each into a file of its own."""
    res = load(out)
    for path in paths:
        part = Results.model_validate_json(path.read_text())
        for key, run in sorted(part.runs.items()):
            res.add_run(key, run)
        res.merge(part.rows)
    save(res, out)
    return res


def load(path: Path) -> Results:
    return Results.model_validate_json(path.read_text()) if path.exists() else Results()


def save(res: Results, path: Path) -> None:
    atomic_write_text(path, res.model_dump_json(indent=1))


# ------------------------------------------------------------------ the project's client


def ours(base: Row, *, url: str, suite: str, requests: int, steady: int | None, seed: int, data_dir: str,
         folder: Path, tokenizer: Path, timeout: float, shown) -> Row:
    """`dflash-bench run` against the server at `url`: one cell, read back from the sweep folder it writes."""
    from dflash_bench.store import SweepDir

    name = f"{base.engine}-{base.shape}-g{base.gpus}-{base.mode}-t{base.synthetic_tau}-n{base.new_tokens}-c{base.concurrency}"
    shutil.rmtree(folder / name, ignore_errors=True)  # a cell of an earlier call would be resumed, not measured again
    cmd = [sys.executable, "-m", "dflash_bench", "run", "--url", url, "--suite", suite, "-c", str(base.concurrency),
           "-n", str(requests), "--max-tokens", str(base.new_tokens), "--ignore-eos", "--label", base.mode,
           "--engine", base.engine, "--data-dir", data_dir, "--out", str(folder), "--name", name, "--seed", str(seed)]
    if steady:
        cmd += ["--steady-requests", str(steady)]
    if base.engine == "sglang":  # SGLang's tau: /generate's meta_info only (real_engines.py does the same)
        cmd += ["--api", "generate", "--tokenizer", str(tokenizer)]
    row = base.model_copy(update={"client": "dflash-bench", "command": shown(cmd), "steady": bool(steady)})
    try:
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return row.model_copy(update={"status": "failed", "reason": f"dflash-bench run ran past {timeout:.0f} s"})
    summaries = SweepDir.open(folder / name).summaries() if (folder / name / "manifest.json").exists() else []
    if not summaries:
        why = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return row.model_copy(update={"status": "failed", "reason": f"dflash-bench run exited {proc.returncode}: {why}"})
    s = summaries[0]
    return row.model_copy(update={
        "status": "ok" if s.status == "complete" else "failed", "reason": s.failure_reason, "requests": s.num_ok,
        "failed": s.num_failed, "output_tok_s": s.output_throughput, "ttft_ms_p50": s.ttft_ms.p50 if s.ttft_ms else None,
        "tpot_ms_p50": s.tpot_ms.p50 if s.tpot_ms else None, "tau": s.acceptance_length, "duration_s": s.duration_s,
        "verify_widths": s.verify_widths, "tau_full_block": s.acceptance_length_full_block,
        "input_tokens_mean": s.total_prompt_tokens / s.num_ok if s.num_ok else None})


# ------------------------------------------------------------------ vLLM's client


def scrape(url: str) -> dict | None:
    """The server's /metrics parsed (None where it cannot be read)."""
    import httpx

    from dflash_bench.metrics import prometheus

    try:
        return prometheus.parse(httpx.get(url.rstrip("/") + "/metrics", timeout=10).text)
    except (httpx.HTTPError, ValueError):
        return None


def widths(before: dict | None, after: dict | None) -> dict:
    """The verify widths and tau at the full block over a window, from two /metrics snapshots (the builtin
    server's; nothing for another)."""
    from dflash_bench.metrics import prometheus
    from dflash_bench.metrics.definitions import profile_tau

    if before is None or after is None:
        return {}
    got = prometheus.spec_acceptance(prometheus.delta(before, after), "vllm:") or {}
    profile = got.get("acceptance_profile")
    return {"verify_widths": got.get("verify_widths"), "tau_full_block": profile_tau(profile) if profile else None}


def vllm_missing() -> str | None:
    """Why `vllm bench serve` cannot run here, or None."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not importable in this environment (source .vllm-bundle/setup.sh on the GPU host)"
    if shutil.which("vllm") is None:
        return "the vllm command is not on PATH"
    return None


def vllms(base: Row, *, url: str, model: str, tokenizer: Path, input_tokens: int, requests: int, seed: int,
          folder: Path, timeout: float, shown) -> Row:
    """`vllm bench serve` against the server at `url`: random prompts of `input_tokens`, its saved result read back."""
    row = base.model_copy(update={"client": "vllm-bench"})
    if why := vllm_missing():
        return row.model_copy(update={"status": "skipped", "reason": why})
    folder.mkdir(parents=True, exist_ok=True)
    name = (f"{base.engine}-{base.shape}-g{base.gpus}-{base.mode}-t{base.synthetic_tau}-n{base.new_tokens}"
            f"-c{base.concurrency}.json")
    (folder / name).unlink(missing_ok=True)
    cmd = ["vllm", "bench", "serve", "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
           "--model", model, "--tokenizer", str(tokenizer), "--dataset-name", "random",
           "--random-input-len", str(input_tokens), "--random-output-len", str(base.new_tokens),
           "--random-range-ratio", "0", "--num-prompts", str(requests), "--max-concurrency", str(base.concurrency),
           "--num-warmups", str(base.concurrency), "--ignore-eos", "--temperature", "0", "--seed", str(seed),
           "--disable-tqdm", "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
           "--save-result", "--result-dir", str(folder), "--result-filename", name]
    row.command = shown(cmd)
    before = scrape(url)
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return row.model_copy(update={"status": "failed", "reason": f"vllm bench serve ran past {timeout:.0f} s"})
    if not (folder / name).exists():
        why = (proc.stdout.strip().splitlines() or ["no output"])[-1]
        return row.model_copy(update={"status": "failed", "reason": f"vllm bench serve exited {proc.returncode}: {why}"})
    r = json.loads((folder / name).read_text())
    done = int(r.get("completed") or 0)
    return row.model_copy(update={
        "status": "ok" if done and not r.get("failed") else "failed",
        "reason": None if done and not r.get("failed") else f"{r.get('failed')} of {requests} requests failed",
        "requests": done, "failed": int(r.get("failed") or 0), "output_tok_s": r.get("output_throughput"),
        "ttft_ms_p50": r.get("median_ttft_ms"), "tpot_ms_p50": r.get("median_tpot_ms"),
        "tau": r.get("spec_decode_acceptance_length"), "duration_s": r.get("duration"), **widths(before, scrape(url)),
        "input_tokens_mean": r["total_input_tokens"] / done if done and "total_input_tokens" in r else None})

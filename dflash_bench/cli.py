"""The `dflash-bench` command line. Thin: parse options, call one function per command.

Imports of heavy modules (pandas, torch, docker, ...) happen inside the commands so that
`dflash-bench --help` stays fast and a missing optional extra only affects the command that needs it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from dflash_bench import __version__
from dflash_bench.errors import UserError

app = typer.Typer(
    name="dflash-bench",
    help="Measure how much DFlash speculative decoding speeds up LLM serving on your GPUs, and what it costs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
suites_app = typer.Typer(help="List and inspect the benchmark suites.", no_args_is_help=True)
app.add_typer(suites_app, name="suites")
engines_app = typer.Typer(help="Get third-party engines onto this machine.", no_args_is_help=True)
app.add_typer(engines_app, name="engines")

DataDirOption = typer.Option(
    None,
    "--data-dir",
    envvar="DFLASH_BENCH_DATA",
    help="Folder with offline copies of the datasets (upstream file formats). Default: load from the Hugging Face hub.",
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"dflash-bench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version_callback, is_eager=True, help="Print the version and exit."),
) -> None:
    """Measure how much DFlash speculative decoding speeds up LLM serving on your GPUs, and what it costs."""


@suites_app.command("list")
def suites_list(data_dir: Optional[Path] = DataDirOption) -> None:
    """List the benchmark suites: source, records (counted offline when --data-dir holds them), categories."""
    from dflash_bench.suites import print_suites

    print_suites(data_dir)


@suites_app.command("show")
def suites_show(
    name: str = typer.Argument(..., help="Suite name (see `dflash-bench suites list`)."),
    num: int = typer.Option(3, "-n", "--num", help="How many prompts to show, from the start of the suite."),
    category: Optional[list[str]] = typer.Option(None, "--category", help="Only this category (repeatable)."),
    config: Optional[str] = typer.Option(None, "--config", help="Hub config, e.g. speed-bench throughput_8k."),
    data_dir: Optional[Path] = DataDirOption,
) -> None:
    """Show the first prompts of a suite, rendered exactly as they are sent."""
    from dflash_bench.suites import print_prompts

    print_prompts(name, num, data_dir, config=config, categories=category)


@engines_app.command("build")
def engines_build(
    engine: str = typer.Argument(..., help="The engine to build: llamacpp (llama-server for this CPU)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="Parallel compile jobs (default: every core)."),
    force: bool = typer.Option(False, "--force", help="Build again even if the cache folder holds a build."),
) -> None:
    """Build an engine from source into the cache folder (llamacpp: PyPI's llama-cpp-python sdist, cmake + ninja)."""
    from dflash_bench.llamacpp.commands import build_command

    build_command(engine, jobs=jobs, force=force)


@app.command()
def emulate(
    mode: str = typer.Option("ar", "--mode", help="ar: one token per step; dflash: several tokens per verify step."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="Port to listen on (0 picks a free one; the first line printed names it)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind."),
    ttft_ms: float = typer.Option(50.0, "--ttft-ms", help="Time from request arrival to the first token."),
    itl_ms: float = typer.Option(10.0, "--itl-ms", help="Time of one decode / verification step."),
    block_size: int = typer.Option(16, "--block-size", help="DFlash block size: at most this many tokens per step."),
    acceptance_length: float = typer.Option(6.5, "--acceptance-length", help="Mean tokens per verify step (tau), bonus included."),
    output_len: int = typer.Option(128, "--output-len", help="Mean natural output length in tokens (uniform in 0.5x..1.5x)."),
    batch_slope_ms: float = typer.Option(0.0, "--batch-slope-ms", help="Extra step time per other running request."),
    seed: int = typer.Option(0, "--seed", help="Seed of output lengths, token ids and acceptance draws."),
    model: str = typer.Option("emulator", "--model", help="Served model name (in /v1/models and metric labels)."),
    per_request_spec_metrics: bool = typer.Option(False, "--per-request-spec-metrics", help="Add vLLM's per-request metrics.speculative_decoding to the usage chunk."),
    fail_every: int = typer.Option(0, "--fail-every", help="Every k-th generation request fails (0: never)."),
    fail_kind: str = typer.Option("error", "--fail-kind", help="error | stream-error | drop | malformed | hang."),
    crash_after_requests: int = typer.Option(0, "--crash-after-requests", help="Exit abruptly (code 3) once this many requests completed, cutting streams in flight."),
) -> None:
    """Serve a timing emulator of an AR or DFlash LLM server (OpenAI + SGLang /generate + /metrics) with known truth."""
    from dflash_bench.emulator import EmulatorConfig
    from dflash_bench.emulator.server import serve

    try:
        cfg = EmulatorConfig(mode=mode, ttft_ms=ttft_ms, itl_ms=itl_ms, block_size=block_size,
                             acceptance_length=acceptance_length, output_len=output_len, batch_slope_ms=batch_slope_ms,
                             seed=seed, model=model, per_request_spec_metrics=per_request_spec_metrics,
                             fail_every=fail_every, fail_kind=fail_kind, crash_after_requests=crash_after_requests)
    except ValueError as err:
        raise UserError(f"{err}.") from None
    try:
        serve(cfg, host, port)
    except OSError as err:
        raise UserError(f"cannot listen on {host}:{port}: {err.strerror or err}.") from None


@app.command()
def run(
    url: str = typer.Option(..., "--url", help="Base URL of the running OpenAI-compatible server, e.g. http://127.0.0.1:8000."),
    suite: str = typer.Option(..., "--suite", help="Benchmark suite (see `dflash-bench suites list`)."),
    concurrency: int = typer.Option(1, "--concurrency", "-c", min=1, help="Requests in flight (closed loop)."),
    num_prompts: Optional[int] = typer.Option(None, "--num-prompts", "-n", min=1, help="Prompts to send (default: the whole suite)."),
    max_tokens: int = typer.Option(2048, "--max-tokens", min=1, help="Output cap per request."),
    temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="Sampling temperature (always sent explicitly)."),
    label: str = typer.Option("ar", "--label", help="What the server runs: ar or dflash."),
    engine: str = typer.Option("vllm", "--engine", help="vllm | sglang | builtin | emulator | llamacpp: how acceptance is read."),
    api: str = typer.Option("chat", "--api", help="chat | completions | generate (SGLang native)."),
    save_token_ids: bool = typer.Option(False, "--save-token-ids", help="Record output token ids and top-2 logprobs (for the lossless check)."),
    thinking: Optional[bool] = typer.Option(None, "--thinking/--no-thinking", help="Send chat_template_kwargs.enable_thinking (default: not sent)."),
    out: Path = typer.Option(Path("reports"), "--out", help="Folder that holds sweep folders."),
    name: Optional[str] = typer.Option(None, "--name", help="Sweep folder name under --out (default run-<time>); reuse it to add cells."),
    data_dir: Optional[Path] = DataDirOption,
    seed: int = typer.Option(0, "--seed", help="Seed for prompt sampling and Poisson arrivals."),
    request_rate: Optional[float] = typer.Option(None, "--request-rate", min=0.001, help="Poisson arrivals at this many requests/s (capped by --concurrency)."),
    timeout: float = typer.Option(600.0, "--timeout", min=0.1, help="Timeout in seconds of every request the harness makes (/v1/models, /metrics, each generation)."),
    warmup: bool = typer.Option(True, "--warmup/--no-warmup", help="Send --concurrency warm-up requests first (excluded from statistics)."),
    model: Optional[str] = typer.Option(None, "--model", help="Served model name (default: the first one in /v1/models)."),
    transport: str = typer.Option("auto", "--transport", help="HTTP client of the streaming loop: auto (raw for http://, aiohttp for https://), raw, aiohttp or httpx."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="With --api generate: render this model's chat template (Hugging Face id or folder) before sending."),
) -> None:
    """Measure one running server on one suite at one concurrency and write it as a cell of a sweep folder."""
    from dflash_bench.client.run import run_one

    _, summary = run_one(url=url, suite=suite, concurrency=concurrency, num_prompts=num_prompts, max_tokens=max_tokens,
                         temperature=temperature, label=label, engine=engine, api=api, save_token_ids=save_token_ids,
                         enable_thinking=thinking, out=out, name=name, data_dir=data_dir, seed=seed,
                         request_rate=request_rate, timeout=timeout, warmup=warmup, model=model, transport=transport,
                         tokenizer=tokenizer)
    if summary.status == "failed":  # as `sweep` does: a failed cell is a failed run
        raise typer.Exit(1)


@app.command()
def report(
    sweep_dirs: list[Path] = typer.Argument(..., metavar="SWEEP_DIR...", help="One or more sweep folders; several are shown side by side."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="The HTML file to write (default: report.html in the first sweep folder); figures/ goes beside it."),
) -> None:
    """Write one self-contained offline HTML report (and figures/*.png) from sweep folders."""
    from dflash_bench.report import build_report

    page = build_report(sweep_dirs, out)
    typer.echo(f"report: {page}")


@app.command()
def migrate(
    sweep_dir: Path = typer.Argument(..., metavar="SWEEP_DIR", help="A sweep folder written by an older dflash-bench."),
) -> None:
    """Rewrite a sweep folder of an older schema version as this version's (report and gate read old folders without it)."""
    from dflash_bench.store import SCHEMA_VERSION, SweepDir

    done = SweepDir.open(sweep_dir).migrate()
    typer.echo(f"{sweep_dir}: " + (f"rewritten as schema version {SCHEMA_VERSION}" if done
                                   else f"already at schema version {SCHEMA_VERSION}, nothing to do"))


@app.command()
def models() -> None:
    """List the known target / DFlash drafter pairs, their block sizes and the engine versions they need."""
    from dflash_bench.models import print_table

    print_table()


@app.command()
def launch(
    engine: str = typer.Option("vllm", "--engine", "-e", help="vllm, sglang, builtin, emulator or llamacpp."),
    model: str = typer.Option(..., "--model", "-m", help="A known short name (see `dflash-bench models`) or a Hugging Face id / folder."),
    mode: str = typer.Option("dflash", "--mode", help="ar (plain decoding) or dflash (speculative)."),
    gpu: str = typer.Option("generic", "--gpu", help="GPU preset for engine flags: generic, h100 (Hopper), b300 (Blackwell)."),
    runner: str = typer.Option("docker", "--runner", help="docker (engine image) or process (engine installed here)."),
    port: Optional[int] = typer.Option(None, "--port", min=1, max=65535, help="Port to serve on (default: the engine's own)."),
    image: Optional[str] = typer.Option(None, "--image", help="Container image (default: the engine's pinned image)."),
    gpus: str = typer.Option("all", "--gpus", help="GPUs for the container: all, a list like 0,1, or none."),
    drafter: Optional[str] = typer.Option(None, "--drafter", help="DFlash drafter id or folder (overrides the known pair's)."),
    engine_arg: Optional[list[str]] = typer.Option(None, "--engine-arg", help="Extra server flag, passed through as is (repeatable; use --engine-arg=--flag)."),
    network: str = typer.Option("host", "--network", help="host (container shares the host network) or bridge (port mapped on 127.0.0.1)."),
    ready_timeout: float = typer.Option(1800.0, "--ready-timeout", help="Seconds to wait for the server's readiness endpoint."),
    log: Optional[str] = typer.Option(None, "--log", help="Write the server's log here (default: a temporary file)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the exact docker or process command and exit."),
) -> None:
    """Start one AR or DFlash server, print its URL and keep it up until Ctrl-C."""
    from dflash_bench.launch.commands import run_launch

    run_launch(engine, model, mode, gpu=gpu, runner=runner, port=port, image=image, gpus=gpus, drafter=drafter,
               engine_args=engine_arg or [], network=network, dry_run=dry_run, ready_timeout=ready_timeout,
               log_path=log)


@app.command()
def stop(
    all_: bool = typer.Option(False, "--all", help="Also stop servers whose harness is still running."),
    sweep: Optional[str] = typer.Option(None, "--sweep", help="Only this sweep's containers (running harness or not)."),
) -> None:
    """Remove leftover dflash-bench servers (containers by label, local process groups)."""
    from dflash_bench.launch.commands import run_stop

    run_stop(all_, sweep)


@app.command()
def doctor() -> None:
    """Check GPUs and driver, the docker daemon, engine images, HF_TOKEN and disk: one yes/no line each."""
    from dflash_bench.launch.doctor import run_doctor

    run_doctor()


@app.command()
def telemetry(
    gpus: Optional[str] = typer.Option(None, "--gpus", help="GPUs to check, e.g. 0,1 (indices into CUDA_VISIBLE_DEVICES). Default: all."),
    seconds: float = typer.Option(0.0, "--seconds", help="Also sample for this long and print power and energy (0: only list the GPUs)."),
    interval: float = typer.Option(0.1, "--interval", help="Seconds between samples (0.1 = 10 Hz, as in a sweep)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the samples here as CSV (telemetry.csv's format)."),
) -> None:
    """Check GPU telemetry (NVML): list the GPUs, optionally sample them; exit 1 when telemetry is off."""
    from dflash_bench.telemetry.check import run_check

    raise typer.Exit(run_check(gpus, seconds, interval, out))


@app.command()
def gate(
    sweep_dir: Path = typer.Argument(..., metavar="SWEEP_DIR", help="The sweep folder to gate (or to export with --export-baseline)."),
    baseline: Optional[Path] = typer.Option(None, "--baseline", "-b", help="A sweep folder or a baseline file written by --export-baseline."),
    thresholds: Optional[Path] = typer.Option(None, "--thresholds", help="TOML file of thresholds and bootstrap settings (see examples/gate.toml)."),
    junit: Optional[Path] = typer.Option(None, "--junit", help="Write JUnit XML here: one test case per gated metric and cell."),
    markdown: Optional[Path] = typer.Option(None, "--markdown", help="Write a markdown summary here, for a PR comment or $GITHUB_STEP_SUMMARY."),
    export_baseline: bool = typer.Option(False, "--export-baseline", help="Write SWEEP_DIR's cells as a small baseline file (-o) instead of gating."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="With --export-baseline: the baseline file to write."),
) -> None:
    """Gate a sweep against a baseline: exit 0 pass, 1 regression, 2 unusable input."""
    from dflash_bench.gate import main as gate_main

    code = gate_main(sweep_dir, baseline=baseline, export=export_baseline, output=output, thresholds=thresholds,
                     junit=junit, markdown=markdown)
    raise typer.Exit(code)


@app.command()
def serve(
    model: str = typer.Option(..., "--model", help="Target model: a Hugging Face id or a local folder."),
    draft: Optional[str] = typer.Option(None, "--draft", help="DFlash drafter folder in z-lab's format (config.json + model.safetensors)."),
    mode: Optional[str] = typer.Option(None, "--mode", help="ar or dflash (default: dflash when --draft is given, else ar)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8000, "--port", min=1, max=65535, help="Port to listen on."),
    dtype: str = typer.Option("auto", "--dtype", help="auto (bfloat16 on GPU, float32 on CPU), bfloat16, float16, float32 or float64."),
    device: str = typer.Option("auto", "--device", help="auto (cuda when a GPU is visible, else cpu), cpu, cuda or cuda:N."),
    max_slots: int = typer.Option(32, "--max-slots", help="Most requests decoded together; more wait in a queue."),
    max_model_len: int = typer.Option(4096, "--max-model-len", help="Most tokens per request (prompt + output); sizes the KV cache."),
    served_model_name: Optional[str] = typer.Option(None, "--served-model-name", help="Model name in the API (default: --model as given)."),
    fast: bool = typer.Option(False, "--fast", help="Fast path: fused Qwen3/Llama forward with CUDA graphs (greedy requests only)."),
    synthetic_acceptance: Optional[float] = typer.Option(None, "--synthetic-acceptance", help="Benchmarking random weights: accept drafts at this mean length (tokens are wrong; needs --fast --benchmark-only)."),
    benchmark_only: bool = typer.Option(False, "--benchmark-only", help="Allow options that make answers wrong on purpose (--synthetic-acceptance)."),
    step_ahead: bool = typer.Option(True, "--step-ahead/--no-step-ahead", help="Fast path: launch the next decode step before reading this one's tokens (the GPU never waits for the host; a request admitted mid-decode waits up to one step longer for its first token)."),
) -> None:
    """Serve the builtin DFlash engine (OpenAI-compatible API, vLLM metric names) until interrupted."""
    from dflash_bench.engine.server import serve as run_server

    run_server(model, draft, mode=mode, host=host, port=port, dtype=dtype, device=device, max_slots=max_slots,
               max_model_len=max_model_len, served_model_name=served_model_name, fast=fast,
               synthetic_acceptance=synthetic_acceptance, benchmark_only=benchmark_only, step_ahead=step_ahead)


@app.command("train-drafter")
def train_drafter(
    target: str = typer.Option(..., "--target", help="Target model folder (a Hugging Face causal LM with its tokenizer)."),
    data: Path = typer.Option(..., "--data", help="Prompts: .jsonl ('messages' or 'prompt' per line), .txt (blank-line separated) or a folder of them."),
    out: Path = typer.Option(..., "--out", help="Folder that receives the drafter (z-lab format: config.json + model.safetensors)."),
    steps: int = typer.Option(1000, "--steps", min=1, help="Optimiser steps."),
    block_size: int = typer.Option(16, "--block-size", min=2, help="Block size B (drafts B-1 tokens per step)."),
    layers: int = typer.Option(2, "--layers", min=1, help="Drafter decoder layers."),
    target_layers: Optional[str] = typer.Option(None, "--target-layers", help="Comma-separated target layers to read (default: z-lab's spacing)."),
    gamma: Optional[float] = typer.Option(None, "--gamma", help="Loss decay exp(-(k-1)/gamma) over block position k (default 7 for B=16)."),
    lr: float = typer.Option(6e-4, "--lr", help="Peak learning rate (AdamW, cosine)."),
    batch: int = typer.Option(16, "--batch", min=1, help="Sequences per step."),
    anchors: int = typer.Option(32, "--anchors", min=1, help="Random anchors (blocks) per sequence per step."),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", min=2, help="Length of the responses the target regenerates."),
    num_prompts: Optional[int] = typer.Option(None, "--num-prompts", min=1, help="Use only the first N prompts."),
    mask_token_id: Optional[int] = typer.Option(None, "--mask-token-id", help="Mask token (default: the first embedding row past the tokenizer)."),
    device: str = typer.Option("auto", "--device", help="auto (cuda when a GPU is visible, else cpu), cpu, cuda or cuda:N."),
    seed: int = typer.Option(0, "--seed", help="Seed of the initialisation, anchors and batches."),
) -> None:
    """Train a DFlash drafter for your target: responses regenerated by the target, z-lab format out (minimal)."""
    from dflash_bench.train.drafter import train_drafter_main

    train_drafter_main(target, str(data), str(out), device=device, steps=steps, block_size=block_size, layers=layers,
                       target_layer_ids=target_layers, gamma=gamma, lr=lr, batch=batch, anchors=anchors,
                       max_new_tokens=max_new_tokens, num_prompts=num_prompts, mask_token_id=mask_token_id, seed=seed)


@app.command()
def sweep(
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Short name (see `dflash-bench models`), Hugging Face id or local folder of the target."),
    engine: Optional[str] = typer.Option(None, "--engine", help="vllm, sglang, builtin, emulator or llamacpp; several comma-separated. Default builtin."),
    suites: Optional[str] = typer.Option(None, "--suites", help="'all' (every suite but speed-bench) or a comma-separated list. Default all."),
    concurrency: Optional[str] = typer.Option(None, "--concurrency", "-c", help="Comma-separated concurrencies. Default 1,8,32."),
    num_prompts: Optional[int] = typer.Option(None, "--num-prompts", "-n", min=1, help="Prompts per cell (default max(16, 4 x concurrency))."),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", min=1, help="Output cap per request (default: each suite's, 2048)."),
    repeats: Optional[int] = typer.Option(None, "--repeats", min=1, help="Measure every cell this many times (modes alternate to cancel drift)."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="Engine flag preset: h100, b300 or generic."),
    drafter: Optional[str] = typer.Option(None, "--drafter", help="DFlash drafter (HF id or folder) when --model is not a known pair."),
    runner: Optional[str] = typer.Option(None, "--runner", help="docker or process (default: docker for vllm/sglang, process for builtin/emulator)."),
    image: Optional[str] = typer.Option(None, "--image", help="Container image (overrides the engine's default)."),
    port: Optional[int] = typer.Option(None, "--port", min=1, max=65535, help="Port of the launched servers (default: the engine's, 8000)."),
    engine_arg: Optional[list[str]] = typer.Option(None, "--engine-arg", help="Extra server argument, passed through (repeatable)."),
    url_ar: Optional[str] = typer.Option(None, "--url-ar", help="Measure this running AR server instead of launching one."),
    url_dflash: Optional[str] = typer.Option(None, "--url-dflash", help="Measure this running DFlash server instead of launching one."),
    temperature: Optional[float] = typer.Option(None, "--temperature", min=0.0, help="Sampling temperature (default 0)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed of the prompt sampling (default 0)."),
    thinking: Optional[bool] = typer.Option(None, "--thinking/--no-thinking", help="Chat-template thinking (default: the pair's)."),
    save_token_ids: Optional[bool] = typer.Option(None, "--save-token-ids", help="Keep output token ids for the lossless check."),
    out: Path = typer.Option(Path("reports"), "--out", help="Folder that receives the sweep folder."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Sweep folder to finish: complete cells are kept, the rest run."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan and the exact server commands; run nothing."),
    data_dir: Optional[Path] = DataDirOption,
    executor: str = typer.Option("local", "--executor", help="local (this machine) or slurm (one job per server group, see README)."),
    partition: Optional[str] = typer.Option(None, "--partition", help="Slurm partition of the jobs."),
    account: Optional[str] = typer.Option(None, "--account", help="Slurm account the jobs are charged to."),
    time_limit: Optional[str] = typer.Option(None, "--time", help="Slurm time limit of each job, e.g. 04:00:00."),
    gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", min=0, help="GPUs per job (default: the server's tensor-parallel size; 0 for the emulator)."),
    gpu_type: Optional[str] = typer.Option(None, "--gpu-type", help="Slurm gres GPU type, e.g. h100: jobs ask for gpu:h100:N."),
    sbatch_arg: Optional[list[str]] = typer.Option(None, "--sbatch-arg", help="Extra sbatch option for every job, e.g. --sbatch-arg=--qos=high (repeatable)."),
    poll_s: Optional[float] = typer.Option(None, "--poll-s", min=0.1, hidden=True, help="Seconds between job state checks (default 5)."),
) -> None:
    """Launch paired AR and DFlash servers and measure every suite at every concurrency into one sweep folder."""
    from dflash_bench.sweep.commands import parse_list, resolve_suites, sweep_command

    options = {
        "model": model, "engines": parse_list(engine), "suites": resolve_suites(suites if suites or resume else "all"),
        "concurrency": parse_list(concurrency, int), "num_prompts": num_prompts, "max_tokens": max_tokens,
        "repeats": repeats, "gpu": gpu, "runner": runner, "port": port, "engine_args": engine_arg or None, "url_ar": url_ar,
        "url_dflash": url_dflash, "temperature": temperature, "seed": seed, "thinking": thinking,
        "save_token_ids": save_token_ids, "engine_options": {"drafter": drafter} if drafter else None,
    }
    slurm = {"partition": partition, "account": account, "time": time_limit, "gpus_per_node": gpus_per_node,
             "gpu_type": gpu_type, "sbatch_args": sbatch_arg, "poll_s": poll_s}
    raise typer.Exit(sweep_command(options, out=out, resume=resume, dry_run=dry_run, data_dir=data_dir, image=image,
                                   executor=executor, slurm=slurm))


@app.command("sweep-job", hidden=True)
def sweep_job(
    sweep_dir: Path = typer.Argument(..., help="The shared sweep folder."),
    key: str = typer.Argument(..., help="The job's key (slurm/<key>.json)."),
) -> None:
    """Inside a Slurm job of `sweep --executor slurm`: measure this job's cells on this node."""
    from dflash_bench.sweep.slurm_job import run_job

    raise typer.Exit(run_job(sweep_dir, key))


@app.command()
def demo(
    out: Path = typer.Option(Path("reports"), "--out", help="Folder that receives the sweep folder and its report."),
    max_tokens: int = typer.Option(32, "--max-tokens", min=1, help="Output cap per request."),
    num_prompts: int = typer.Option(4, "--num-prompts", "-n", min=1, help="Prompts per cell (raised to the concurrency where it is higher)."),
    concurrency: Optional[str] = typer.Option(None, "--concurrency", "-c", help="Comma-separated concurrencies (default 1,8,32)."),
    data_dir: Optional[Path] = DataDirOption,
) -> None:
    """The main job on the embedded default: the builtin engine, AR vs DFlash, every suite, on this machine."""
    from dflash_bench.sweep.commands import demo_command, parse_list

    raise typer.Exit(demo_command(out=out, data_dir=data_dir, max_tokens=max_tokens, num_prompts=num_prompts,
                                  concurrency=parse_list(concurrency, int)))


@app.command()
def quality(
    sweep_dir: Path = typer.Argument(..., help="A sweep folder (from `dflash-bench sweep`)."),
    data_dir: Optional[Path] = DataDirOption,
    score_code: bool = typer.Option(False, "--score-code", help="Run model-written code (HumanEval, MBPP) in the sandbox to score pass@1. Off by default."),
    near_tie: float = typer.Option(0.1, "--near-tie", min=0.0, help="AR top-1 minus top-2 logprob (nats) at or below which a divergence is labelled a near-tie numerical flip."),
    timeout: float = typer.Option(20.0, "--timeout", min=0.1, help="Seconds (wall clock, and CPU) each sandboxed program may run."),
) -> None:
    """Check DFlash against AR in a sweep folder: token-level lossless check at temperature 0 and task accuracy
    (GSM8K, Math500; HumanEval and MBPP with --score-code), with confidence intervals; writes them into the folder."""
    from dflash_bench.quality.check import check_sweep

    check_sweep(sweep_dir, data_dir=data_dir, score_code=score_code, near_tie=near_tie, timeout_s=timeout)


def main() -> None:
    """Console entry point: user errors become one line on stderr and a non-zero exit, never a traceback."""
    try:
        app()
    except UserError as err:
        typer.echo(f"error: {err}", err=True)
        sys.exit(err.exit_code)
    except OSError as err:  # a path the user gave that cannot be written or read (exit 2: not a gate verdict)
        why = err.strerror or str(err)
        typer.echo(f"error: cannot use {err.filename}: {why}." if err.filename else f"error: {why}.", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)

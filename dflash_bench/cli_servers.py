"""The commands that start, stop or build servers: serve, emulate, launch, stop, doctor, telemetry and
`engines build` (train-drafter: cli_train.py). Registered on the app of `cli_app.py`; `cli.py` imports this
module so that `dflash-bench` has them. Heavy imports stay inside the commands (see cli.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dflash_bench.cli_app import app, engines_app
from dflash_bench.errors import UserError


@engines_app.command("build")
def engines_build(
    engine: str = typer.Argument(..., help="The engine to build: llamacpp (llama-server for this CPU)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="Parallel compile jobs (default: every core)."),
    force: bool = typer.Option(False, "--force", help="Build again even if the cache folder holds a build."),
) -> None:
    """Build an engine from source into the cache folder (llamacpp: PyPI's llama-cpp-python sdist, cmake + ninja)."""
    from dflash_bench.llamacpp.build_command import build_command

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
    acceptance_rates: Optional[str] = typer.Option(None, "--acceptance-rates", help="A synthetic acceptance profile instead of --acceptance-length: per draft position the share of steps that accept that far (non-increasing), comma-separated, block size - 1 of them."),
    output_len: int = typer.Option(128, "--output-len", help="Mean natural output length in tokens (uniform in 0.5x..1.5x)."),
    batch_slope_ms: float = typer.Option(0.0, "--batch-slope-ms", help="Extra step time per other running request."),
    seed: int = typer.Option(0, "--seed", help="Seed of output lengths, token ids and acceptance draws."),
    model: str = typer.Option("emulator", "--model", help="Served model name (in /v1/models and metric labels)."),
    per_request_spec_metrics: bool = typer.Option(False, "--per-request-spec-metrics", help="Add vLLM's per-request metrics.speculative_decoding to the usage chunk."),
    fail_every: int = typer.Option(0, "--fail-every", help="Every k-th generation request fails (0: never)."),
    fail_kind: str = typer.Option("error", "--fail-kind", help="error | stream-error | drop | malformed | hang."),
    crash_after_requests: int = typer.Option(0, "--crash-after-requests", help="Exit abruptly (code 3) once this many requests completed, cutting streams in flight."),
    prefix_cache: bool = typer.Option(False, "--prefix-cache", help="Emulate vLLM's automatic prefix caching on its counters, vllm:prefix_cache_* (blocks of 16 tokens, never evicted)."),
    prompt_tokens_details: bool = typer.Option(False, "--prompt-tokens-details", help="As vLLM's --enable-prompt-tokens-details: usage carries prompt_tokens_details.cached_tokens."),
) -> None:
    """Serve a timing emulator of an AR or DFlash LLM server (OpenAI + SGLang /generate + /metrics) with known truth."""
    from dflash_bench.emulator import EmulatorConfig
    from dflash_bench.emulator.server import serve
    from dflash_bench.synthetic import parse_rates

    rates = parse_rates(acceptance_rates, "--acceptance-rates") if acceptance_rates is not None else None
    try:
        cfg = EmulatorConfig(mode=mode, ttft_ms=ttft_ms, itl_ms=itl_ms, block_size=block_size,
                             acceptance_length=acceptance_length, acceptance_rates=rates, output_len=output_len,
                             batch_slope_ms=batch_slope_ms,
                             seed=seed, model=model, per_request_spec_metrics=per_request_spec_metrics,
                             fail_every=fail_every, fail_kind=fail_kind, crash_after_requests=crash_after_requests,
                             prefix_cache=prefix_cache, prompt_tokens_details=prompt_tokens_details)
    except ValueError as err:
        raise UserError(f"{err}.") from None
    try:
        serve(cfg, host, port)
    except OSError as err:
        raise UserError(f"cannot listen on {host}:{port}: {err.strerror or err}.") from None



@app.command()
def launch(
    engine: str = typer.Option("vllm", "--engine", "-e", help="vllm, sglang, builtin, emulator or llamacpp."),
    model: str = typer.Option(..., "--model", "-m", help="A known short name (see `dflash-bench models`) or a Hugging Face id / folder."),
    mode: str = typer.Option("dflash", "--mode", help="ar (plain decoding), dflash (speculative), or eagle3 (the pair's EAGLE-3 head, on vllm)."),
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
    from dflash_bench.launch.launch_commands import run_launch

    run_launch(engine, model, mode, gpu=gpu, runner=runner, port=port, image=image, gpus=gpus, drafter=drafter,
               engine_args=engine_arg or [], network=network, dry_run=dry_run, ready_timeout=ready_timeout,
               log_path=log)



@app.command()
def stop(
    all_: bool = typer.Option(False, "--all", help="Also stop servers whose harness is still running."),
    sweep: Optional[str] = typer.Option(None, "--sweep", help="Only this sweep's containers (running harness or not)."),
) -> None:
    """Remove leftover dflash-bench servers (containers by label, local process groups)."""
    from dflash_bench.launch.launch_commands import run_stop

    run_stop(all_, sweep)



@app.command()
def doctor(
    engine: Optional[str] = typer.Option(None, "--engine", "-e", help="The engines you mean to run (comma-separated; default: vLLM or SGLang, the GPU engines, either one)."),
    runner: Optional[str] = typer.Option(None, "--runner", help="docker or process (default: each engine's own)."),
) -> None:
    """Check GPUs and driver, the docker daemon, engine images, HF_TOKEN and disk: one yes/no line each, a "no"
    with what it means; exit 1 when the engines asked for cannot run here."""
    from dflash_bench.launch.doctor import run_doctor
    from dflash_bench.options import parse_list

    raise typer.Exit(run_doctor(parse_list(engine), runner))



@app.command()
def telemetry(
    gpus: Optional[str] = typer.Option(None, "--gpus", help="GPUs to check, e.g. 0,1 (indices into CUDA_VISIBLE_DEVICES). Default: all."),
    seconds: float = typer.Option(0.0, "--seconds", help="Also sample for this long and print power and energy (0: only list the GPUs)."),
    interval: float = typer.Option(0.1, "--interval", help="Seconds between samples (0.1 = 10 Hz, as in a sweep)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the samples here as CSV (telemetry.csv's format)."),
) -> None:
    """Check GPU telemetry (NVML): list the GPUs, optionally sample them; exit 1 when telemetry is off."""
    from dflash_bench.telemetry.telemetry_check import run_check

    raise typer.Exit(run_check(gpus, seconds, interval, out))



@app.command()
def serve(
    model: str = typer.Option(..., "--model", help="Target model: a Hugging Face id or a local folder."),
    draft: Optional[str] = typer.Option(None, "--draft", help="DFlash drafter folder in z-lab's format (config.json + model.safetensors)."),
    mode: Optional[str] = typer.Option(None, "--mode", help="ar or dflash (default: dflash when --draft is given, else ar)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8000, "--port", min=1, max=65535, help="Port to listen on."),
    dtype: str = typer.Option("auto", "--dtype", help="auto (bfloat16 on GPU, float32 on CPU), bfloat16, float16, float32 or float64."),
    device: str = typer.Option("auto", "--device", help="auto (cuda when a GPU is visible, else cpu), cpu, cuda or cuda:N."),
    max_slots: Optional[int] = typer.Option(None, "--max-slots", help="Most requests decoded together; more wait in a queue (default: with --fast, as many as the KV memory holds, at most 128, on a GPU; else 32). With --fast, more than the memory holds is refused, saying why."),
    memory_utilization: Optional[float] = typer.Option(None, "--memory-utilization", help="With --fast on a GPU: the share of the device's memory the server may hold (as vLLM's --gpu-memory-utilization; default 0.9); the KV pool gets what the weights leave of it."),
    kv_cache_memory_bytes: Optional[int] = typer.Option(None, "--kv-cache-memory-bytes", help="With --fast: the KV pool's memory in bytes, instead of --memory-utilization (the only budget on the CPU)."),
    max_model_len: int = typer.Option(4096, "--max-model-len", help="Most tokens per request (prompt + output); sizes the KV cache."),
    served_model_name: Optional[str] = typer.Option(None, "--served-model-name", help="Model name in the API (default: --model as given)."),
    fast: bool = typer.Option(False, "--fast", help="Fast path: fused Qwen3/Llama/Gemma 4 forward with CUDA graphs (greedy requests only)."),
    load_format: str = typer.Option("auto", "--load-format", help="auto (the weight files) or dummy (random weights of the configs' shapes, created on the device: measure a large model's speed without its files; answers are meaningless)."),
    synthetic_acceptance: Optional[float] = typer.Option(None, "--synthetic-acceptance", help="Benchmarking random weights: accept drafts at this mean length tau, each position with the same conditional rate (tokens are wrong; needs --fast --benchmark-only)."),
    synthetic_acceptance_rates: Optional[str] = typer.Option(None, "--synthetic-acceptance-rates", help="Benchmarking random weights: accept drafts by this profile instead, one rate per draft position, each the share of steps that accept that far (non-increasing, as vLLM's synthetic_acceptance_rates), e.g. 0.9,0.8,...; needs --fast --benchmark-only."),
    benchmark_only: bool = typer.Option(False, "--benchmark-only", help="Allow options that make answers wrong on purpose (--synthetic-acceptance, --synthetic-acceptance-rates)."),
    step_ahead: bool = typer.Option(True, "--step-ahead/--no-step-ahead", help="Fast path: launch the next decode step before reading this one's tokens (the GPU never waits for the host; a request admitted mid-decode waits up to one step longer for its first token)."),
    verify_width: str = typer.Option("auto", "--verify-width", help="Fast path, DFlash: auto (verify the anchor and as many drafts per step as maximise committed tokens per second, from measured acceptance and step times) full (the whole block every step) or N (the anchor and its first N - 1 drafts every step: tau at that width, whatever the load)."),
    cut_draft: bool = typer.Option(False, "--cut-draft", help="Fast path, DFlash: draft only the positions a step verifies (the anchor and w - 1 masks), not the whole block; for drafters trained on blocks of random length."),
    kernels: bool = typer.Option(True, "--kernels/--no-kernels", help="Fast path: run the decode step's kernels (Triton on a GPU, C on a CPU); --no-kernels runs plain torch ops instead, to compare."),
    enforce_eager: bool = typer.Option(False, "--enforce-eager", help="Fast path on a GPU: run every step eagerly, without CUDA graphs (slower; to tell a graph's fault from the step's)."),
    tensor_parallel_size: int = typer.Option(1, "--tensor-parallel-size", "--tp", min=1, help="Fast path: shard the target and the drafter over this many GPUs, one process each (Megatron-style tensor parallelism; gloo ranks on the CPU)."),
    enable_prefix_caching: bool = typer.Option(True, "--enable-prefix-caching/--no-enable-prefix-caching", help="Fast path: a finished request's slot keeps its tokens' K/V, and a prompt that starts with them (a chat's next turn) prefills only the rest, as vLLM's automatic prefix caching; usage.prompt_tokens_details.cached_tokens says how many were reused, POST /reset_prefix_cache forgets them. The reference engine computes every prompt whole."),
    prefill: str = typer.Option("auto", "--prefill", help="When a prompt that arrives while others decode is prefilled: auto (mixed for AR on the fast path on a GPU, else first), first (every waiting prompt before the next step: the batch fills before it steps, the running rows wait), mixed (fast path, AR: in the same forward as the running rows' next step, up to three prompts a step, as vLLM mixes prefills into decode batches; the first tokens come much sooner; DFlash servers prefill first)."),
) -> None:
    """Serve the builtin DFlash engine (OpenAI-compatible API, vLLM metric names) until interrupted."""
    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.serving.api_server import serve as run_server

    config = EngineConfig.from_options(
        model, draft, mode=mode, dtype=dtype, device=device, max_slots=max_slots, max_model_len=max_model_len,
        fast=fast, synthetic_acceptance=synthetic_acceptance, synthetic_acceptance_rates=synthetic_acceptance_rates,
        benchmark_only=benchmark_only, step_ahead=step_ahead,
        verify_width=verify_width, cut_draft=cut_draft, prefill=prefill, load_format=load_format, kernels=kernels,
        memory_utilization=memory_utilization, kv_cache_memory_bytes=kv_cache_memory_bytes,
        tensor_parallel_size=tensor_parallel_size, enforce_eager=enforce_eager,
        enable_prefix_caching=enable_prefix_caching)
    run_server(config, host=host, port=port, served_model_name=served_model_name)

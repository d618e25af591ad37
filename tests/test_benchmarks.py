"""Every script of benchmarks/ runs, on the tiny shape or with tiny arguments, as `python -m benchmarks.<name>`:
a script that rots fails here, not on the GPU host a year later. What a script measures (its speed numbers) is
not asserted: only that it runs to the end and writes what it says it writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def bench(name: str, *args: str, timeout: int = 600) -> str:
    """Run `python -m benchmarks.<name> ARGS` from the repository root; return its stdout (fail on a non-zero exit)."""
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"benchmarks.{name} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_gate_calibration_prints_fail_rates_and_gates_a_big_sweep():
    out = bench("harness.gate_calibration", "--trials", "20")
    rows = [line.split() for line in out.splitlines() if line.strip().startswith(("+", "-")) and "%" in line]
    assert len(rows) == 6 and all(0.0 <= float(x) <= 1.0 for r in rows for x in r[1:])
    assert "gate of 210 cells" in out


def test_report_build_builds_a_report_of_planted_cells():
    out = bench("harness.report_build", "--suites", "1", "--concurrency", "1,2", "--repeats", "1", "--gpus", "1")
    assert out.startswith("cells 4;") and " figures" in out and "; 0 warnings;" in out


def test_big_sweep_reads_sweep_folders_into_one_results_file(tmp_path):
    from benchmarks.fixtures.report_sweeps import make_sweep

    folder = make_sweep(tmp_path / "s", suites=("gsm8k",), repeats=1, gpus=1, concurrency=(1,))
    out = tmp_path / "big.json"
    bench("peers.big_sweep", str(folder), "--out", str(out), "--tokenizer", "bytes", "--refused", "dflash-bench sweep X", "no.")
    res = json.loads(out.read_text())
    assert res["tokenizer"] == "bytes" and res["refused"] == [{"command": "dflash-bench sweep X", "sentence": "no."}]
    assert len(res["runs"]) == 1 and {r["mode"] for r in res["runs"][0]["rows"]} == {"ar", "dflash"}
    bench("peers.big_sweep", str(folder), "--out", str(out))  # the same run again replaces its rows
    assert len(json.loads(out.read_text())["runs"]) == 1
    proc = subprocess.run([sys.executable, "-m", "benchmarks.peers.big_sweep", str(tmp_path), "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "is not a sweep folder" in proc.stderr


def test_big_sweep_names_a_failed_cells_files_from_their_package_on(tmp_path):
    """A failed cell's reason quotes a traceback's files where the machine that ran it installed them (a bundle's
    unpacked site, a venv's site-packages): the results file names them from the package on, as on any machine."""
    from benchmarks.fixtures.report_sweeps import make_sweep

    why = ('server died: File "/tmp/vllm-site/vllm/v1/engine/core_client.py", line 1061 | '
           "/opt/torch/.venv/lib/python3.12/site-packages/torch/cuda/memory.py: OutOfMemoryError")
    folder = make_sweep(tmp_path / "s", suites=("gsm8k",), concurrency=(1,), failed={"vllm-dflash-gsm8k-c1": why})
    out = tmp_path / "big.json"
    bench("peers.big_sweep", str(folder), "--out", str(out))
    (row,) = [r for r in json.loads(out.read_text())["runs"][0]["rows"] if r["mode"] == "dflash"]
    assert row["reason"] == ('server died: File "vllm/v1/engine/core_client.py", line 1061 | '
                             "torch/cuda/memory.py: OutOfMemoryError")


def test_big_sweep_groups_a_cells_first_tokens_by_when_they_came():
    from benchmarks.peers.big_sweep import FIRST_TOKEN_GAP_MS, first_tokens
    from dflash_bench.store import RequestRecord

    gap = FIRST_TOKEN_GAP_MS / 1e3

    def rec(i: int, first: float, **kw) -> RequestRecord:
        return RequestRecord(request_id=f"r{i}", prompt_id=f"p{i}", t_send=0.0, t_first_token=first, **kw)

    # one alone, three a step apart by less than the gap (chained), two after a longer pause; a warm-up, a failure
    # and a request that never had a first token among them count nowhere
    records = [rec(0, 0.030), rec(1, 0.300), rec(2, 0.300 + 0.9 * gap), rec(3, 0.300 + 1.8 * gap),
               rec(4, 0.500), rec(5, 0.501), rec(6, 0.301, warmup=True), rec(7, 0.302, error="HTTP 500"),
               RequestRecord(request_id="r8", prompt_id="p8", t_send=0.0)]
    groups = first_tokens(records[::-1])  # in any order on disk
    assert [g.requests for g in groups] == [1, 3, 2]
    assert groups[0].ttft_ms == pytest.approx(30.0) and groups[2].ttft_ms == pytest.approx(500.5)
    assert groups[1].ttft_ms == pytest.approx(1e3 * (0.300 + 0.9 * gap))  # the median of the three
    assert first_tokens([]) == []


@pytest.mark.engine
def test_big_shape_writes_a_target_and_drafter_without_weights(tmp_path):
    pytest.importorskip("tokenizers")
    shown = json.loads(bench("peers.big_shape", "--pair", "gemma-4-31B-it", "--out", str(tmp_path)))
    target, drafter = Path(shown["target"]), Path(shown["drafter"])
    assert json.loads((target / "config.json").read_text())["model_type"].startswith("gemma")
    assert (drafter / "config.json").is_file() and not list(target.glob("*.safetensors"))
    assert "What is 7 * 6?" in shown["renders"]["text"] and shown["renders"]["token_ids"]


@pytest.mark.engine
def test_engine_profile_profiles_ar_and_dflash_on_the_tiny_pair():
    out = bench("speed.engine_profile", "--max-tokens", "8", "--top", "3", "--hidden", "32", "--layers", "2")
    assert "== ar:" in out and "== dflash:" in out and "tok/s" in out


def test_quality_sandbox_passes_the_reference_solutions(data_dir):
    out = bench("harness.quality_sandbox", "--data-dir", str(data_dir), "--num-prompts", "3", "--workers", "1")
    assert "humaneval: 3/3 reference solutions pass" in out and "mbpp: 3/3 reference solutions pass" in out


@pytest.mark.slow
def test_reading_path_counts_the_files_a_sweep_and_report_run(tmp_path, data_dir):
    out = tmp_path / "path.json"
    bench("harness.reading_path", "--data-dir", str(data_dir), "--json", str(out))
    res = json.loads(out.read_text())
    assert res["files"] == len(res["per_file"]) and "dflash_bench/cli.py" in res["per_file"]
    assert res["function_lines"] == sum(res["per_file"].values())


# The in-process engine benchmarks, on the embedded pair on the CPU with the smallest workload each takes.
PAIR = REPO / "dflash_bench" / "assets" / "default_pair"
ENGINE = pytest.mark.engine


@ENGINE
def test_cpu_step_times_steps_and_throughput(tmp_path):
    out = tmp_path / "cpu_step.json"
    bench("speed.cpu_step", "--draft-shapes", "1x64", "--batches", "1", "--widths", "2", "--concurrency", "1",
          "--prompt-len", "16", "--steps", "1", "--rounds", "1", "--new-tokens", "4", "--out", str(out))
    res = json.loads(out.read_text())
    assert len(res["steps"]) == 1 and len(res["throughput"]) == 1 and res["args"]["target"].startswith("dflash_bench/")
    assert {"block", "cut"} <= set(res["throughput"][0])


@ENGINE
def test_cpu_anatomy_splits_a_step_into_kernels(tmp_path):
    out = tmp_path / "anatomy.json"
    bench("speed.cpu_anatomy", "--batches", "1", "--widths", "2", "--prompt-len", "16", "--steps", "1", "--rounds", "1",
          "--out", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert [(r["kind"], r["width"]) for r in rows] == [("ar", 0), ("dflash", 2)] and rows[0]["step_over_ar"] == 1.0
    assert "linear" in rows[0]["ms"]


@ENGINE
def test_closed_loop_runs_a_cell_in_process(data_dir):
    out = bench("speed.closed_loop", "--model", str(PAIR / "target"), "--draft", str(PAIR / "drafter"), "--data-dir",
                str(data_dir), "--concurrency", "1", "--prompts-per-slot", "2", "--new-tokens", "4",
                "--max-model-len", "512", "--device", "cpu")
    cell = json.loads(out.strip().splitlines()[-1])
    assert (cell["concurrency"], cell["requests"], cell["output_tokens"]) == (1, 2, 8) and cell["tau"] >= 1


@ENGINE
def test_suite_sequence_runs_the_demo_cells_in_order(tmp_path, data_dir):
    out = tmp_path / "seq.json"
    bench("speed.suite_sequence", "--data-dir", str(data_dir), "--concurrency", "1,2", "--tokens", "4", "--rounds", "1",
          "--decay", "0.99", "--out", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert [r["engine"] for r in rows] == ["ar", "dflash fresh", "dflash after gsm8k, decay 0.99"]


@ENGINE
def test_width_table_records_what_the_chooser_learns(tmp_path, data_dir):
    out = tmp_path / "widths.json"
    bench("speed.width_table", "--data-dir", str(data_dir), "--suites", "gsm8k", "--concurrency", "2", "--new-tokens", "4",
          "--rounds", "1", "--out", str(out))
    (row,) = json.loads(out.read_text())["rows"]
    assert (row["suite"], row["concurrency"]) == ("gsm8k", 2) and row["chosen"] and row["step_ms"]


@ENGINE
def test_wave_anatomy_splits_a_cell_into_prefill_and_steps(data_dir):
    out = bench("speed.wave_anatomy", "--model", str(PAIR / "target"), "--draft", str(PAIR / "drafter"), "--data-dir",
                str(data_dir), "--concurrency", "2", "--prompts-per-slot", "1", "--new-tokens", "4",
                "--max-model-len", "512", "--device", "cpu", "--prefill-tokens", "512")
    cell = json.loads(out.strip().splitlines()[-1])
    assert (cell["concurrency"], cell["prefill_tokens"], cell["prompts"]) == (2, 512, 2) and cell["steps"] >= 1


@ENGINE
def test_prefill_speed_times_each_way_to_prefill(tmp_path):
    out = tmp_path / "prefill.json"
    bench("speed.prefill_speed", "--model", str(PAIR / "target"), "--draft", str(PAIR / "drafter"), "--lengths", "16",
          "--rows", "1,2", "--reps", "1", "--max-model-len", "256", "--out", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert [r["rows"] for r in rows] == [1, 2] and rows[0]["batched_ms"] is None and rows[1]["batched_ms"] > 0


@ENGINE
def test_resume_speed_times_second_turns_resumed_and_whole(tmp_path):
    out = tmp_path / "resume.json"
    bench("speed.resume_speed", "--model", str(PAIR / "target"), "--draft", str(PAIR / "drafter"), "--rows", "1,2",
          "--context", "80", "--new", "8", "--reps", "1", "--out", str(out))
    data = json.loads(out.read_text())
    assert data["mode"] == "dflash" and [r["rows"] for r in data["rows"]] == [1, 2]
    assert all(r["tokens_resumed"] == r["rows"] * 9 and r["whole_ms"] > 0 and r["resumed_ms"] > 0 for r in data["rows"])


@ENGINE
def test_mixed_step_times_a_prompt_riding_a_decode_step(tmp_path):
    out = tmp_path / "mixed.json"
    bench("speed.mixed_step", "--model", str(PAIR / "target"), "--device", "cpu", "--lengths", "16", "--rows", "2",
          "--prompts", "1", "--reps", "1", "--max-model-len", "256", "--out", str(out))
    (row,) = json.loads(out.read_text())["rows"]
    assert (row["rows"], row["prompt_tokens"], row["prompts"]) == (2, 16, 1) and row["mixed_ms"] > 0


@ENGINE
def test_engine_speed_runs_the_tiny_shape_on_the_cpu(tmp_path):
    out = tmp_path / "speed.json"
    bench("speed.engine_speed", "--shape", "tiny", "--device", "cpu", "--prompt-len", "16", "--new-tokens", "8",
          "--concurrency", "1", "--hf-tokens", "4", "--soak", "2", "--soak-tokens", "4", "--out", str(out))
    res = json.loads(out.read_text())
    assert res["shape"] == "tiny" and len(res["rows"]) == 1 and res["soak"]["requests"] == 2
    # the exactness checks it runs before timing anything hold on the CPU too
    assert all(v["ar_equal_reference"] and v["dflash_equal_ar"] for v in res["lossless_tiny"].values())


def test_harness_overhead_times_the_client_against_the_emulator(tmp_path):
    out = tmp_path / "overhead.json"
    bench("harness.overhead", "--concurrency", "1,2", "--transports", "raw,httpx", "--tokens", "8", "--wire", "",
          "--out", str(out))
    res = json.loads(out.read_text())
    assert [(r["transport"], r["concurrency"]) for r in res["cpu"]] == [("raw", 1), ("raw", 2), ("httpx", 1), ("httpx", 2)]
    assert all(r["failed"] == 0 and r["tokens"] > 0 for r in res["cpu"]) and res["wire"] == []


@ENGINE
@pytest.mark.slow
def test_serve_speed_serves_the_tiny_shape_and_runs_against_it(tmp_path, data_dir):
    from dflash_bench.launch import free_port

    out = tmp_path / "serve.json"
    bench("speed.serve_speed", "--shape", "tiny", "--device", "cpu", "--data-dir", str(data_dir), "--concurrency", "1",
          "--prompts-per-slot", "1", "--new-tokens", "8", "--step-ahead", "on", "--port", str(free_port()),
          "--out", str(out))
    cells = json.loads(out.read_text())["rows"]["1"]
    assert set(cells) == {"ar", "dflash"} and all(c["num_ok"] == 1 and c["num_failed"] == 0 for c in cells.values())
    assert cells["dflash"]["acceptance_length"] > 1  # synthetic acceptance


@ENGINE
@pytest.mark.slow
def test_real_engines_shape_serves_and_runs_in_process(tmp_path, data_dir):
    out = tmp_path / "real.json"
    bench("peers.real_engines", "shape", "--engines", "builtin,inprocess", "--modes", "dflash", "--shape", "tiny",
          "--device", "cpu", "--data-dir", str(data_dir), "--concurrency", "1", "--prompts-per-slot", "1",
          "--new-tokens", "4", "--max-model-len", "512", "--work", str(tmp_path / "work"), "--out", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert sorted((r["engine"], r["num_ok"], r["num_failed"]) for r in rows) == [("builtin", 1, 0), ("inprocess", 1, 0)]
    table = bench("peers.real_engines", "table", "--out", str(out))
    assert table.count("| dflash |") == 2


def test_serve_profile_summarises_py_spy_output(tmp_path):
    from benchmarks.speed.serve_profile import summarise

    raw = tmp_path / "x.raw"
    raw.write_text("thread (1): dflash-engine;step (a.py:3);matmul (b.py:9) 6\n"
                   "thread (1): dflash-engine;step (a.py:4) 2\nthread (2): MainThread;poll (c.py:1) 2\n")
    got = summarise(raw, 20, 5)
    assert list(got) == ["dflash-engine", "MainThread"]
    assert got["dflash-engine"]["samples"] == 8 and got["dflash-engine"]["gil_share"] == 0.4
    assert got["dflash-engine"]["inclusive"][0] == ("step (a.py)", 8) and got["dflash-engine"]["self"][0] == ("matmul (b.py)", 6)


def test_serve_profile_sorts_samples_into_the_parts_of_the_serving_path(tmp_path):
    from benchmarks.speed.serve_profile import PARTS, parts

    engine = "thread (1): dflash-engine;EngineLoop._run (dflash_bench/engine/serving/loop.py:9)"
    loop = "thread (2): MainThread;BaseEventLoop._run_once (asyncio/base_events.py:1)"
    raw = tmp_path / "x.raw"
    raw.write_text(
        f"{engine};EngineLoop._step (dflash_bench/engine/serving/loop.py:3);Bookkeeping.commit "
        "(dflash_bench/engine/bookkeeping.py:4);Detokenizer.add (dflash_bench/engine/detok.py:5) 7\n"
        f"{engine};EngineLoop._admit (dflash_bench/engine/serving/loop.py:3);FastRunner.prefill "
        "(dflash_bench/engine/fast/running/runner.py:2) 3\n"
        f"{loop};StreamingResponse.stream_response (starlette/responses.py:2);build_app.<locals>._stream "
        "(dflash_bench/engine/serving/api_server.py:3);Reply.chunk (dflash_bench/openai_format.py:2) 5\n"
        f"{loop};StreamingResponse.stream_response (starlette/responses.py:2);RequestResponseCycle.send "
        "(uvicorn/protocols/http/h11_impl.py:4) 4\n"
        f"{loop};build_app.<locals>.chat (dflash_bench/engine/serving/api_server.py:1);chat_prompt "
        "(dflash_bench/engine/serving/api.py:2);render (jinja2/environment.py:3) 2\n")
    got = parts(raw)
    assert got == {"detokenize": 7, "admission (prefill)": 3, "SSE chunks": 5, "HTTP (ASGI, h11, socket)": 4,
                   "request intake": 2}
    assert set(got) <= set(PARTS)


def test_serve_profile_tells_the_engines_process_from_the_servers(tmp_path):
    """py-spy --subprocesses roots a stack in its processes (a command line may hold a ';'): the engine's process's
    threads are told from the server's, and its hand-over (engine_process.py) is the hand-over."""
    from benchmarks.speed.serve_profile import by_process, parts, summarise

    server = 'process 10:"python -m dflash_bench serve --port 1"'
    thread = (server + ';process 11:"python -B -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=8)"'
              ";thread (12): dflash-engine")
    raw = tmp_path / "x.raw"
    raw.write_text(
        f"{thread};EngineLoop._run (dflash_bench/engine/serving/loop.py:9);flush "
        "(dflash_bench/engine/serving/engine_process.py:4) 6\n"
        f"{thread};Thread.run (threading.py:1);go (z.py:2) 2\n"
        f"{server};thread (13): dflash-engine-results;EngineProcess._read "
        "(dflash_bench/engine/serving/engine_process.py:5) 3\n"
        f"{server};thread (10): MainThread;RequestResponseCycle.send (uvicorn/protocols/http/h11_impl.py:4) 4\n")
    assert parts(raw) == {"hand-over": 9, "HTTP (ASGI, h11, socket)": 4, "engine thread, other": 2}
    assert by_process(raw) == {"server": 7, "engine process": 8}
    assert list(summarise(raw, 10, 3)) == ["engine process: dflash-engine", "MainThread", "dflash-engine-results"]


def test_harness_fidelity_compares_the_harness_with_the_emulators_truth():
    out = bench("harness.fidelity", "--concurrency", "1", "--modes", "ar,dflash")
    rows = [line.split() for line in out.splitlines()[1:]]
    # how close the timings come depends on the machine's load: that is the measurement, not asserted here
    assert [r[:2] for r in rows] == [["ar", "c1"], ["dflash", "c1"]] and all(r[-1] in ("within", "OUTSIDE") for r in rows)


def test_faults_plays_faults_against_the_real_cli(data_dir):
    out = bench("faults", "--data-dir", str(data_dir), "--only", "run_all_failed,planted_script")
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| case")]
    assert len(rows) == 2 and all(r.endswith("| nothing | held |") for r in rows)  # exit 0: every case held


def test_faults_plays_the_trust_cases_of_both_case_modules(data_dir):
    """One case of faults/integrity.py (server identity) and one of faults/measurement.py (connect), through `python -m benchmarks.faults`."""
    out = bench("faults", "--data-dir", str(data_dir), "--only", "foreign_server_on_port,connect_delayed_accept")
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| case")]
    assert len(rows) == 2 and all(r.endswith("| nothing | held |") for r in rows), rows


def test_faults_plays_the_hostile_names_case(data_dir):
    """integrity.py's names case through `python -m benchmarks.faults` (its hostile_folder case plays the fuzz
    test's cases, each through every reader)."""
    out = bench("faults", "--data-dir", str(data_dir), "--only", "hostile_names")
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| case")]
    assert len(rows) == 1 and rows[0].endswith("| every one refused | - | nothing | held |"), rows


def test_the_hostile_folder_case_counts_the_commands_it_ran(tmp_path, data_dir, monkeypatch):
    """integrity.py's hostile_folder over two of the fuzz test's cases: a damaged folder file, read by every command
    but `gate -b` of a baseline, and a damaged baseline, read by that one only."""
    from benchmarks.faults import integrity
    from benchmarks.fixtures import hostile

    every = hostile.cases

    def two(folder: Path) -> list[hostile.Case]:
        cases = every(folder)
        return [next(c for c in cases if c[0] == "manifest.json"), next(c for c in cases if c[0] == "baseline.json")]

    monkeypatch.setattr(hostile, "cases", two)
    row = integrity.hostile_folder(tmp_path, data_dir)
    assert row.held and row.observed == "2 damaged copies, 8 runs of the commands that read them; every one held", row


def test_launch_overhead_times_the_process_runner():
    out = bench("harness.launch_overhead", "--repeat", "1")
    process = {line.split()[1] for line in out.splitlines() if line.startswith("process ")}
    assert process == {"start_to_ready_s", "teardown_s", "watchdog_s"}


@pytest.mark.slow
def test_demo_repeats_runs_the_demo_and_keeps_its_range(tmp_path, data_dir):
    out = tmp_path / "repeats.json"
    bench("harness.demo_repeats", "--runs", "1", "--json", str(out), "--", "--max-tokens", "4", "-n", "1", "-c", "1",
          "--repeats", "1", "--data-dir", str(data_dir))
    res = json.loads(out.read_text())
    assert len(res["runs"]) == 1 and res["command"].startswith("dflash-bench demo --max-tokens 4")
    assert res["c1_speedup_range"] and all(s["min"] == s["max"] for s in res["c1_speedup_range"].values())


# GPU-only scripts: their CPU-runnable planning here; on a machine without CUDA their main says so in one
# sentence (no traceback).
def _no_cuda() -> bool:
    torch = pytest.importorskip("torch")
    return not torch.cuda.is_available()


@pytest.mark.parametrize("name,args", [("speed.step_anatomy", ["--shape", "tiny", "--steps", "2"]),
                                       ("speed.plan_ab", ["--rounds", "1", "--reps", "1"]),
                                       ("speed.gemm_tuning", ["--quick", "--rows", "1"]),
                                       ("speed.kernel_tuning", ["--no-attention"])])
def test_a_gpu_benchmark_says_it_needs_a_gpu(name, args):
    if not _no_cuda():
        pytest.skip("a GPU is here: `pytest -m gpu` hosts run these scripts themselves")
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1 and proc.stderr.strip().endswith("it needs a GPU" + (" (--device cuda)" if name == "speed.step_anatomy" else ""))
    assert "Traceback" not in proc.stderr


def test_plan_ab_reads_variants_of_the_engines_plans():
    from benchmarks.speed.plan_ab import parse_variant
    from dflash_bench.engine.fast.kernels import triton_gemm

    base = triton_gemm.plan_for(1, 4096, 4096)
    name, plans = parse_variant(f"wide=1,4096,4096:bn={base.bn * 2}")
    assert name == "wide" and plans == {(1, 4096, 4096): {"bn": base.bn * 2}}
    for bad in ("wide", "wide=1,4096:bn=64", "wide=1,4096,4096:nope=1"):
        with pytest.raises(SystemExit, match="--variant"):
            parse_variant(bad)


def test_gemm_tuning_searches_only_plans_the_kernel_runs():
    from benchmarks.speed.gemm_tuning import plans
    from dflash_bench.engine.fast.kernels import triton_gemm

    for m in (1, 16):
        got = list(plans(m))
        assert got and all(p.mode in triton_gemm.MODES for p in got) and len(set(got)) == len(got)
    assert {p.mode for p in plans(1)} == {"fma", "dot", "swap"} and "fma" not in {p.mode for p in plans(16)}


def test_kernel_kinds_sorts_kernels_and_sums_a_profile():
    from benchmarks.speed.kernel_kinds import kind, summarise

    elementwise = "void at::native::vectorized_elementwise_kernel<4, at::native::{}, at::detail::Array<char*, 3> >(int)"
    names = {  # names as torch.profiler reports them: cuBLAS's, SDPA's, the engine's triton kernels, torch's own
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
        "__5x_cublas": "matmul",
        "nvjet_tst_192x192_64x4_2x1_v_bz_coopA_TNT": "matmul", "triton_skinny_linear_kernel": "matmul",
        "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t, "
        "cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)": "attention",
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
        "cutlass::bfloat16_t> >(pytorch_flash::Flash_fwd_params)": "attention",
        "_split_kernel": "attention", "void (anonymous namespace)::softmax_warp_forward<float, 10>(float*)": "softmax",
        "_add_rms_norm_kernel": "norm", "_norm_add_norm_kernel": "norm", "_embed_norm_kernel": "embedding+norm",
        "_qkv_kernel": "qk norm+rope+store", "_qk_rope_store_kernel": "qk norm+rope+store",
        "_act_mul_kernel": "act*up", elementwise.format("GeluCUDAKernelImpl(at::TensorIteratorBase&)"): "act*up",
        elementwise.format("CUDAFunctor_add<c10::BFloat16>"): "elementwise",
        elementwise.format("FillFunctor<c10::BFloat16>"): "fill/arange",
        elementwise.format("BinaryFunctor<long, long, bool, CompareFunctor<long> >"): "mask/compare",
        "void at::native::elementwise_kernel<128, 4, at::native::masked_fill_kernel(at::TensorIterator&)>(int)": "mask/compare",
        "void at::native::(anonymous namespace)::CatArrayBatchedCopy_vectorized<OpaqueType<2u>, 4>(int)": "copy/cat/where",
        "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<at::native::"
        "index_put_kernel_impl<at::native::OpaqueType<2> >(at::TensorIterator&)>(long)": "cache store (index_put)",
        "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<at::native::"
        "index_kernel_impl<at::native::OpaqueType<2> >(at::TensorIterator&)>(long)": "gather (index)",
        "void at::native::(anonymous namespace)::indexSelectSmallIndex<c10::BFloat16, long, unsigned int, 2, 2, -2>"
        "(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>)": "gather (index)",
        "void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*, int, long, long, long, long, bool)":
        "gather (index)",
        "void at::native::elementwise_kernel_with_index<int, at::native::arange_cuda_out()>(int)": "fill/arange",
        "Memcpy HtoD (Pageable -> Device)": "memcpy/memset", "_argmax_rows_kernel": "argmax", "_commit_kernel": "commit",
        "void at::native::reduce_kernel<512, 1>(at::native::ReduceOp<float>)": "reduce",
    }
    assert {n: kind(n) for n in names} == names
    # 30 us of matmul, 10 us idle, the GeGLU, 5 us idle, a matmul with a copy beside it (on another stream)
    got = summarise([("nvjet_a", 0.0, 30.0), ("_act_mul_kernel", 40.0, 10.0), ("nvjet_a", 55.0, 20.0),
                     ("Memcpy DtoD (Device -> Device)", 60.0, 5.0)], wall_ms=0.2, top=2)
    assert {k: v.ms for k, v in got.classes.items()} == pytest.approx({"matmul": 0.05, "act*up": 0.01, "memcpy/memset": 0.005})
    assert {k: v.launches for k, v in got.classes.items()} == {"matmul": 2, "act*up": 1, "memcpy/memset": 1}
    assert (got.launches, got.busy_ms, got.span_ms, got.idle_ms) == pytest.approx((4, 0.065, 0.075, 0.015))
    assert [(k.name, k.kind, k.launches) for k in got.top] == [("nvjet_a", "matmul", 2), ("_act_mul_kernel", "act*up", 1)]
    assert got.note is None and summarise([], wall_ms=1.0).note


def test_telemetry_overhead_runs_or_says_why_not(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.harness.telemetry_overhead", "--out", str(tmp_path), "--idle-s",
                           "0.4", "--load-s", "0"], cwd=REPO, capture_output=True, text=True, timeout=300)
    if proc.returncode == 1:  # no NVIDIA driver here: the sampler's own sentence, and nothing written
        assert proc.stdout.startswith("GPU telemetry off:") and not list(tmp_path.iterdir())
    else:
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert json.loads((tmp_path / "overhead.json").read_text())["rows"]


@ENGINE
def test_gemma_fast_runs_its_shrunk_shape_on_the_cpu(tmp_path):
    """On one rank, then on two (gloo)."""
    out = tmp_path / "gemma.json"
    bench("speed.gemma_fast", "--json", str(out), "--device", "cpu", "--shrink", "--batches", "1",
          "--prefill", "1x64,3x40,3x20-40", "--reps", "1", "--anatomy")
    phases = json.loads(out.read_text())["phases"]
    assert [(p["mode"], p.get("error")) for p in phases] == [("ar", None), ("dflash", None)]
    assert all(r["tokens"] > 0 for p in phases for r in p["rates"])
    # each prefill group as asked: one prompt by its graph's path, three by one eager forward (of 20, 30 and 40
    # tokens: padded to 40), each timed
    assert [(g["prompts"], g["tokens"], g["padded_tokens"], g["graphed"]) for p in phases for g in p["prefills"]] == \
        [(1, 64, 64, True), (3, 120, 120, False), (3, 90, 120, False)] * 2
    assert all(g["ms"] > 0 and g["matmul_tflops"] > 0 for p in phases for g in p["prefills"])
    # --anatomy: one more run of each group, profiled; a CPU runs no device kernels, and the entry says so
    from benchmarks.speed.kernel_kinds import Anatomy

    anatomies = [Anatomy.model_validate(g["anatomy"]) for p in phases for g in p["prefills"]]
    assert len(anatomies) == 6 and all(a.classes == {} and a.top == [] and a.wall_ms > 0 and "CPU" in (a.note or "")
                                       for a in anatomies)
    # --tensor-parallel-size 2 builds the engine as `serve` does (gloo ranks here): the group is prefilled by both
    # ranks (a rank that missed its part would hang the collectives), timed on rank 0, whose weights are its half
    tp2 = tmp_path / "tp2.json"
    bench("speed.gemma_fast", "--json", str(tp2), "--device", "cpu", "--shrink", "--batches", "1", "--modes", "ar",
          "--prefill", "3x20-40", "--reps", "1", "--tensor-parallel-size", "2", "--host")
    run = json.loads(tp2.read_text())
    (two,) = run["phases"]
    assert (run["tensor_parallel_size"], two.get("error")) == (2, None)
    assert [(g["prompts"], g["tokens"], g["graphed"]) for g in two["prefills"]] == [(3, 90, False)]
    assert two["prefills"][0]["ms"] > 0 and two["rates"][0]["tokens"] > 0
    one = phases[0]  # the same shape's AR phase on one rank, above
    assert one["weight_bytes"] / 2 <= two["weight_bytes"] < one["weight_bytes"]  # a rank's share (some replicated)
    # --host: one more run under cProfile, rank 0's host time by function; its collectives among them
    from benchmarks.speed.kernel_kinds import HostTime

    host = HostTime.model_validate(two["prefills"][0]["host"])
    assert 0 < host.host_ms <= host.wall_ms and host.top
    assert [c.self_ms for c in host.top] == sorted((c.self_ms for c in host.top), reverse=True)
    assert any("allreduce" in c.name for c in host.top)


# recipes/tiny_pair's measuring scripts (train.py: tests/test_recipe.py), run as `python -m recipes.tiny_pair.<name>`
def recipe(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"recipes.tiny_pair.{name}", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=600)


@ENGINE
@pytest.mark.parametrize("name", ["acceptance", "measure"])
def test_a_recipe_measures_the_embedded_pair(name, tmp_path, data_dir):
    out = tmp_path / f"{name}.json"
    proc = recipe(name, "--data-dir", str(data_dir), "--suites", "gsm8k", "--num-prompts", "1", "--max-tokens", "4",
                  "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert (row["suite"], row["prompts"], row["identical"]) == ("gsm8k", 1, 1) and row["tau"] >= 1  # lossless


def test_zlab_check_wants_its_data_dir():
    proc = recipe("zlab_check", "--zlab", "ZLAB")  # z-lab's checkout and its Python are not here: only the arguments
    assert proc.returncode == 1 and proc.stderr.strip() == "--data-dir is required"


@ENGINE
def test_rows_anatomy_runs_the_tiny_shape_on_the_cpu(tmp_path):
    """The whole measurement on the CPU (C kernels, no graphs, no device profile): every point of the plan written
    through the schema, AR one token a row and step, DFlash verifying the whole block, the floors from the shape."""
    from benchmarks.speed.rows_steps import RowsAnatomy

    out = tmp_path / "anatomy.json"
    bench("speed.rows_anatomy", "--device", "cpu", "--shape", "tiny=1,2", "--steps", "2", "--learn", "2", "--context",
          "16", "--out", str(out))
    res = RowsAnatomy.model_validate_json(out.read_text())
    assert [(p.rows, p.width_policy) for p in res.points] == [(r, m) for r in (1, 2) for m in ("ar", "full", "auto")]
    info = res.shapes["tiny"]
    for p in res.points:
        assert p.busy_us is None and p.classes_us == {} and p.wall_us >= p.host_us > 0
        assert p.context_first == 16 and p.context_last > 16
        assert p.weight_floor_us == pytest.approx(1e6 * (info.weight_bytes + (p.mode == "dflash") * info.draft_weight_bytes)
                                                  / (res.bandwidth_GBps * 1e9))
    ar = [p for p in res.points if p.mode == "ar"]
    assert all(p.width == 1 and p.tokens_per_row_step == 1.0 for p in ar)
    assert all(p.width == 16 for p in res.points if p.width_policy == "full")
    assert ar[1].kv_floor_us == pytest.approx(2 * ar[0].kv_floor_us, rel=0.1)  # two rows read twice the KV
    assert res.growth == [] and res.errors == {}  # growth needs row counts from 32 up


def test_rows_anatomy_sorts_kernels_floors_and_growth():
    from benchmarks.speed.rows_steps import Point, classify, floors_us, growth, kernel_class, kv_bytes_per_row

    names = {"_skinny_kernel": "gemm", "nvjet_tst_128x64_64x8_1x1_v_bz_TNT": "gemm", "_split_kernel": "attention",
             "fmha_cutlassF_bf16_aligned_64x64_rf_sm80": "attention", "_argmax_rows_kernel": "sampling+commit",
             "_commit_kernel": "sampling+commit", "void at::native::reduce_kernel<ArgMaxOps>": "sampling+commit",
             "_add_rms_norm_kernel": "norms/rope/elementwise", "_qk_rope_store_kernel": "norms/rope/elementwise",
             "void at::native::vectorized_elementwise_kernel<4>": "norms/rope/elementwise",
             "ncclDevKernel_AllReduce_Sum_bf16_RING_LL": "other",
             "void at::native::distribution_elementwise_grid_stride_kernel<float, 4>": "sampling+commit",
             "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MaxOps>>":
                 "norms/rope/elementwise"}
    assert {n: kernel_class(n) for n in names} == names
    # the classes coarsen kernel_kinds' kinds: a kind added there gets a class here, or is "other" on purpose
    from benchmarks.speed.kernel_kinds import KINDS
    from benchmarks.speed.rows_steps import CLASS_OF_KIND
    assert {k for _, k in KINDS} == set(CLASS_OF_KIND) | {"collective", "memcpy/memset"}
    got = classify([("_skinny_kernel", 0.0, 30.0), ("_split_kernel", 40.0, 10.0), ("_commit_kernel", 90.0, 10.0)], 2)
    assert got == dict(busy_us=25.0, span_us=50.0, launches=1.5,
                       classes_us={"gemm": 15.0, "attention": 5.0, "sampling+commit": 5.0})
    assert floors_us(4_000_000, 1000.0, 8, 4e12) == pytest.approx((1.0, 0.002))
    # a sliding kind reads at most its window: 100 bytes a token over 64 of them, a full kind 10 over all 512
    assert kv_bytes_per_row(110, [64, None], [100, 10], 512) == 100 * 64 + 10 * 512
    pts = [Point(shape="s", mode="ar", width_policy="ar", rows=r, width=1, steps=2, context_first=1, context_last=2,
                 tokens_per_row_step=1.0, wall_us=100 + 2 * r, host_us=50.0, wait_us=0.0, busy_us=90 + 2 * r,
                 span_us=None, launches=None, classes_us={"gemm": 80 + 0.5 * r, "attention": 10 + 1.5 * r},
                 weight_floor_us=1.0, kv_floor_us=1.0) for r in (1, 32, 64, 128)]
    (g,) = growth(pts)
    assert g.rows == [32, 64, 128]  # from 32 rows up
    assert g.us_per_row == {"gemm": 0.5, "attention": 1.5, "busy": 2.0, "wall": 2.0, "host": 0.0}


@pytest.mark.parametrize("spec,says", [("qwen3-9b=1", "unknown shape 'qwen3-9b'"), ("tiny=1,x", "whole numbers"),
                                       ("tiny=0", "at least one row count of 1 or more")])
def test_rows_anatomy_refuses_a_bad_plan_in_one_sentence(spec, says):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.speed.rows_anatomy", "--shape", spec, "--out", "x.json"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and says in proc.stderr and "Traceback" not in proc.stderr


def test_gate_reruns_breaks_the_demo_the_three_ways(tmp_path):
    """The broken runs are the demo's sweep with one thing changed: its verify width, or its drafter (the embedded
    one with seeded noise: the same tensors, other values)."""
    from safetensors.torch import load_file

    from benchmarks.harness.gate_reruns import demo_argv, weaker_drafter
    from dflash_bench.sweep.commands import DEMO_VERIFY_WIDTH

    argv = demo_argv(Path("DATA"), ["gsm8k"])
    assert f"--engine-arg={DEMO_VERIFY_WIDTH}" in argv and "--paired" in argv and "--interleave" in argv
    assert argv[argv.index("--model") + 1] == str(REPO / "dflash_bench" / "assets" / "default_pair" / "target")
    recorded = demo_argv(Path("DATA"), ["gsm8k"], record=True)
    assert recorded[recorded.index("--model") + 1] == "dflash_bench/assets/default_pair/target"
    assert "--engine-arg=1" in demo_argv(Path("DATA"), ["gsm8k"], width="1")
    weak = weaker_drafter(tmp_path / "weak")
    source = REPO / "dflash_bench" / "assets" / "default_pair" / "drafter"
    a, b = load_file(str(source / "model.safetensors")), load_file(str(weak / "model.safetensors"))
    assert a.keys() == b.keys() and all(a[k].shape == b[k].shape for k in a)
    assert any(not (a[k] == b[k]).all() for k in a) and (weak / "config.json").read_text() == (source / "config.json").read_text()
    assert str(weak) in demo_argv(Path("DATA"), ["gsm8k"], drafter=weak)
    given = demo_argv(Path("DATA"), ["gsm8k"], urls=("http://a", "http://b"))
    assert given[given.index("--url-dflash") + 1] == "http://b" and not any(a.startswith("--engine-arg") for a in given)


@pytest.mark.slow
def test_gate_reruns_gates_reruns_and_broken_runs_of_the_demo(tmp_path, data_dir):
    """The benchmark end to end, made small (one suite, one prompt of 8 tokens): reruns gated both ways, each broken
    run against every run's baseline, the file the tables read."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "gsm8k").symlink_to(Path(data_dir) / "gsm8k")
    out = tmp_path / "gate_reruns.json"
    bench("harness.gate_reruns", "--runs", "2", "--regressions", "3", "--data-dir", str(data), "--work",
          str(tmp_path / "w"), "--out", str(out), "--", "-n", "1", "--max-tokens", "8", "-c", "1", "--repeats", "2",
          timeout=1500)
    res = json.loads(out.read_text())
    assert len(res["runs"]) == 2 and [r["kind"] for r in res["regressions"]][0] == "DFlash at width 1"
    assert {c["suite"] for r in res["runs"] for c in r["cells"]} == {"gsm8k"}
    cases = {}
    for g in res["gates"]:
        cases.setdefault(g["case"], []).append(g)
    assert len(cases["rerun of the same code"]) == 2 and len(cases["DFlash at width 1"]) == 2
    assert all(g["failures"] for g in cases["DFlash at width 1"])  # it never speculated
    assert str(REPO) not in out.read_text() and str(tmp_path) not in out.read_text()  # the file names no path of this machine
    same_pair = cases["rerun of the same code"] + cases["DFlash at width 1"]  # the demo's own pair, as the demo serves it
    assert not any("models differ" in n for g in same_pair for n in g["notes"])
    from benchmarks.tables import renderers

    table = renderers.gate_reruns([res])
    assert [r[0] for r in table.rows][:2] == ["rerun of the same code", "DFlash at width 1"]


@pytest.mark.slow
def test_demo_widths_runs_the_demo_sweep_at_each_width(tmp_path, data_dir):
    out = tmp_path / "widths.json"
    bench("harness.demo_widths", "--widths", "2,4", "--suites", "gsm8k", "--repeats", "1", "--data-dir", str(data_dir),
          "--work", str(tmp_path / "w"), "--out", str(out), "--", "-n", "1", "--max-tokens", "8", "-c", "1", timeout=900)
    res = json.loads(out.read_text())
    assert [r["width"] for r in res["rows"]] == [2, 4] and all(len(r["cells"]) == 1 for r in res["rows"])
    assert all(len(set(c["taus"])) == 1 for r in res["rows"] for c in r["cells"])  # one width, one tau
    from benchmarks.tables import renderers

    assert [row[0] for row in renderers.demo_widths([res]).rows] == ["2", "4"]


def test_slow_proxy_hands_on_a_stream_intact_and_as_late_as_its_factor_says():
    """The 30%-slower server of gate_reruns: through the proxy a stream arrives whole and in order, and no sooner
    than factor x the server's own time (a lower bound its sleeps make sure of, whatever the load); other paths
    pass unchanged."""
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import httpx

    from benchmarks.fixtures.slow_proxy import SlowProxy

    pieces, gap = 8, 0.03

    class Stream(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for i in range(pieces):
                time.sleep(gap)
                self.wfile.write(f"data: {i}\n\n".encode())
                self.wfile.flush()

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "5")
            self.end_headers()
            self.wfile.write(b"ok 1\n")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Stream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    upstream = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with SlowProxy(upstream, 3.0) as proxy:
            t0 = time.monotonic()
            slowed = httpx.post(f"{proxy.url}/v1/chat/completions", json={"stream": True}, timeout=60).text
            took = time.monotonic() - t0
            metrics = httpx.get(f"{proxy.url}/metrics", timeout=60)
    finally:
        server.shutdown()
    assert slowed == "".join(f"data: {i}\n\n" for i in range(pieces))
    assert took >= 3.0 * pieces * gap
    assert metrics.status_code == 200 and metrics.text == "ok 1\n"

"""benchmarks/peers/two_clients.py on the CPU: the builtin engine on the tiny random pair, measured by `dflash-bench run`
and (where vLLM is importable) `vllm bench serve`, rows in one results file that benchmarks/tables/pages.py renders."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.tables import pages as tables
from benchmarks.tables import renderers_gpu as table_renderers_gpu
from benchmarks.peers.two_clients_measure import vllm_missing

REPO = Path(__file__).resolve().parents[1]


def two_clients(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks.peers.two_clients", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.engine
def test_the_cpu_rehearsal_measures_both_modes_and_the_tables_render_it(tmp_path, data_dir):
    out, work = tmp_path / "two_clients.json", tmp_path / "work"
    proc = two_clients("--engine", "builtin", "--shape", "tiny", "--device", "cpu", "--modes", "ar,dflash",
                       "--synthetic-tau", "4", "--concurrency", "1,2", "--new-tokens", "16", "--requests-per-slot", "2",
                       "--data-dir", str(data_dir), "--work", str(work), "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.startswith("plan: builtin on tiny") and "estimate" in proc.stdout
    data = json.loads(out.read_text())
    rows = {(r["mode"], r["concurrency"], r["client"]): r for r in data["rows"]}
    assert len(rows) == len(data["rows"]) == 8  # 2 modes x 2 concurrencies x 2 clients
    for (mode, c, client), r in rows.items():
        assert r["engine"] == "builtin" and r["shape"] == "tiny" and r["new_tokens"] == 16
        assert r["synthetic_tau"] == (4.0 if mode == "dflash" else None)
        if client == "dflash-bench" or not vllm_missing():
            assert r["status"] == "ok" and r["requests"] == 2 * c and r["failed"] == 0, r
            assert r["output_tok_s"] > 0 and r["ttft_ms_p50"] > 0 and r["tpot_ms_p50"] > 0
            assert (r["tau"] is not None) == (mode == "dflash") and r["input_tokens_mean"] > 100
        else:
            assert r["status"] == "skipped" and "vllm is not importable" in r["reason"] and r["output_tok_s"] is None
    run = data["runs"]["builtin/tiny"]
    assert set(run["servers"]) == {"ar", "dflash-tau4"} and "--synthetic-acceptance 4.0" in run["servers"]["dflash-tau4"]
    assert run["machine"]["gpu"] == "cpu" and run["input_tokens"] > 100 and run["context_len"] % 256 == 0
    assert str(tmp_path) not in out.read_text() and "WORK" in run["command"]  # no path of this machine

    # the results file renders as the AWAITING entry once it is in benchmarks/results/ and its page has the block
    root = tmp_path / "root"
    for page in {e.page for e in tables.TABLES + tables.AWAITING}:
        (root / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / page, root / page)
    shutil.copytree(REPO / "benchmarks" / "results", root / "benchmarks" / "results")
    assert tables.main(["--check", "--root", str(root)]) == 0  # no results file: the entry waits
    shutil.copy(out, root / "benchmarks" / "results" / "two_clients_h100.json")
    assert tables.main(["--check", "--root", str(root)]) == 2  # the file is there, the page lacks the block
    page = root / "docs" / "results" / "engines-one-gpu.md"
    page.write_text(page.read_text() + "\n<!-- table:two_clients_h100 -->\n<!-- /table:two_clients_h100 -->\n")
    assert tables.main(["--root", str(root)]) == 0
    text = page.read_text()
    ours = rows[("ar", 1, "dflash-bench")]
    assert f"| tiny | AR | 1 | 16 | {ours['output_tok_s']:.1f} ({ours['tpot_ms_p50']:.2f}) |" in text
    assert "| tiny | DFlash, synthetic τ 4, drawn | 2 | 16 |" in text and "python -m benchmarks.peers.two_clients" in text

    # another engine's rows beside the builtin engine's: a column per client and the ratio of their tok/s
    other = [dict(r, engine="vllm", output_tok_s=r["output_tok_s"] / 2 if r["output_tok_s"] else None)
             for r in data["rows"]]
    table = table_renderers_gpu.two_clients([dict(data, rows=data["rows"] + other)])
    assert table.header[4:7] == ["builtin, `dflash-bench run`", "vLLM, `dflash-bench run`", "builtin / vLLM"]
    assert [row[6] for row in table.rows] == ["2.00"] * 4


@pytest.mark.engine
def test_a_tensor_parallel_server_is_its_own_row_and_the_table_gives_its_tok_s_per_gpu(tmp_path, data_dir):
    """--tensor-parallel-size 2 on the CPU (two gloo ranks): the server gets the flag, its rows say 2 GPUs and are
    keyed apart from one GPU's, and the table shows them as their own shape, tok/s over the two GPUs."""
    out, work = tmp_path / "two_clients.json", tmp_path / "work"
    proc = two_clients("--engine", "builtin", "--shape", "tiny", "--device", "cpu", "--tensor-parallel-size", "2",
                       "--modes", "dflash", "--synthetic-tau", "4", "--concurrency", "2", "--new-tokens", "8",
                       "--requests-per-slot", "1", "--data-dir", str(data_dir), "--work", str(work), "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    ours = next(r for r in data["rows"] if r["client"] == "dflash-bench")
    assert ours["gpus"] == 2 and ours["status"] == "ok" and ours["requests"] == 2, ours
    run = data["runs"]["builtin/tiny/tp2"]
    assert "--tensor-parallel-size 2" in run["servers"]["dflash-tau4"]
    table = table_renderers_gpu.two_clients([data])
    row = next(r for r in table.rows if r[0] == "tiny, 2 GPUs")
    assert row[4].startswith(f"{ours['output_tok_s'] / 2:.1f} (")


def test_a_plan_past_the_time_limit_is_refused_before_anything_is_written(tmp_path):
    proc = two_clients("--engine", "builtin", "--shape", "qwen3-8b", "--concurrency", "1,8,32,64,128",
                       "--new-tokens", "128,1024", "--work", str(tmp_path / "work"), "--out", str(tmp_path / "o.json"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: this plan needs about") and "--time-limit 540" in proc.stderr
    assert not (tmp_path / "work").exists() and not (tmp_path / "o.json").exists()
    bad = two_clients("--engine", "vllm", "--shape", "qwen3-8b", "--synthetic-tau", "6.5", "--out", "x.json")
    assert bad.returncode == 2 and "--synthetic-tau is the builtin engine's" in bad.stderr
    short = two_clients("--engine", "builtin", "--shape", "tiny", "--concurrency", "1,8", "--steady-requests", "4",
                        "--out", "x.json")
    assert short.returncode == 2 and "--steady-requests must be at least the largest concurrency (8)" in short.stderr


def test_best_effort_starts_past_the_estimate_and_keeps_a_row_for_what_the_limit_left_out(tmp_path, data_dir):
    out = tmp_path / "o.json"
    proc = two_clients("--engine", "builtin", "--shape", "tiny", "--device", "cpu", "--modes", "dflash,ar",
                       "--concurrency", "1", "--new-tokens", "8", "--time-limit", "20", "--best-effort",
                       "--data-dir", str(data_dir), "--work", str(tmp_path / "work"), "--out", str(out))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "dflash: not launched" in proc.stdout and "ar: not launched" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [r["mode"] for r in rows][:1] == ["dflash"] and len(rows) == 4  # 2 modes x 2 clients
    assert all(r["status"] == "skipped" and "--time-limit 20 s would pass" in r["reason"] for r in rows)


def test_the_plan_alone_for_the_clients_asked_for_writes_nothing(tmp_path):
    """--plan-only prints the plan of the clients --clients names and stops, refusing one past --time-limit as a run
    would; a client it does not know is refused in one sentence."""
    args = ["--engine", "vllm", "--shape", "qwen3-8b", "--modes", "ar", "--concurrency", "32,64,128", "--new-tokens",
            "1024", "--requests-per-slot", "1", "--clients", "dflash-bench", "--plan-only",
            "--work", str(tmp_path / "work"), "--out", str(tmp_path / "o.json")]
    one = two_clients(*args, "--time-limit", "2000")
    both = two_clients(*[a if a != "dflash-bench" else "dflash-bench,vllm-bench" for a in args], "--time-limit", "2000")
    assert one.returncode == 0 and "clients dflash-bench;" in one.stdout, one.stderr
    assert both.returncode == 0 and "plan: vllm on qwen3-8b" in both.stdout, both.stderr
    est = [float(p.stdout.split("estimate ")[1].split(" s")[0]) for p in (one, both)]
    assert est[0] < est[1] if vllm_missing() is None else est[0] == est[1]  # vLLM's client counts where it runs
    over = two_clients(*args, "--time-limit", "100")
    assert over.returncode == 2 and over.stderr.startswith("error: this plan needs about")
    assert not (tmp_path / "work").exists() and not (tmp_path / "o.json").exists()
    bad = two_clients(*args, "--clients", "curl")
    assert bad.returncode == 2 and "--clients takes dflash-bench, vllm-bench" in bad.stderr


def test_served_rows_rehearses_both_engines_plans(tmp_path, data_dir):
    """benchmarks/peers/served_rows.sh --dry-run: the builtin engine's plan then vLLM's, within their limits, with
    nothing written but its console; a missing OUT or an unknown option is one sentence."""
    env = {**os.environ, "OUT": str(tmp_path / "out"), "DFLASH_BENCH_DATA": str(data_dir),
           "SERVED_ROWS_WORK": str(tmp_path / "work")}
    script = str(REPO / "benchmarks" / "peers" / "served_rows.sh")
    proc = subprocess.run(["bash", script, "--dry-run"], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plans = [line for line in proc.stdout.splitlines() if line.startswith("plan: ")]
    assert [p.split()[1] for p in plans] == ["builtin", "vllm"]
    assert all("concurrency 32,64,128 x new tokens 1024, clients dflash-bench" in p for p in plans)
    assert "--time-limit 270 s" in plans[0] and "--time-limit 280 s" in plans[1]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["served_rows.log"]
    assert not (tmp_path / "work").exists()
    no_out = subprocess.run(["bash", script, "--dry-run"], capture_output=True, text=True, timeout=60,
                            env={k: v for k, v in env.items() if k != "OUT"})
    assert no_out.returncode == 2 and "set OUT" in no_out.stderr
    bad = subprocess.run(["bash", script, "--fast"], capture_output=True, text=True, timeout=60, env=env)
    assert bad.returncode == 2 and "unknown option --fast" in bad.stderr


def test_merge_joins_the_files_of_engines_measured_at_once(tmp_path):
    """Two engines measured at once on two GPUs of one host, each into a file of its own: `merge` puts their runs and
    rows into the results file beside what it held, a row of the same key replaced, as consecutive commands would."""
    from benchmarks.peers.two_clients_measure import Machine, Results, Row, Run, load, save

    def part(engine: str, tok: float, c: int = 32) -> Results:
        run = Run(command=f"python -m benchmarks.peers.two_clients --engine {engine}", machine=Machine(gpu="NVIDIA H200"),
                  suite="gsm8k", input_tokens=120.0, context_len=2048)
        row = Row(engine=engine, shape="qwen3-8b", mode="ar", concurrency=c, new_tokens=1024, client="dflash-bench",
                  status="ok", output_tok_s=tok)
        return Results(runs={f"{engine}/qwen3-8b": run}, rows=[row])

    out = tmp_path / "rows.json"
    save(part("builtin", 1.0, c=64), out)  # an earlier command's row, kept
    old = part("builtin", 1.0)
    old.rows[0].output_tok_s = 0.5
    save(old, tmp_path / "old.json")
    save(part("builtin", 5328.0), tmp_path / "b.json")
    save(part("vllm", 4790.0), tmp_path / "v.json")
    proc = two_clients("merge", str(tmp_path / "old.json"), str(tmp_path / "b.json"), str(tmp_path / "v.json"),
                       "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    res = load(out)
    assert sorted((r.engine, r.concurrency, r.output_tok_s) for r in res.rows) == [
        ("builtin", 32, 5328.0), ("builtin", 64, 1.0), ("vllm", 32, 4790.0)]
    assert set(res.runs) == {"builtin/qwen3-8b", "vllm/qwen3-8b"} and res.device == "NVIDIA H200"
    bad = two_clients("merge", str(tmp_path / "missing.json"), "--out", str(out))
    assert bad.returncode == 2 and "cannot merge" in bad.stderr and "Traceback" not in bad.stderr


def test_a_later_command_neither_undoes_a_measurement_nor_takes_its_credit(tmp_path):
    """A later command that measured c=32 and ran out of time before c=64 replaces the c=32 row; its skipped c=64 row
    leaves the earlier command's measurement in place, and that row still names the command that measured it (kept
    as "<engine>/<shape>, earlier"); an earlier command left with no row is dropped."""
    from benchmarks.peers.two_clients_measure import Machine, Results, Row, Run, load, save

    def part(command: str, rows: dict[int, str]) -> Results:
        run = Run(command=command, machine=Machine(gpu="NVIDIA H200"), suite="gsm8k", input_tokens=120.0,
                  context_len=2048)
        return Results(runs={"vllm/qwen3-8b": run}, rows=[
            Row(engine="vllm", shape="qwen3-8b", mode="ar", concurrency=c, new_tokens=1024, client="dflash-bench",
                status=status, output_tok_s=100.0 * c if status == "ok" else None) for c, status in rows.items()])

    out = tmp_path / "rows.json"
    save(part("first", {32: "ok", 64: "ok"}), out)
    save(part("second", {32: "ok", 64: "skipped"}), tmp_path / "second.json")
    assert two_clients("merge", str(tmp_path / "second.json"), "--out", str(out)).returncode == 0
    res = load(out)
    assert sorted((r.concurrency, r.status, r.run) for r in res.rows) == [
        (32, "ok", "vllm/qwen3-8b"), (64, "ok", "vllm/qwen3-8b, earlier")]
    assert {k: v.command for k, v in res.runs.items()} == {"vllm/qwen3-8b": "second", "vllm/qwen3-8b, earlier": "first"}
    save(part("third", {32: "ok", 64: "ok"}), tmp_path / "third.json")
    assert two_clients("merge", str(tmp_path / "third.json"), "--out", str(out)).returncode == 0
    res = load(out)
    assert {k: v.command for k, v in res.runs.items()} == {"vllm/qwen3-8b": "third"}
    assert all(r.run == "vllm/qwen3-8b" for r in res.rows)

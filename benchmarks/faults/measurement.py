"""Fault cases of what a number means: one tau, llama.cpp as measured elsewhere, energy you can compare, connect
measured as what it is. Each registers with `common.case`."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from benchmarks.faults.common import PY, Row, case, folders, left_behind, sh
from dflash_bench.launch import free_port
from benchmarks.fixtures.bad_servers import BadServer
from benchmarks.fixtures.fake_nvml import FakeNvml


@case
def tau_one_definition(tmp: Path, data: Path) -> Row:
    """The builtin engine's tau by the one definition, and the client's own check of it from the stream."""
    pair = Path(__file__).resolve().parents[2] / "dflash_bench" / "assets" / "default_pair"
    out = tmp / "out"
    argv = [*PY, "sweep", "--model", str(pair / "target"), "--drafter", str(pair / "drafter"), "--engine", "builtin",
            "--suites", "gsm8k", "--concurrency", "1", "-n", "4", "--max-tokens", "40", "--port", str(free_port()),
            "--out", str(out), "--data-dir", str(data)]
    proc, dt = sh(argv, timeout=600)
    made = folders(out)
    s = json.loads(next(made[0].glob("cells/builtin-dflash-*/summary.json")).read_text()) if made else {}
    tau, client = s.get("acceptance_length"), s.get("acceptance_length_client")
    ok = proc.returncode == 0 and s.get("acceptance_definition") == 2 and tau and client and client <= tau * 1.001
    return Row("tau: one definition, a client-side check", "definition 2 on the cell; the stream's tau at or below "
               "the counters' (it counts steps that drafted nothing too)",
               f"tau {tau}, from the stream {client}, definition {s.get('acceptance_definition')}", dt,
               left_behind(out), bool(ok))


@case
def llamacpp_settings(tmp: Path, data: Path) -> Row:
    """llama.cpp: f32 GGUF on the CPU, a server per concurrency with its slots, another llama-server refused."""
    from dflash_bench.errors import UserError
    from dflash_bench.llamacpp.build import source_tree
    from dflash_bench.profiles import get
    from dflash_bench.profiles.llamacpp import gguf_dtype
    from dflash_bench.store import SweepSettings
    from dflash_bench.sweep.plan import launches, plan_cells

    os.environ.pop("DFLASH_BENCH_GGUF_TYPE", None)
    settings = SweepSettings(model="Qwen3-8B", engines=["llamacpp"], suites=["gsm8k"], concurrency=[1, 4])
    slots = sorted(x.slots or 0 for x in launches(plan_cells(settings)))
    fake = tmp / "bin" / "llama-server"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\necho 'version: 1 (0000000)' >&2\n")
    fake.chmod(0o755)
    refused = "no tree to compare with"
    if source_tree() is not None:
        path = os.environ["PATH"]
        os.environ["PATH"] = f"{fake.parent}{os.pathsep}{path}"
        try:
            get("llamacpp").process_argv(["llama-server", "-m", "x.gguf"])
            refused = "used"
        except UserError as err:
            refused = f"refused: {str(err)[:70]}"
        finally:
            os.environ["PATH"] = path
    ok = gguf_dtype("generic") == "f32" and slots == [1, 1, 4, 4] and refused.startswith("refused")
    return Row("llama.cpp settings", "GGUF f32 on the CPU; a server per (mode, concurrency) with its slots; "
               "another llama-server version refused", f"GGUF {gguf_dtype('generic')}; slots {slots}; {refused}",
               None, "nothing", ok)


@case
def short_cell_energy(tmp: Path, data: Path) -> Row:
    """A cell too short for its energy source is invalid with no J/token; --min-cell-seconds makes it valid
    (a fake NVML whose counter steps every 100 ms; the emulator serves the load)."""
    from dflash_bench.client.cell import measure
    from dflash_bench.client.loadgen import LoadSettings
    from dflash_bench.client.protocol import RequestSettings
    from dflash_bench.client.summary import summarize_cell
    from dflash_bench.emulator import EmulatorProcess
    from dflash_bench.telemetry import TelemetrySampler

    saved = sys.modules.get("pynvml")
    sys.modules["pynvml"] = FakeNvml()  # type: ignore[assignment]
    prompts = [SimpleNamespace(id=f"p{i}", turns=[f"prompt {i}"]) for i in range(4)]
    got = {}
    t0 = time.perf_counter()
    try:
        with EmulatorProcess(mode="ar", ttft_ms=1, itl_ms=1, output_len=8) as em:
            for name, seconds in (("short", 0.0), ("lengthened", 2.0)):
                m = measure(em.url, prompts, RequestSettings(max_tokens=8),
                            LoadSettings(concurrency=2, min_seconds=seconds), TelemetrySampler([0], interval_s=0.1))
                got[name] = summarize_cell(m, cell_id=name, engine="emulator", mode="ar", suite="s", concurrency=2)
    finally:
        if saved is None:
            sys.modules.pop("pynvml", None)
        else:
            sys.modules["pynvml"] = saved
    short, long = got["short"], got["lengthened"]
    ok = (short.duration_s >= 1.0 or (not short.energy_valid and short.j_per_token is None)) and \
        bool(long.energy_valid) and long.j_per_token is not None
    return Row("a cell too short for its energy source", "invalid with the reason, no J/token; --min-cell-seconds 2 "
               "makes it measurable", f"short ({short.duration_s:.2f} s): valid {short.energy_valid}, "
               f"{(short.energy_note or '')[:60]}; lengthened ({long.duration_s:.2f} s): {long.energy_source}, "
               f"{long.j_per_token and round(long.j_per_token, 3)} J/token", time.perf_counter() - t0, "nothing", ok)


@case
def connect_delayed_accept(tmp: Path, data: Path) -> Row:
    """The kernel's handshake apart from the wait for the accept and the event loop."""
    from dflash_bench.client.loadgen import LoadGenerator, LoadSettings
    from dflash_bench.client.protocol import RequestSettings
    from dflash_bench.client.rawhttp import RawTransport

    async def go(url: str):
        tr = RawTransport(url, 4)
        try:
            gen = LoadGenerator(tr, RequestSettings(max_tokens=8), LoadSettings(concurrency=4, warmup=False))
            return await gen.run([SimpleNamespace(id=f"p{i}", turns=[f"prompt {i}"]) for i in range(8)])
        finally:
            await tr.close()

    with BadServer("plain", accept_delay_s=0.5) as srv:
        res = asyncio.run(go(srv.url))
        accepted = sorted(srv.accepted)
    new = [r for r in res.records if r.connection == "new"]
    said = all(r.connection in ("new", "reused") for r in res.records)
    shake = max((r.connect_ms or 0.0) for r in new) if new else None
    first_write = min(res.t0 + r.t_write for r in new) if new else 0.0
    ok = said and bool(new) and all(r.connect_ms is not None for r in new) and accepted and first_write < accepted[-1]
    return Row("connect against a server that accepts 0.5 s late", "handshake (kernel) apart from the wait; each "
               "request new or reused", f"{len(new)} new, {len(res.records) - len(new)} reused; longest handshake "
               f"{shake} ms; longest loop wait {max((r.connect_wait_ms or 0) for r in new):.2f} ms", None, "nothing",
               bool(ok))

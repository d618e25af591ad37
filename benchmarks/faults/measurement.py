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
    from dflash_bench.llamacpp.server_build import source_tree
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


# ---------------------------------------------------------------- hostile streams


LONG_LINE = 50 * 10**6  # the line of the hostile stream: 50 MB without a line end


@case
def hostile_streams(tmp: Path, data: Path) -> Row:
    """A 50 MB SSE line (one HTTP chunk) and a 200 answer of an HTML page, through each transport; the client runs
    in a child process (the server's 50 MB are not counted), which says its request's failure, the seconds to it,
    and the most memory the request held (`stream_probe`)."""
    from dflash_bench.http_limits import MAX_LINE_BYTES

    got, bad = [], []
    for kind, line in (("long-line", LONG_LINE), ("html", 0)):
        with BadServer(kind, line_bytes=line) as srv:
            for transport in ("raw", "aiohttp", "httpx"):
                proc, _ = sh([sys.executable, "-c", f"from benchmarks.faults.measurement import stream_probe; "
                              f"stream_probe({srv.url!r}, {transport!r})"], timeout=300)
                try:
                    out = json.loads(proc.stdout.strip().splitlines()[-1])
                except (IndexError, ValueError):
                    bad.append(f"{kind} {transport}: exit {proc.returncode} {proc.stderr.strip()[-120:]}")
                    continue
                want = "stream line too long" if kind == "long-line" else "not an event stream"
                if not (out["error"] or "").startswith(want) or out["peak_mib"] > 4 * MAX_LINE_BYTES / 2**20:
                    bad.append(f"{kind} {transport}: {out}")
                got.append(f"{kind} {transport} {out['seconds']:.2f} s {out['peak_mib']:.1f} MiB")
    return Row("a 50 MB SSE line, and a 200 HTML page, per transport", f"the request fails in one sentence (a line "
               f"past {MAX_LINE_BYTES >> 20} MiB; the content type named); the request holds less than 4x the limit",
               "; ".join(got) + (f"; broke: {bad[0][:120]}" if bad else ""), None, "nothing", not bad)


def stream_probe(url: str, transport: str) -> None:
    """One streamed chat request to `url` through `transport`, in this process (hostile_streams' child): prints, as
    JSON, the request's error, the seconds from its first byte of body (else from sending it) to its end, so that
    the server's own time to make its answer is left out, and the most memory Python held for it
    above what it held before (tracemalloc's peak: every bytes object a transport reads into is counted), in MiB."""
    import tracemalloc

    from dflash_bench.client.protocol import PATHS, RequestSettings, Stream, build_body
    from dflash_bench.client.transport import make_transport

    async def go() -> tuple[str | None, float, int]:
        tr = make_transport(transport, url, 1)
        try:
            await tr.get("/v1/models")  # the connection and the transport's imports, before the peak is read
            st, body = Stream("chat", False), build_body(RequestSettings(max_tokens=8), [{"role": "user", "content": "x"}])
            tracemalloc.start()
            before, t = tracemalloc.get_traced_memory()[0], time.perf_counter()
            await asyncio.wait_for(tr.stream(PATHS["chat"], body, st), 240)
            seconds, peak = time.perf_counter() - (st.t_first_byte or t), tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            return st.error, seconds, peak - before
        finally:
            await tr.close()

    error, seconds, held = asyncio.run(go())
    print(json.dumps({"error": error, "seconds": round(seconds, 3), "peak_mib": round(held / 2**20, 1)}))

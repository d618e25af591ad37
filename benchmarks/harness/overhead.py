"""What the harness itself costs: client CPU per output token, the token rate it sustains, and how far its
TTFT timestamps sit from the packets on the wire.

    python -m benchmarks.harness.overhead [--concurrency 1,8,32,128,512] [--transports aiohttp,httpx]
                                          [--wire 1,32,256] [--out results.json]

1. CPU: an AR emulator with instant tokens (TTFT 0, step 0: one token per chunk, as fast as it can write)
   in a child process; the load generator runs in this process. Reported per transport and concurrency:
   client CPU (time.process_time over the measured window) per output token, the emulator's CPU per token
   (from /proc), and the output tokens/s reached. On a 2-core machine the two processes get one core
   each, so the rate is bound by whichever costs more per token.
2. Wire: tcpdump on loopback (needs root and tcpdump) records every packet; for each request, the wire TTFT
   is the first server packet carrying `"completion_tokens":1,` minus the packet carrying `POST`, both on
   the request's connection. The client's TTFT minus the wire TTFT is how late its timestamps are (send
   stamped before the write, first token stamped after the read: both make the client's TTFT longer).
   Run against a paced emulator (TTFT 20 ms, 5 ms steps, 16 tokens) and against instant tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import statistics
import struct
import subprocess
import tempfile
import time
from pathlib import Path

from dflash_bench.client.loadgen import LoadGenerator, LoadSettings
from dflash_bench.client.protocol import RequestSettings
from dflash_bench.client.transport import make_transport
from dflash_bench.emulator import EmulatorProcess


class Prompt:
    def __init__(self, i: int):
        self.id = f"bench/{i}"
        self.turns = [f"benchmark prompt {i:06d} marker"]
        self.suite = "bench"


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def load(url: str, transport: str, concurrency: int, n: int, max_tokens: int) -> dict:
    tr = make_transport(transport, url, concurrency + 2)
    marks: dict = {}

    async def start() -> None:
        marks["cpu0"], marks["t0"] = time.process_time(), time.perf_counter()

    gen = LoadGenerator(tr, RequestSettings(api="chat", model="emulator", max_tokens=max_tokens),
                        LoadSettings(concurrency=concurrency, warmup=True, timeout=300), between=start)
    try:
        res = await gen.run([Prompt(i) for i in range(n)])
    finally:
        await tr.close()
    cpu, wall = time.process_time() - marks["cpu0"], time.perf_counter() - marks["t0"]
    recs = [r for r in res.records if not r.warmup]
    tokens = sum(r.output_tokens or 0 for r in recs if r.ok)
    return {"records": recs, "client_cpu_s": cpu, "wall_s": wall, "tokens": tokens,
            "failed": sum(1 for r in recs if not r.ok)}


def cpu_table(concurrencies: list[int], transports: list[str], tokens_per_request: int) -> list[dict]:
    rows = []
    for tr in transports:
        for c in concurrencies:
            n = max(2 * c, 48)
            with EmulatorProcess(mode="ar", ttft_ms=0, itl_ms=0, output_len=tokens_per_request) as em:
                e0 = proc_cpu_s(em.proc.pid)
                out = asyncio.run(load(em.url, tr, c, n, 4 * tokens_per_request))
                # the emulator's CPU includes the warm-up; per token it is still a fair bound
                em_cpu = proc_cpu_s(em.proc.pid) - e0
            rows.append({"transport": tr, "concurrency": c, "requests": n, "tokens": out["tokens"],
                         "failed": out["failed"], "client_us_per_token": 1e6 * out["client_cpu_s"] / out["tokens"],
                         "emulator_us_per_token": 1e6 * em_cpu / out["tokens"],
                         "tok_per_s": out["tokens"] / out["wall_s"]})
            print(json.dumps(rows[-1]), flush=True)
    return rows


# ---------------------------------------------------------------- pcap


def read_pcap(path: Path) -> list[tuple[float, int, int, bytes]]:
    """(time, src port, dst port, tcp payload) of every IPv4 TCP packet with a payload."""
    data = path.read_bytes()
    magic = struct.unpack("<I", data[:4])[0]
    endian, nano = {0xA1B2C3D4: ("<", False), 0xA1B23C4D: ("<", True),
                    0xD4C3B2A1: (">", False), 0x4D3CB2A1: (">", True)}[magic]
    linktype = struct.unpack(endian + "I", data[20:24])[0]
    l2 = {1: 14, 0: 4, 113: 16, 276: 20, 101: 0}[linktype]
    out, off = [], 24
    while off + 16 <= len(data):
        sec, frac, caplen, _ = struct.unpack(endian + "IIII", data[off:off + 16])
        pkt = data[off + 16: off + 16 + caplen]
        off += 16 + caplen
        ip = pkt[l2:]
        if len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != 6:
            continue
        ihl = (ip[0] & 15) * 4
        total = struct.unpack(">H", ip[2:4])[0]
        tcp = ip[ihl:total]
        sport, dport = struct.unpack(">HH", tcp[:4])
        payload = tcp[(tcp[12] >> 4) * 4:]
        if payload:
            out.append((sec + frac / (1e9 if nano else 1e6), sport, dport, payload))
    return out


def wire_ttfts(packets: list, server_port: int) -> dict[str, float]:
    """prompt marker -> wire TTFT (s): POST packet to the first server packet carrying the first token."""
    conns: dict[int, list] = {}
    for t, sp, dp, pl in packets:
        client = dp if sp == server_port else sp
        conns.setdefault(client, []).append((t, sp == server_port, pl))
    out: dict[str, float] = {}
    for pkts in conns.values():
        t_post, marker = None, None
        for t, from_server, pl in pkts:
            if not from_server:
                if pl.startswith(b"POST "):
                    t_post, marker = t, None
                i = pl.find(b"benchmark prompt ")
                if i >= 0 and b"(warm-up" not in pl:  # warm-ups reuse the measured prompts' text
                    marker = pl[i + 17: i + 23].decode()
            elif t_post is not None and marker and b'"completion_tokens":1,' in pl:
                out.setdefault(marker, t - t_post)
                t_post = None
    return out


def wire_table(concurrencies: list[int], paced: bool, transport: str, tcpdump_cpu: str | None) -> list[dict]:
    if not shutil.which(os.environ.get("TCPDUMP", "tcpdump")) or os.geteuid() != 0:
        print("tcpdump (as root) not available: skipping the wire comparison")
        return []
    rows = []
    opts = dict(mode="ar", ttft_ms=20, itl_ms=5, output_len=16) if paced else dict(mode="ar", ttft_ms=0, itl_ms=0, output_len=64)
    for c in concurrencies:
        with tempfile.TemporaryDirectory() as tmp, EmulatorProcess(**opts) as em:
            port = int(em.url.rsplit(":", 1)[1])
            pcap = Path(tmp) / "lo.pcap"
            pin = ["taskset", "-c", tcpdump_cpu] if tcpdump_cpu else []
            dump = subprocess.Popen(pin + [os.environ.get("TCPDUMP", "tcpdump"), "-i", "lo", "-s", "0", "-B", "262144", "-U", "-n", "-Z", "root", "--immediate-mode",
                                     "--time-stamp-precision=nano", "-w", str(pcap), f"tcp port {port}"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            first = dump.stderr.readline()  # "listening on lo ..."
            if "listening" not in first:
                dump.kill()
                print(f"tcpdump did not start: {first.strip()}: skipping the wire comparison")
                return rows
            try:
                time.sleep(0.3)
                out = asyncio.run(load(em.url, transport, c, max(2 * c, 32), 256))
                time.sleep(1.0)  # let tcpdump drain its buffer: SIGINT drops what it has not read
            finally:
                dump.send_signal(signal.SIGINT)
                dump.wait(10)
            wire = wire_ttfts(read_pcap(pcap), port)
        lags = []
        for r in out["records"]:
            key = r.prompt_id.split("/")[1].zfill(6)
            if r.ok and key in wire:
                lags.append(1000 * ((r.t_first_token - r.t_send) - wire[key]))
        lags.sort()
        rows.append({"transport": transport, "server": "paced" if paced else "instant", "concurrency": c, "matched": len(lags),
                     "requests": len(out["records"]), "tok_per_s": out["tokens"] / out["wall_s"],
                     "lag_ms_mean": statistics.mean(lags), "lag_ms_p50": lags[len(lags) // 2],
                     "lag_ms_p99": lags[min(len(lags) - 1, int(0.99 * len(lags)))], "lag_ms_max": lags[-1]})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", default="1,8,32,128,512")
    ap.add_argument("--transports", default="raw,aiohttp,httpx")
    ap.add_argument("--tokens", type=int, default=256, help="mean output tokens per request in the CPU runs")
    ap.add_argument("--wire", default="1,32,256", help="concurrencies of the tcpdump comparison ('' to skip)")
    ap.add_argument("--wire-transports", default="raw,aiohttp", help="transports of the tcpdump comparison")
    ap.add_argument("--tcpdump-cpu", default=None, help="pin tcpdump to these CPUs (taskset -c), away from the client")
    ap.add_argument("--out", type=Path, default=None, help="write all rows as JSON here")
    a = ap.parse_args()
    cs = [int(x) for x in a.concurrency.split(",") if x]
    result = {"machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                          "python": platform.python_version()},
              "cpu": cpu_table(cs, a.transports.split(","), a.tokens)}
    wc = [int(x) for x in a.wire.split(",") if x]
    result["wire"] = []
    for tr in a.wire_transports.split(",") if wc else []:
        for paced in (True, False):
            result["wire"] += wire_table(wc, paced, tr, a.tcpdump_cpu)
    if a.out:
        a.out.write_text(json.dumps(result, indent=2))
    print("\n| transport | concurrency | client CPU µs/token | emulator CPU µs/token | output tok/s |")
    print("|---|---:|---:|---:|---:|")
    for r in result["cpu"]:
        print(f"| {r['transport']} | {r['concurrency']} | {r['client_us_per_token']:.1f} | "
              f"{r['emulator_us_per_token']:.1f} | {r['tok_per_s']:,.0f} |")
    if result["wire"]:
        print("\n| transport | server | concurrency | requests matched | TTFT lag mean ms | p50 | p99 | max |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for r in result["wire"]:
            print(f"| {r['transport']} | {r['server']} | {r['concurrency']} | {r['matched']}/{r['requests']} | {r['lag_ms_mean']:.3f} | "
                  f"{r['lag_ms_p50']:.3f} | {r['lag_ms_p99']:.3f} | {r['lag_ms_max']:.3f} |")


if __name__ == "__main__":
    main()

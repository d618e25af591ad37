"""The client against uvicorn (the HTTP server vLLM, SGLang and the builtin engine run on): chunked SSE
whose events arrive split across writes and batched several to a write, keep-alive, Content-Length bodies."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("uvicorn")

from dflash_bench.client import measure_cell  # noqa: E402
from dflash_bench.store import SweepDir  # noqa: E402
from benchmarks.fixtures.emulator_truth import prompts  # noqa: E402

TOKENS = 6


def _event(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def app(scope, receive, send):  # a vLLM-shaped ASGI app
    if scope["type"] != "http":
        return
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    path = scope["path"]
    if path in ("/v1/models", "/metrics"):
        payload = (json.dumps({"data": [{"id": "tiny"}]}).encode() if path == "/v1/models" else
                   b"# TYPE vllm:spec_decode_num_drafts_total counter\nvllm:spec_decode_num_drafts_total 0.0\n")
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})
        return
    prompt = json.loads(body)["messages"][-1]["content"]
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    events = [_event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
                      "usage": {"prompt_tokens": 3, "completion_tokens": 0}})]
    for i in range(1, TOKENS + 1):
        events.append(_event({"choices": [{"index": 0, "delta": {"content": f" {prompt[-2:]}{i}"},
                                           "finish_reason": "stop" if i == TOKENS else None}],
                              "usage": {"prompt_tokens": 3, "completion_tokens": i}}))
    events.append(_event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": TOKENS}}))
    events.append(b"data: [DONE]\n\n")
    held = b""
    for i, ev in enumerate(events):
        ev, held = held + ev, b""
        if i % 3 == 1:  # split an event across two writes
            await send({"type": "http.response.body", "body": ev[:7], "more_body": True})
            await asyncio.sleep(0.002)
            await send({"type": "http.response.body", "body": ev[7:], "more_body": True})
        elif i % 3 == 2 and i + 1 < len(events):  # hold it: two events go in the next write
            held = ev
            continue
        else:
            await send({"type": "http.response.body", "body": ev, "more_body": True})
        await asyncio.sleep(0.001)
    await send({"type": "http.response.body", "body": b"", "more_body": False})


@pytest.fixture(scope="module")
def uvicorn_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "test_client_uvicorn:app", "--app-dir",
                             str(Path(__file__).parent), "--port", str(port), "--log-level", "warning"])
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), 0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize("transport", ["raw", "aiohttp"])
def test_streams_from_uvicorn(tmp_path: Path, uvicorn_url: str, transport: str):
    ps = prompts(12)
    s = measure_cell(uvicorn_url, ps, concurrency=4, cell_dir=tmp_path / "sw" / "cells" / "c", transport=transport)
    assert s.num_ok == 12 and s.total_output_tokens == 12 * TOKENS and s.settings.model == "tiny"
    assert s.tokens_per_chunk.mean == 1.0 and s.acceptance_length is None
    for r in SweepDir(tmp_path / "sw").read_requests("c"):
        if not r.warmup:
            prompt = next(p for p in ps if p.id == r.prompt_id).turns[0]
            assert r.output_text == "".join(f" {prompt[-2:]}{i}" for i in range(1, TOKENS + 1))
            assert r.chunk_tokens == list(range(1, TOKENS + 1)) and r.finish_reason == "stop"

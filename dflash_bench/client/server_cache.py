"""Emptying a server's prefix cache before a cell (`EngineProfile.cache_reset`: vLLM's POST /reset_prefix_cache,
which the builtin engine and the emulator serve too, SGLang's POST /flush_cache, llama.cpp's POST
/slots/N?action=erase for each slot N).

A sweep's cells send the suite's first prompts at every concurrency: c=32's 32 first prompts include c=8's 8 and
c=1's one. A server that keeps prompts cached (vLLM's automatic prefix caching and SGLang's radix cache are on by
default) would serve those from the cache and skip their prefill, so a later cell's first tokens would come
sooner than on a fresh server, and sooner than on an engine that caches nothing between requests: the comparison
would reward the harness's order, not the engine. Within a cell the cache still works as a
user would see it (a conversation's second turn finds its first, the cell's hit rate says how much:
metrics/cache.py). The cell records what was done, never fails for it: a server that will not empty its cache is
measured as it is, the cell saying why it was not emptied.

llama.cpp has a server per concurrency, but it serves that concurrency's every suite, repeat and --thinking value:
a repeat would find all its prompts cached. Erasing its slots leaves the prompts it moved to host memory
(--cache-ram), so a sweep launches it with that cache off (`cache_reset_flags`); within a cell each slot still
keeps its last prompt, as llama.cpp serves a conversation's next turn. A user's --engine-arg that turns it on
again wins, and then no cell says its cache was emptied (`EngineProfile.cache_left`).
"""

from __future__ import annotations

import json
import time

import httpx

from dflash_bench.http_limits import get_capped

TRIES = 3  # vLLM answers {"success": false} while blocks are held (a request still finishing): tried again
RETRY_S = 0.5
TIMEOUT_S = 30.0  # the most one POST may take (a cell's request timeout, where shorter): emptying is a quick call


def empty_prefix_cache(url: str, path: str, timeout: float | None, left: str | None = None) -> str:
    """POST `path` to the server at `url` (a path holding "{slot}": once for each slot its GET /slots lists), over
    one connection; what came of it as the cell records it: "emptied (POST PATH)", or "not emptied: WHY". `left`:
    why the server keeps prompts that the POST leaves (`EngineProfile.cache_left`), said in place of "emptied"."""
    said = _empty(url, path, timeout)
    if left is None or not said.startswith("emptied"):
        return said
    return f"not emptied: {left} (sent {said.removeprefix('emptied (')}"


def _empty(url: str, path: str, timeout: float | None) -> str:
    with httpx.Client(base_url=url, timeout=min(timeout or TIMEOUT_S, TIMEOUT_S)) as client:
        if "{slot}" not in path:
            return _post(client, path)
        try:
            status, body = get_capped(client, "/slots")
            if status != 200:
                raise ValueError(f"HTTP {status}")
            slots = [int(s["id"]) for s in json.loads(body)]
        except (httpx.HTTPError, ValueError, TypeError, KeyError) as err:  # BodyTooLong is a ValueError
            return f"not emptied: GET /slots did not list the slots ({type(err).__name__}: {err})"
        for slot in slots:
            said = _post(client, path.format(slot=slot))
            if not said.startswith("emptied"):
                return said
    return f"emptied (POST {path} for each of the {len(slots)} slots)"


def _post(client: httpx.Client, path: str) -> str:
    """One POST of `path`, tried again while the server says it did not empty; as `empty_prefix_cache` says it."""
    why = ""
    for attempt in range(TRIES):
        if attempt:
            time.sleep(RETRY_S)
        try:
            r = client.post(path)
        except httpx.HTTPError as err:
            return f"not emptied: POST {path} failed ({type(err).__name__}: {err})"
        if r.status_code == 404:  # the sweep launched it with the route's environment (cache_reset_env): an older engine
            return f"not emptied: the server has no POST {path} (HTTP 404)"
        if r.status_code == 200 and _succeeded(r):
            return f"emptied (POST {path})"
        text = r.text.strip()
        why = f"HTTP {r.status_code}: {text[:200]}" if text else f"HTTP {r.status_code}"
    return f"not emptied: POST {path} answered {why} after {TRIES} tries"


def _succeeded(r: httpx.Response) -> bool:
    """vLLM says {"success": bool}; SGLang answers 200 with a sentence when it flushed, 400 when it did not."""
    try:
        body = r.json()
    except ValueError:
        return True
    return not (isinstance(body, dict) and body.get("success") is False)

"""The builtin engine's KV pool as its /metrics says (`dflash_bench:max_slots`), and the harness's refusal of a
concurrency beyond it: requests past the pool wait in the server's queue, so such a cell would not measure the
concurrency it names. Servers that do not say (vLLM, SGLang, llama.cpp, the emulator) are not checked."""

from __future__ import annotations

import httpx

from dflash_bench.errors import UserError
from dflash_bench.http_limits import get_capped

SLOTS_GAUGE = "dflash_bench:max_slots"


def server_slots(url: str, timeout: float | None) -> int | None:
    """The slots the server's /metrics reports, or None when it reports none (or cannot be read)."""
    from dflash_bench.metrics.prometheus import parse

    try:
        with httpx.Client(timeout=timeout) as client:
            status, body = get_capped(client, url.rstrip("/") + "/metrics")
        if status != 200:
            return None
        gauges = parse(body.decode("utf-8", "replace"))["gauges"]
    except (httpx.HTTPError, ValueError):  # BodyTooLong among them: past the client's limit the cell's scrape says so
        return None
    values = [v for k, v in gauges.items() if k == SLOTS_GAUGE or k.startswith(SLOTS_GAUGE + "{")]
    return int(values[0]) if values else None


def check_slots(url: str, concurrency: int, timeout: float | None) -> None:
    """Refuse, in one sentence, a concurrency the server's KV pool cannot decode together."""
    slots = server_slots(url, timeout)
    if slots is not None and concurrency > slots:
        raise UserError(f"the server at {url} decodes at most {slots} requests together (its KV pool, --max-slots); "
                        f"at --concurrency {concurrency} the other {concurrency - slots} would wait in its queue, so "
                        "the cell would not measure that concurrency: lower --concurrency, or serve with more slots "
                        "(more memory for the pool, or a shorter --max-model-len)")

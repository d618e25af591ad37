"""Two clients read one tau from the builtin server, and the fallback warning follows the tau definition.

vLLM's `vllm bench serve` reads tau from the server's /metrics before and after its requests (its
`fetch_spec_decode_metrics`, restated below as `vllm_bench_serve_tau`: every line starting `vllm:spec_decode`,
summed by substring of the name, then 1 + d(accepted) / d(drafts)). On the same requests dflash-bench must read the
same tau, and the builtin engine's counters must mean what vLLM's mean: num_drafts the verify steps,
num_draft_tokens the draft positions they checked, num_accepted_tokens the drafts they committed, per position
the drafts that accepted that far."""

from __future__ import annotations


import httpx
import pytest

pytest.importorskip("transformers")

from dflash_bench.client import measure_cell  # noqa: E402
from benchmarks.fixtures.emulator_truth import P  # noqa: E402
from test_engine_server import cli_server  # noqa: E402

from test_tau_width import PAIR, TEXTS  # noqa: E402  (the embedded pair and the questions both files ask)

pytestmark = pytest.mark.engine


def vllm_spec_counters(text: str) -> dict:
    """vLLM's bench serve's reading of /metrics (vllm/benchmarks/serve.py fetch_spec_decode_metrics), restated."""
    out: dict = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "per_pos": {}}
    for line in text.split("\n"):
        line = line.strip()
        if not line or line.startswith("#") or not line.startswith("vllm:spec_decode"):
            continue
        value = int(float(line.split()[-1]))
        if "num_drafts" in line:
            out["num_drafts"] += value
        elif "num_draft_tokens" in line:
            out["num_draft_tokens"] += value
        elif "num_accepted_tokens_per_pos" in line:
            pos = int(line.split('position="', 1)[1].split('"', 1)[0])
            out["per_pos"][pos] = out["per_pos"].get(pos, 0) + value
        elif "num_accepted_tokens" in line:
            out["num_accepted_tokens"] += value
    return out


def vllm_bench_serve_tau(before: dict, after: dict) -> tuple[float, dict]:
    """spec_decode_acceptance_length = 1 + d(num_accepted_tokens) / d(num_drafts), and the deltas."""
    d = {k: after[k] - before[k] for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}
    d["per_pos"] = {i: after["per_pos"][i] - before["per_pos"].get(i, 0) for i in after["per_pos"]}
    return 1 + d["num_accepted_tokens"] / d["num_drafts"], d


def prompts(n: int) -> list[P]:
    return [P(f"tau/{i}", [TEXTS[i % len(TEXTS)]]) for i in range(n)]


@pytest.fixture(scope="module")
def server():
    with cli_server("--model", str(PAIR / "target"), "--draft", str(PAIR / "drafter"), "--served-model-name", "pair",
                    "--fast") as url:
        yield url


@pytest.mark.parametrize("concurrency", [1, 3])
def test_vllms_formula_and_dflash_bench_read_one_tau_on_the_same_requests(server, tmp_path, concurrency):
    before = vllm_spec_counters(httpx.get(server + "/metrics").text)
    s = measure_cell(server, prompts(6), cell_dir=tmp_path / "sw" / "cells" / "c", concurrency=concurrency,
                     engine="builtin", mode="dflash", model="pair", max_tokens=40, warmup=False)
    tau, d = vllm_bench_serve_tau(before, vllm_spec_counters(httpx.get(server + "/metrics").text))
    assert s.status == "complete" and s.num_ok == 6 and s.acceptance_length is not None
    assert abs(s.acceptance_length / tau - 1) < 0.01, (s.acceptance_length, tau)
    # the counters mean vLLM's: drafts and draft tokens as dflash-bench read them, accepted per position summing to
    # the accepted tokens and falling with the position; the profile's first position verified by every draft
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (d["num_drafts"], d["num_draft_tokens"],
                                                                         d["num_accepted_tokens"])
    per_pos = [d["per_pos"][i] for i in sorted(d["per_pos"])]
    assert sum(per_pos) == d["num_accepted_tokens"] and per_pos == sorted(per_pos, reverse=True)
    assert s.width_policy == "auto" and s.verify_widths and s.acceptance_profile
    verified = [v for v, _ in s.acceptance_profile]
    assert verified[0] == d["num_drafts"] and sum(verified) == d["num_draft_tokens"]
    assert [a for _, a in s.acceptance_profile] == per_pos


@pytest.fixture(scope="module")
def full_server():
    """At the full block: every step with room drafts (under auto, a CPU may choose to verify the anchor alone)."""
    with cli_server("--model", str(PAIR / "target"), "--draft", str(PAIR / "drafter"), "--served-model-name", "pair",
                    "--fast", "--verify-width", "full") as url:
        yield url


def test_no_fallback_warning_where_max_tokens_leaves_no_room_for_a_verify_step(full_server, tmp_path):
    server = full_server
    s = measure_cell(server, prompts(2), cell_dir=tmp_path / "sw" / "cells" / "c", concurrency=1, engine="builtin",
                     mode="dflash", model="pair", max_tokens=2, warmup=False, ignore_eos=True)
    assert s.status == "complete" and s.num_ok == 2 and s.acceptance_length is None
    assert s.dflash_warning is None and "no room for a verify step" in s.not_measured["acceptance_length"]
    three = measure_cell(server, prompts(2), cell_dir=tmp_path / "sw" / "cells" / "d", concurrency=1,
                         engine="builtin", mode="dflash", model="pair", max_tokens=3, warmup=False, ignore_eos=True)
    assert three.num_drafts == 2 and three.acceptance_length is not None and three.dflash_warning is None


def test_at_max_tokens_3_a_server_that_never_drafts_is_flagged(tmp_path):
    with cli_server("--model", str(PAIR / "target"), "--draft", str(PAIR / "drafter"), "--served-model-name", "pair",
                    "--fast", "--verify-width", "1") as url:
        s = measure_cell(url, prompts(2), cell_dir=tmp_path / "sw" / "cells" / "c", concurrency=1, engine="builtin",
                         mode="dflash", model="pair", max_tokens=3, warmup=False, ignore_eos=True)
        text = httpx.get(url + "/metrics").text
    assert 'policy="w1"' in text
    assert s.acceptance_length is None and "did not move" in s.dflash_warning
    assert "acceptance_length" not in s.not_measured


def test_served_at_the_full_block_tau_is_the_same_at_every_concurrency(full_server, tmp_path):
    """Through the server (admissions mid-decode, steps ahead): the widths no longer follow the load, so neither
    does tau; the cell records the policy, one width and the profile."""
    cells = [measure_cell(full_server, prompts(6), cell_dir=tmp_path / "sw" / "cells" / f"c{c}", concurrency=c,
                          engine="builtin", mode="dflash", model="pair", max_tokens=40, warmup=False,
                          ignore_eos=True) for c in (1, 3, 6)]
    taus = {(s.num_drafts, s.num_accepted_tokens) for s in cells}
    assert len(taus) == 1 and cells[0].acceptance_length > 1.5, [s.acceptance_length for s in cells]
    for s in cells:
        assert s.width_policy == "full" and len(s.verify_widths) == 1 and s.acceptance_profile[0][0] == s.num_drafts
        # a request's last steps verify only the positions max_tokens leaves: the profile's full-block tau (every
        # step with room for the whole block) reads above the cell's
        assert s.acceptance_length_full_block >= s.acceptance_length

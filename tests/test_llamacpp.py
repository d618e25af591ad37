"""llama.cpp's llama-server, a third-party DFlash engine, through `dflash-bench sweep` on the embedded pair.

One sweep (module fixture): engines llamacpp and builtin, AR and DFlash, two suites, concurrency 1 and 4,
token ids saved, the GGUF type left to follow the builtin engine's (f32 on the CPU). Then:
- every cell completes; llama.cpp's tau comes from its own /metrics counters (`llamacpp:spec_decode_*`) and
  is within 10% of the builtin engine's tau on the same prompts;
- on the requests whose text both engines produced alike, the two taus agree within TAU_SAME_TEXT
  (metrics/definitions.py: committed tokens per verify step, nothing past the request's end);
- each llama.cpp cell ran on its own server with --parallel = its concurrency and a context per slot, and the
  manifest records the GGUF type;
- llama.cpp's AR and DFlash outputs agree on every request at concurrency 1 and 4, compared as text because
  llama-server reports no ids for accepted draft tokens;
- the counters agree with the per-response `timings` (draft_n / draft_n_accepted) on a server launched
  here;
- each request's usage says the prompt tokens llama.cpp read from its cache (the builtin engine: 0), and each
  llama.cpp cell's server had every slot erased before it (one server serves both suites of a concurrency);
- a server launched as a sweep launches it keeps nothing from one cell to the next, where one launched as
  `dflash-bench launch` does keeps every prompt (its host-memory cache).
Skips when llama-server is neither on PATH nor built, unless DFLASH_BENCH_REQUIRE_LLAMACPP=1 (CI), where
that absence fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from services import service_missing

from dflash_bench.launch import free_port, launch_server
from dflash_bench.llamacpp.server_build import find_server
from dflash_bench.metrics import prometheus
from dflash_bench.models import resolve
from dflash_bench.quality.lossless import read_comparisons
from dflash_bench.store import SweepDir

# The module's sweep (16 cells, 6 launches) runs up to 1500 s on a busy 2-core machine: past pytest's 600 s
pytestmark = pytest.mark.timeout(1800)
PAIR = Path(__file__).resolve().parents[1] / "dflash_bench" / "assets" / "default_pair"
SUITES = ("gsm8k", "mt-bench")
CONCURRENCY = (1, 4)
NUM_PROMPTS, MAX_TOKENS = 8, 64
TAU_TOLERANCE = 0.10
TAU_SAME_TEXT = 0.005
# The sweep leaves the GGUF type to the preset (f32 on the CPU, as the builtin engine); the launches here
# outside a sweep pin it.
ENV = {"DFLASH_BENCH_GGUF_TYPE": "f32"}


@pytest.fixture(scope="module")
def llama_server() -> Path:  # the tests that take it are marked `llamacpp` (conftest.py)
    server = find_server()
    if server is None:
        service_missing("llamacpp", "llama-server is neither on PATH nor built: `dflash-bench engines build llamacpp` builds it")
    return server


@pytest.fixture(scope="module")
def sweep(llama_server, tmp_path_factory, data_dir) -> SweepDir:
    out = tmp_path_factory.mktemp("llamacpp")
    argv = [sys.executable, "-m", "dflash_bench", "sweep", "--model", str(PAIR / "target"),
            "--drafter", str(PAIR / "drafter"), "--engine", "llamacpp,builtin", "--suites", ",".join(SUITES),
            "--concurrency", ",".join(map(str, CONCURRENCY)), "-n", str(NUM_PROMPTS),
            "--max-tokens", str(MAX_TOKENS), "--save-token-ids", "--port", str(free_port()),
            "--out", str(out), "--data-dir", str(data_dir)]
    env = {k: v for k, v in os.environ.items() if k != "DFLASH_BENCH_GGUF_TYPE"}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1500, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    (folder,) = [p for p in out.iterdir() if (p / "manifest.json").exists()]
    return SweepDir.open(folder)


def _summaries(sweep: SweepDir) -> dict[tuple[str, str, str, int], object]:
    manifest = sweep.read_manifest()
    out = {}
    for cell in manifest.plan:
        assert cell.status == "complete", f"{cell.cell_id}: {cell.status} ({cell.reason})"
        s = sweep.read_summary(cell.cell_id)
        out[(cell.engine, cell.mode, cell.suite, cell.concurrency)] = s
    return out


def test_every_cell_completes_and_tau_comes_from_llamacpp_counters(sweep):
    cells = _summaries(sweep)
    assert len(cells) == 2 * 2 * len(SUITES) * len(CONCURRENCY)
    for (engine, mode, suite, conc), s in cells.items():
        assert s.num_ok == s.num_requests and s.num_failed == 0, (engine, mode, suite, conc)
        if mode == "ar":
            assert s.acceptance_length is None  # no draft, no counters moved: absent, never 1
            continue
        assert s.acceptance_source == ("llamacpp-metrics" if engine == "llamacpp" else "builtin-metrics")
        assert s.num_drafts and s.num_drafts > 0 and 1.0 < s.acceptance_length <= 16.0


def test_llamacpp_tau_is_within_ten_percent_of_the_builtin_engine(sweep):
    cells = _summaries(sweep)
    rows = []
    for suite in SUITES:
        for conc in CONCURRENCY:
            ours = cells[("builtin", "dflash", suite, conc)].acceptance_length
            theirs = cells[("llamacpp", "dflash", suite, conc)].acceptance_length
            rows.append((suite, conc, ours, theirs))
    print("\ntau builtin vs llama.cpp: " + "; ".join(f"{s} c{c}: {a:.3f} vs {b:.3f}" for s, c, a, b in rows))
    for suite, conc, ours, theirs in rows:
        assert abs(theirs - ours) <= TAU_TOLERANCE * ours, (suite, conc, ours, theirs)


def _agreement(sweep: SweepDir, engine: str, concurrency: tuple[int, ...] = CONCURRENCY) -> tuple[int, int]:
    """(identical, compared) AR vs DFlash outputs of one engine, paired by prompt and turn; a later turn of
    a conversation that already diverged is not compared (its prompt differs)."""
    identical = total = 0
    for suite in SUITES:
        for conc in concurrency:
            ar, df = ({(r.prompt_id, r.turn): r for r in sweep.read_requests(f"{engine}-{mode}-{suite}-c{conc}")
                       if not r.warmup} for mode in ("ar", "dflash"))
            assert ar.keys() == df.keys()
            diverged = set()
            for pid, turn in sorted(ar):
                if pid in diverged:
                    continue
                same = ar[(pid, turn)].output_text == df[(pid, turn)].output_text
                identical, total = identical + same, total + 1
                if not same:
                    diverged.add(pid)
    return identical, total


def test_llamacpp_ar_and_dflash_agree_token_for_token(sweep):
    # llama-server sends logprobs (token ids) for none of the accepted draft tokens, so its DFlash records
    # carry no ids and the lossless check skips them rather than report a false divergence; the outputs
    # are compared as text, which for one tokenizer and greedy decoding is the same test.
    for suite in SUITES:
        for conc in CONCURRENCY:
            assert read_comparisons(sweep.path, f"llamacpp-dflash-{suite}-c{conc}") == []
            assert all(r.token_ids is None for r in sweep.read_requests(f"llamacpp-dflash-{suite}-c{conc}"))
            assert all(r.token_ids for r in sweep.read_requests(f"llamacpp-ar-{suite}-c{conc}") if not r.warmup)
    alone, batched = _agreement(sweep, "llamacpp", (1,)), _agreement(sweep, "llamacpp", (4,))
    ours = _agreement(sweep, "builtin")
    print(f"\nAR vs DFlash outputs identical, f32: llama.cpp c1 {alone[0]}/{alone[1]}, c4 {batched[0]}/{batched[1]}; "
          f"builtin {ours[0]}/{ours[1]}")
    # f32 on both sides, each slot its own KV cache sized for its cells: every request, alone or batched
    assert alone[0] == alone[1] and batched[0] == batched[1]


def test_tau_agrees_with_the_builtin_engine_on_identical_text(sweep):
    """Where both engines wrote the same text, they committed the same tokens per verify step: tau by the one
    definition (metrics/definitions.py) agrees within TAU_SAME_TEXT, per request from each response's own counts
    (builtin: metrics.speculative_decoding; llama.cpp: timings.draft_n_accepted), as decode steps
    (output - 1) / (output - 1 - accepted) so that both read alike. Before, the builtin engine counted a last
    block's drafts cut at max_tokens: 0.6-4% more."""
    tokens = {"builtin": 0, "llamacpp": 0}
    steps = {"builtin": 0, "llamacpp": 0}
    same = total = 0
    for suite in SUITES:
        for conc in CONCURRENCY:
            cells = {e: {(r.prompt_id, r.turn): r for r in sweep.read_requests(f"{e}-dflash-{suite}-c{conc}")
                         if not r.warmup and r.ok} for e in tokens}
            for key, ours in cells["builtin"].items():
                theirs = cells["llamacpp"].get(key)
                total += 1
                if theirs is None or theirs.output_text != ours.output_text:
                    continue
                same += 1
                for engine, r in (("builtin", ours), ("llamacpp", theirs)):
                    assert r.spec_accepted_tokens is not None, (engine, key)
                    tokens[engine] += r.output_tokens - 1
                    steps[engine] += r.output_tokens - 1 - r.spec_accepted_tokens
    tau = {e: tokens[e] / steps[e] for e in tokens}
    print(f"\ntau on {same}/{total} identical-text requests: builtin {tau['builtin']:.4f}, llama.cpp {tau['llamacpp']:.4f}")
    assert same >= total / 2
    assert abs(tau["llamacpp"] - tau["builtin"]) <= TAU_SAME_TEXT * tau["builtin"]
    for suite in SUITES:  # the client's own check of each cell's tau sits beside the counters'
        for conc in CONCURRENCY:
            for engine, how in (("builtin", "chunks"), ("llamacpp", "timings")):
                s = sweep.read_summary(f"{engine}-dflash-{suite}-c{conc}")
                assert s.acceptance_client_source == how and s.acceptance_length_client > 1.0
                assert s.acceptance_definition == 2


def test_each_llamacpp_cell_ran_with_its_concurrency_as_slots(sweep):
    servers = sweep.read_manifest().servers
    llama = {k: v for k, v in servers.items() if k.startswith("llamacpp-")}
    assert len(llama) == 2 * len(CONCURRENCY)  # a server per (mode, concurrency)
    slots = sorted(int(v.command[v.command.index("--parallel") + 1]) for v in llama.values())
    assert slots == sorted(list(CONCURRENCY) * 2)
    for v in llama.values():
        n, ctx = int(v.command[v.command.index("--parallel") + 1]), int(v.command[v.command.index("-c") + 1])
        assert ctx % n == 0 and ctx // n >= MAX_TOKENS and "--kv-unified" not in v.command
        assert v.weights == "GGUF f32" and any(a.endswith("-f32.gguf") for a in v.command)


def test_a_llama_server_of_another_version_is_refused(llama_server, tmp_path, monkeypatch):
    from dflash_bench import profiles
    from dflash_bench.errors import UserError
    from dflash_bench.llamacpp.server_build import source_tree

    if shutil.which("llama-server") or source_tree() is None:
        pytest.skip("needs the built llama-server and its tree, and no other llama-server on PATH")
    other = tmp_path / "bin" / "llama-server"
    other.parent.mkdir()
    other.write_text("#!/bin/sh\necho 'version: 1 (0000000)' >&2\n")
    other.chmod(0o755)
    monkeypatch.setenv("PATH", f"{other.parent}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(UserError, match="llama-server 1 \\(0000000\\).*GGUF converter is llama.cpp"):
        profiles.get("llamacpp").process_argv(["llama-server", "-m", "x.gguf"])


def test_the_gguf_type_follows_the_builtin_engines_dtype(monkeypatch):
    from dflash_bench.profiles.llamacpp import gguf_dtype

    monkeypatch.delenv("DFLASH_BENCH_GGUF_TYPE", raising=False)
    assert (gguf_dtype("generic"), gguf_dtype("h100")) == ("f32", "bf16")  # CPU float32, GPU bfloat16
    monkeypatch.setenv("DFLASH_BENCH_GGUF_TYPE", "bf16")
    assert gguf_dtype("generic") == "bf16"


def test_every_cell_says_what_the_servers_prefix_caches_held(sweep):
    """llama.cpp says each request's cached prompt tokens in its usage (`prompt_tokens_details`); each of its
    concurrencies runs on a fresh server, so a cell reads from the cache only what its own earlier requests and
    warm-ups left (the chat template's shared start). The builtin engine (its reference path here, which keeps no
    prompts) says 0, and had its cache emptied through its POST /reset_prefix_cache all the same. Both are read
    from the responses."""
    cells = _summaries(sweep)
    for (engine, mode, suite, conc), s in cells.items():
        assert s.prefix_cache_source == "usage", (engine, mode, suite, conc)
        assert s.prefix_cache_reset == ("emptied (POST /reset_prefix_cache)" if engine == "builtin" else
                                        f"emptied (POST /slots/{{slot}}?action=erase for each of the {conc} slots)")
        if engine == "builtin":
            assert s.prefix_cache_hit_rate == 0.0
        else:
            assert s.prefix_cache_hit_rate is not None and 0.0 <= s.prefix_cache_hit_rate < 1.0


def test_counters_agree_with_per_response_timings(llama_server, monkeypatch):
    """The /metrics deltas the harness reads equal the sum of the responses' own draft counts."""
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    pair = resolve(str(PAIR / "target"), drafter=str(PAIR / "drafter"))
    prompts = ["Count from one to twenty.", "Name three colours and a fruit.", "What is 12 times 7?"]
    with launch_server("llamacpp", pair, "dflash", runner="process", port=free_port()) as server:
        with httpx.Client(base_url=server.url, timeout=120) as c:
            before = prometheus.parse(c.get("/metrics").text)
            timings = [c.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": p}], "max_tokens": 48, "temperature": 0}).json()["timings"]
                for p in prompts]
            delta = prometheus.delta(before, prometheus.parse(c.get("/metrics").text))
    acc = prometheus.spec_acceptance(delta, "llamacpp:")
    assert acc is not None, json.dumps(delta)
    assert acc["num_draft_tokens"] == sum(t.get("draft_n", 0) for t in timings)
    assert acc["num_accepted_tokens"] == sum(t.get("draft_n_accepted", 0) for t in timings)


def test_a_sweeps_server_is_emptied_between_cells_where_a_launched_one_keeps_its_prompts(llama_server, monkeypatch):
    """Three prompts through two slots, the slots emptied as a sweep empties them before a cell, the prompts sent
    again: on a server launched as a sweep launches it (`cache_reset`) none is found cached; on one launched as
    `dflash-bench launch` does, erasing the slots leaves the prompts in llama.cpp's host-memory cache, and a later
    "cell" would find them all there; so they are on a sweep's server whose --engine-arg turns that cache back on,
    and there the cell says so."""
    from dflash_bench import profiles
    from dflash_bench.client.server_cache import empty_prefix_cache

    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    pair = resolve(str(PAIR / "target"))
    prompts = ["Count from one to twenty.", "Name three colours and a fruit.", "What is 12 times 7 plus 5?"]
    path = profiles.get("llamacpp").cache_reset
    assert path is not None

    def cached(c: httpx.Client) -> list[float]:
        """Each prompt's share found cached."""
        usage = [c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": p}], "max_tokens": 4,
                                                      "temperature": 0}).json()["usage"] for p in prompts]
        return [u["prompt_tokens_details"]["cached_tokens"] / u["prompt_tokens"] for u in usage]

    found = {}
    for reset, extra in ((True, ()), (False, ()), (True, ("--cache-ram", "64"))):
        with launch_server("llamacpp", pair, "ar", runner="process", port=free_port(), slots=(2, 256),
                           cache_reset=reset, extra_args=extra) as server:
            assert ("--slot-save-path" in server.info.command) == reset
            with httpx.Client(base_url=server.url, timeout=120) as c:
                cached(c)
                left = profiles.get("llamacpp").cache_left(server.info.command)  # as the sweep empties it
                said = empty_prefix_cache(server.url, path, 30, left)
                found[(reset, extra)] = (said, cached(c))
    # a user's --engine-arg turning the host-memory cache back on: the slots are erased, a prompt they held before
    # is still found (the one a later prompt's slot moved to host memory), and the cell would say it was not emptied
    said, again = found[(True, ("--cache-ram", "64"))]
    assert said.startswith("not emptied: the server runs with --cache-ram 64 (an --engine-arg over the sweep's 0)")
    assert said.endswith(f"(sent POST {path} for each of the 2 slots)") and max(again) > 0.5, (said, again)
    said, again = found[(True, ())]
    assert said == f"emptied (POST {path} for each of the 2 slots)"
    # the first prompt computed whole; the next two find only the chat template's start, which the first left
    assert again[0] == 0 and max(again) < 0.5, again
    said, again = found[(False, ())]
    assert said.startswith("not emptied") and "/slots" in said  # without --slot-save-path llama.cpp refuses it
    assert min(again) > 0.5, again  # its slots and host-memory cache kept every prompt


def test_only_gpt2s_byte_level_split_is_registered(tmp_path):
    from dflash_bench.llamacpp.converter import gpt2_layout

    assert gpt2_layout(PAIR / "target")  # the embedded pair: ByteLevel, GPT-2's regex, no prefix space
    for pre in ({"type": "Metaspace", "replacement": "_"}, {"type": "ByteLevel", "add_prefix_space": True},
                {"type": "Sequence", "pretokenizers": [{"type": "Split"}, {"type": "ByteLevel", "use_regex": False}]}):
        (tmp_path / "tokenizer.json").write_text(json.dumps({"pre_tokenizer": pre}))
        assert not gpt2_layout(tmp_path), pre
    (tmp_path / "tokenizer.json").unlink()
    assert not gpt2_layout(tmp_path)


def test_the_gguf_cache_key_follows_the_content(tmp_path, monkeypatch):
    from dflash_bench.llamacpp.convert import gguf_path

    monkeypatch.setenv("DFLASH_BENCH_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "README.md").write_text("notes")
    first = gguf_path(model, "f32")
    assert first.parent == tmp_path / "cache" / "gguf" and gguf_path(model, "f32") == first
    (model / "README.md").write_text("other notes")  # says nothing about the weights: same file
    assert gguf_path(model, "f32") == first
    (model / "config.json").write_text('{"a": 1}')
    assert gguf_path(model, "f32") != first and gguf_path(model, "bf16") != gguf_path(model, "f32")
    drafter = tmp_path / "d"
    drafter.mkdir()
    (drafter / "config.json").write_text("{}")
    # a drafter's GGUF embeds its target's tokenizer and embeddings: a changed target converts it again
    before = gguf_path(drafter, "f32", target_dir=model)
    (model / "tokenizer.json").write_text("{}")
    assert gguf_path(drafter, "f32", target_dir=model) != before


def test_the_client_reads_llamacpps_logprobs_and_final_chunks():
    """Chunks in llama-server's shapes (tools/server/server-task.cpp): token ids come from `id`, the text
    piece is `token`; usage arrives once, in a last chunk with no choices, next to `timings`."""
    from dflash_bench.client.protocol import Stream

    s = Stream("chat", want_ids=True)
    lp = lambda i, tok: {"content": [{"id": i, "token": tok, "bytes": [], "logprob": -0.1,  # noqa: E731
                                      "top_logprobs": [{"id": i, "token": tok, "bytes": [], "logprob": -0.1},
                                                       {"id": 7, "token": "x", "bytes": [], "logprob": -3.0}]}]}
    for t, (i, tok) in enumerate([(11, "Hel"), (12, "lo")]):
        s.feed(float(t), json.dumps({"choices": [{"finish_reason": None, "index": 0, "delta": {"content": tok},
                                                   "logprobs": lp(i, tok)}], "object": "chat.completion.chunk"}).encode())
    s.feed(2.0, json.dumps({"choices": [{"finish_reason": "stop", "index": 0, "delta": {}}]}).encode())
    s.feed(2.0, json.dumps({"choices": [], "usage": {"completion_tokens": 2, "prompt_tokens": 5, "total_tokens": 7},
                            "timings": {"draft_n": 15, "draft_n_accepted": 1}}).encode())
    s.feed(2.1, b"[DONE]")
    assert s.error is None and s.ids == [11, 12] and s.tops[0] == [(11, -0.1), (7, -3.0)]
    assert (s.output_text(), s.output_tokens, s.prompt_tokens, s.finish) == ("Hello", 2, 5, "stop")


def test_ids_reported_for_only_some_tokens_are_not_saved():
    """llama-server with a draft model gives logprobs for the first token only: saving that partial list
    would make the lossless check report a divergence where there is none."""
    from dflash_bench.client.protocol import Stream

    def stream(n_ids: int, n_tokens: int) -> Stream:
        s = Stream("chat", want_ids=True)
        for i in range(n_tokens):
            lp = {"content": [{"id": i, "token": "t", "logprob": -0.1, "top_logprobs": []}]} if i < n_ids else None
            s.feed(float(i), json.dumps({"choices": [{"index": 0, "delta": {"content": "t"}, "logprobs": lp}]}).encode())
        s.feed(9.0, json.dumps({"choices": [], "usage": {"completion_tokens": n_tokens, "prompt_tokens": 3}}).encode())
        return s

    assert stream(1, 24).saved_ids() == {"token_ids": None, "top_logprobs": None}
    assert stream(24, 24).saved_ids()["token_ids"] == list(range(24))
    assert stream(23, 24).saved_ids()["token_ids"] == list(range(23))  # an unreported final stop token

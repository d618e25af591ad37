"""The release's claims (dflash_bench/published.py CLAIMS) beside what this project measured of each: one table.

Each claim's results file is benchmarks/peers/big_sweep.py's (`Results`: one run per sweep folder of
benchmarks/peers/mission.sh), named in CLAIM_FILES; a claim whose file is not there yet is one row saying it is
awaited, with the calls that measure it (docs/results/release-claims.md). A measured row is one engine x suite x
concurrency: AR and DFlash tok/s (EAGLE-3's too where the sweep ran it), the speedups, tau (the acceptance drawn
where the server drew one: `--synthetic-acceptance`), and per user (1000 / TPOT p50) and per GPU tok/s; the notes
say, per claim, what differs from the published setup: the GPU, the weights, the acceptance.
"""

from __future__ import annotations

from typing import Any

from benchmarks.tables.renderers import SUITES, Table, f1, f2
from dflash_bench import profiles
from dflash_bench.published import CLAIMS, PublishedClaim, gpu_model

# claim key -> its results file under benchmarks/results/ (written by big_sweep.py from the claim's sweep folders)
CLAIM_FILES = {
    "gemma-26b": "claims_gemma4_26b_h200.json",
    "qwen3-8b": "claims_qwen3_8b_h200.json",
    "gpt-oss-120b": "claims_gpt_oss_120b_h200.json",
    "eagle3": "claims_eagle3_qwen3_8b_h200.json",
}
# claim key -> the device calls that measure it (docs/results/release-claims.md gives each in full), then
# `python -m benchmarks.peers.big_sweep --pair PAIR --out benchmarks/results/FILE` over the sweep folders they return
_MISSION = "`bash benchmarks/peers/mission.sh --gpu h200 -n 8 --pair"
CLAIM_CALLS = {
    "gemma-26b": f"measured by {_MISSION} gemma-4-26B-A4B-it --suites gsm8k,math500 --synthetic-acceptance 7.8 vllm` "
                 "(one H200, carrying .vllm-bundle and .data), then the same with `sglang` (.sglang-bundle).",
    "qwen3-8b": f"measured by {_MISSION} Qwen3-8B --suites gsm8k,math500 --synthetic-acceptance card --modes "
                "ar,dflash,eagle3 vllm` (one H200, carrying .vllm-bundle and .data: the eagle3 row's sweep too), then "
                "the same with `sglang` (.sglang-bundle).",
    "gpt-oss-120b": "measured by `bash benchmarks/peers/mission.sh --pair gpt-oss-120b --gpu h200 --tp 2 -n 1 "
                    "--suites gsm8k -c 64,128,256,512 --max-tokens 1024 --synthetic-acceptance 6.5 vllm` on two H200s "
                    "(nvidia-h200-x2), or the same with --tp 4 on four (nvidia-h200-x4) where they are lent, "
                    "carrying .vllm-bundle and .data (docs/results/release-claims.md).",
    "eagle3": f"measured by {_MISSION} Qwen3-8B --suites gsm8k,math500 --synthetic-acceptance card --modes "
              "ar,dflash,eagle3 vllm` (one H200, carrying .vllm-bundle and .data: the qwen3-8b row's sweep too).",
}
ENGINES = {"vllm": "vLLM", "sglang": "SGLang", "builtin": "builtin", "emulator": "emulator"}
HEADER = ["claim", "published", "measured on", "suite", "c", "AR tok/s", "DFlash tok/s", "DFlash / AR", "τ",
          "EAGLE-3 tok/s", "DFlash / EAGLE-3", "AR tok/s per user", "DFlash tok/s per user", "EAGLE-3 tok/s per user",
          "DFlash tok/s per GPU"]


# big_sweep.Run.routing "alike": how a mixture's random weights routed its tokens, no switch set
ALIKE = ("every token routed to the same few experts, as random weights route them: a step reads a few experts where "
         "a trained router's reads most, so this run's times are not a trained model's")


def published_cell(c: PublishedClaim) -> str:
    where = "GPU not stated" if c.gpu == "not stated" else f"{c.gpus}x {c.gpu}" if c.gpus > 1 else c.gpu
    conc = "high concurrency" if c.concurrency == "high" else f"c {c.concurrency}"
    return f"{c.claim} ({ENGINES.get(c.engine, c.engine)}, {where}, {conc})"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def _tau(row: dict[str, Any] | None) -> str:
    if row is None or row.get("tau") is None:
        return "-"
    drawn = row.get("synthetic_tau")
    return f2(row["tau"]) + (f" (drawn {drawn:g})" if drawn is not None else "")


def _eagle3(row: dict[str, Any] | None) -> str:
    """An EAGLE-3 cell's tok/s and its tau (and the tau it drew), in one bracket."""
    if row is None or row.get("tok_s") is None:
        return "-"
    if row.get("tau") is None:
        return f1(row["tok_s"])
    drawn = row.get("synthetic_tau")
    return f"{f1(row['tok_s'])} (τ {f2(row['tau'])}" + (f", drawn {drawn:g})" if drawn is not None else ")")


def _per_user(row: dict[str, Any] | None) -> str:
    if row is None or row.get("tok_s") is None:
        return "-"
    tpot = row.get("tpot_ms_p50")
    return f1(1000.0 / tpot) if tpot else f1(row["tok_s"] / row["concurrency"])


def _machine(run: dict[str, Any]) -> str:
    """'1x H200' (GPUs a server, and their model), or the device as recorded where it names no GPU."""
    device = run["device"]
    if "x " not in device:
        return device
    return f"{run['gpus_per_server']}x {gpu_model(device.split('x ', 1)[1])}"


def _differs(c: PublishedClaim, run: dict[str, Any]) -> str:
    """What differs between the claim's setup and a run: GPU and count, weights, acceptance."""
    parts = []
    gpus = run["gpus_per_server"]
    device = run["device"].split("x ", 1)[-1] if "x " in run["device"] else run["device"]
    if gpu_model(device) != gpu_model(c.gpu) or gpus != c.gpus:
        published = "not stated" if c.gpu == "not stated" else f"{c.gpus}x {c.gpu}"
        parts.append(f"GPU: {gpus}x {gpu_model(device)} a server, published {published}")
    weights = run.get("weights", "real")
    if weights != "real":
        parts.append(f"weights {weights} (published: the real model and drafter)")
    if run.get("routing") == "alike":
        parts.append(ALIKE)
    elif run.get("routing") == "random":  # each engine's switch, as its profile names it
        switches = sorted({"=".join(sim) for e in {r["engine"] for r in run["rows"]}
                           if e in profiles.names() and (sim := profiles.get(e).routing_simulation)})
        parts.append(f"experts drawn at random for each token ({', '.join(switches)}; published: a trained router)")
    drawn = sorted({r["synthetic_tau"] for r in run["rows"] if r.get("synthetic_tau") is not None})
    if drawn:
        parts.append(f"acceptance drawn at tau {', '.join(f'{t:g}' for t in drawn)} (published: measured)")
    elif weights != "real":
        parts.append("acceptance of a random drafter (tau about 1): the speculative path's cost only")
    return "; ".join(parts) or "nothing recorded differs"


def _rows(c: PublishedClaim, data: dict[str, Any]) -> tuple[list[list[str]], list[str]]:
    rows: list[list[str]] = []
    notes: list[str] = []
    for n, run in enumerate(data["runs"], 1):
        label = f"{c.key} run {n}"
        notes.append(f"{label} ({run['device']}, {run['gpus_per_server']} GPU(s) a server): `{run['command']}`; "
                     f"differs: {_differs(c, run)}.")
        cells: dict[tuple[str, str, int], dict[str, dict[str, Any]]] = {}
        failed: dict[tuple[str, str], str] = {}
        for r in run["rows"]:
            if r["tok_s"] is None:
                failed.setdefault((r["engine"], r["mode"]), r.get("reason") or r["status"])
                continue
            cells.setdefault((r["engine"], r["suite"], r["concurrency"]), {})[r["mode"]] = r
        order = sorted(cells, key=lambda k: (k[0], SUITES.index(k[1]) if k[1] in SUITES else len(SUITES), k[2]))
        for engine, suite, conc in order:
            modes = cells[(engine, suite, conc)]
            ar, df, e3 = modes.get("ar"), modes.get("dflash"), modes.get("eagle3")
            tok = {m: (r["tok_s"] if r else None) for m, r in (("ar", ar), ("dflash", df), ("eagle3", e3))}
            alike = ", experts alike" if run.get("routing") == "alike" else ""
            rows.append(["", "", f"{ENGINES.get(engine, engine)}, {_machine(run)} (run {n}{alike})",
                         suite, str(conc), f1(tok["ar"]), f1(tok["dflash"]), _ratio(tok["dflash"], tok["ar"]),
                         _tau(df), _eagle3(e3), _ratio(tok["dflash"], tok["eagle3"]), _per_user(ar), _per_user(df),
                         _per_user(e3), f1(df["tok_s_per_gpu"]) if df and df.get("tok_s_per_gpu") else "-"])
        notes += [f"{label}, {ENGINES.get(e, e)} {m}: not measured: {why}" for (e, m), why in failed.items()]
        drafts = sorted({r["synthetic_source"].rsplit("over ", 1)[1] for r in run["rows"] if r["mode"] == "eagle3"
                         and r.get("synthetic_tau") is not None and "over " in (r.get("synthetic_source") or "")})
        if drafts:
            notes.append(f"{label}: EAGLE-3's τ is drawn over its own {', '.join(drafts)} a step, DFlash's over its "
                         "block: the same mean τ, each at its drafter's draft length.")
    if data.get("measured"):
        notes.append(f"{c.key}: measured on {data['measured']}.")
    return rows, notes


def release_claims(results: list[Any]) -> Table:
    """One row group per claim of CLAIMS, in order: its measured rows (results files in CLAIM_FILES order, None
    where a file is awaited), the claim and its published setup on the group's first row."""
    by_key = dict(zip(CLAIM_FILES, results))
    rows: list[list[str]] = []
    notes: list[str] = []
    for c in CLAIMS:
        data = by_key.get(c.key)
        group, group_notes = _rows(c, data) if data else ([], [])
        if not group:
            why = "awaited" if data is None else "no cell measured"
            group = [["", "", why] + ["-"] * (len(HEADER) - 3)]
        group[0][0], group[0][1] = f"{c.key}: {c.pair}", published_cell(c)
        rows += group
        notes += group_notes
        notes.append(f"{c.key}: published by {c.source}.")
    notes.append("τ: tokens a verify step commits, from each server's counters; '(drawn T)': the server drew its "
                 "acceptance at mean T (`--synthetic-acceptance`) instead of checking a real drafter's tokens, so the "
                 "time measured is a real step's at that acceptance. Per user: 1000 / the median TPOT.")
    return Table(HEADER, rows, notes)

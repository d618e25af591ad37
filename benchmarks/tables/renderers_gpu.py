"""The GPU families' tables (benchmarks/tables/pages.py): engines on one GPU (vLLM, SGLang and the builtin engine)
and the builtin engine's fast path on one GPU; a large pair's sweeps are renderers_mission.py's. Each function takes the loaded JSON of its
entry's sources, in order, and returns a Table; the shared formatting is renderers.py's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks.fixtures.gpus import DENSE_PEAK_TFLOPS
from benchmarks.tables.renderers import SUITES, Table, f1, f2, span


# ---------------------------------------------------------------- engines on one GPU


def _shape_table(data: dict[str, Any], columns: Sequence[tuple[str, str, str]]) -> Table:
    rows = {(r["engine"], r["mode"], r["concurrency"]): r for r in data["rows"] if r["part"] == "shape"}
    concs = sorted({c for _, _, c in rows})
    out = []
    for conc in concs:
        row = [str(conc)]
        for _, engine, mode in columns:
            r = rows.get((engine, mode, conc))
            row.append("-" if r is None else f"{f1(r['output_tok_s'])} ({f1(r['ttft_ms_p50'])})")
        out.append(row)
    taus = {(e, m): [r["tau"] for (e2, m2, _), r in rows.items() if (e2, m2) == (e, m) and r["tau"] is not None]
            for _, e, m in columns}
    header = ["concurrency"] + [label + (f", τ {span(taus[(e, m)])}" if taus[(e, m)] else "") for label, e, m in columns]
    versions = ", ".join(f"{k} {v}" for k, v in data.get("versions", {}).items())
    return Table(header, out, [f"Output tok/s (median TTFT ms); {versions}. Each server's exact command line is in "
                               "the file's `commands`."])


def engines_h100(results: list[Any]) -> Table:
    return _shape_table(results[0], [("builtin AR", "builtin", "ar"), ("in process AR", "inprocess", "ar"),
                                     ("vLLM AR", "vllm", "ar"), ("builtin DFlash", "builtin", "dflash"),
                                     ("in process DFlash", "inprocess", "dflash"), ("vLLM DFlash", "vllm", "dflash")])


def engines_three(results: list[Any]) -> Table:
    return _shape_table(results[0], [("builtin AR", "builtin", "ar"), ("vLLM AR", "vllm", "ar"),
                                     ("SGLang AR", "sglang", "ar"), ("builtin DFlash", "builtin", "dflash"),
                                     ("vLLM DFlash", "vllm", "dflash"), ("SGLang DFlash", "sglang", "dflash")])


def pair_retrained(results: list[Any]) -> Table:
    return _pair_table_by_suite(results[0], [("vLLM", "vllm"), ("builtin `--fast`", "builtin-fast")])


def _pair_table_by_suite(data: dict[str, Any], engines: Sequence[tuple[str, str]]) -> Table:
    rows = {(r["engine"], r["mode"], r["suite"], r["concurrency"]): r for r in data["rows"] if r["part"] == "pair"}
    keys = sorted({(s, c) for _, _, s, c in rows}, key=lambda k: (SUITES.index(k[0]), k[1]))
    out = []
    for suite, conc in keys:
        row = [suite, str(conc)]
        for _, engine in engines:
            ar, df = rows.get((engine, "ar", suite, conc)), rows.get((engine, "dflash", suite, conc))
            if ar is None or df is None:
                row += ["-", "-"]
                continue
            row += [f2(df["tau"]), f"{f1(ar['output_tok_s'])} / {f1(df['output_tok_s'])} "
                                   f"({df['output_tok_s'] / ar['output_tok_s']:.2f}x)"]
        out.append(row)
    header = ["suite", "c"]
    for label, _ in engines:
        header += [f"{label} τ", f"{label} AR / DFlash"]
    return Table(header, out, ["Output tok/s, DFlash's speedup in brackets; τ from each engine's own counters."])


# ---------------------------------------------------------------- the fast path on one GPU


def engine_speed(results: list[Any]) -> Table:
    out = []
    for data in results:
        gpu = "H200" if "H200" in data["device"] else "H100" if "H100" in data["device"] else data["device"]
        for r in data["rows"]:
            ar, df = r["ar"], r["dflash"]
            speedup = df["tok_s"] / ar["tok_s"]
            out.append([gpu, str(r["concurrency"]), f1(ar["tok_s"]), f2(ar["step_ms"]),
                        f"{data['floor_ms'] / ar['step_ms']:.0%}", f1(df["tok_s"]), f"{speedup:.2f}x", f2(df["tau"]),
                        f2(df["draft_ms"]), f2(df["verify_ms"]), f2(speedup / df["tau"]), f"{df['step_ms'] / ar['step_ms']:.3f}"])
    notes = [f"{d['device']}: weights {d['target_gb']:.2f} GB a step over the measured copy bandwidth "
             f"{d['copy_bw'] / 1e12:.2f} TB/s give a floor of {d['floor_ms']:.2f} ms a step; torch ops instead of the "
             f"Triton kernels: AR {f1(d['torch_path_ar_c1']['tok_s'])} tok/s at 1; transformers `generate`: "
             f"{f1(d['hf_generate_tok_s'])} tok/s." for d in results if "torch_path_ar_c1" in d]
    d0 = results[0]
    notes.insert(0, f"Qwen3-8B-shaped target and Qwen3-8B-DFlash-b16-shaped drafter, random bf16 weights; "
                    f"{d0['prompt_len']}-token prompts, {d0['new_tokens']} new tokens; DFlash with synthetic acceptance "
                    f"τ = {d0['tau']} (the realised τ in the table); steps pipelined.")
    return Table(["GPU", "concurrency", "AR tok/s", "AR ms/step", "AR % of floor", "DFlash tok/s", "speedup", "τ",
                  "draft ms", "verify ms", "speedup/τ", "DFlash step / AR step"], out, notes)


def gemm_tuning(results: list[Any]) -> Table:
    data = results[0]
    rows = []
    for key, shape in data["shapes"].items():
        name, nrows = key.split("/")
        best = min(shape["every"].values()) if shape.get("every") else None
        rows.append([name, nrows, f1(shape["cublas"]), f1(shape["cublaslt"]), f1(shape["engine"]), f1(best),
                     f"{shape['engine'] / shape['cublas'] - 1:+.1%}"])
    for name, chain in data["chains"].items():
        rows.append([{"ar": "an AR step's chain"}.get(name, f"a {name} step's chain"), "-", f"{chain['cublas_ms'] * 1000:.1f}", "-", f"{chain['engine_ms'] * 1000:.1f}",
                     f"{chain['best_ms'] * 1000:.1f}", f"{chain['engine_ms'] / chain['cublas_ms'] - 1:+.1%}"])
    return Table(["matmul", "rows", "cuBLAS µs", "cuBLASLt µs", "engine's plan µs", "best setting swept µs", "engine vs cuBLAS"], rows,
                 ["The Qwen3-8B shape's decode matmuls (bf16), weight copies cycled so nothing is served from L2; a step's "
                  "chain: every layer's matmuls and the lm_head."])


def step_anatomy(results: list[Any]) -> Table:
    data = results[0]
    kinds = sorted(set(data["ar"]["kinds"]) | set(data["dflash"]["kinds"]))
    rows = []
    for kind in kinds:
        row = [kind]
        for side in ("ar", "dflash"):
            k = data[side]["kinds"].get(kind)
            row += ["-", "-"] if k is None else [f1(k["us"]), f"{k['launches']:.0f}"]
        rows.append(row)
    totals = [sum(k["us"] for k in data[side]["kinds"].values()) for side in ("ar", "dflash")]
    rows.append(["all", f1(totals[0]), "-", f1(totals[1]), "-"])
    return Table(["kernel kind", "AR µs", "AR launches", "DFlash µs", "DFlash launches"], rows,
                 [f"One step of the {data['shape']} shape at batch 1, context {data['context']}, from replayed CUDA graphs; "
                  "DFlash is a draft and a verify of the whole block."])


def engine_speed_adaptive(results: list[Any]) -> Table:
    out = []
    for r in results[0]["rows"]:
        ar, df, ad = r["ar"], r["dflash"], r["adaptive"]
        out.append([str(r["concurrency"]), f1(ar["tok_s"]), f1(df["tok_s"]), f"{df['tok_s'] / ar['tok_s']:.2f}x", f2(df["tau"]),
                    f1(ad["tok_s"]), f"{ad['tok_s'] / ar['tok_s']:.2f}x", f2(ad["tau"]), f1(ad["verify_width"]),
                    f"{ad['full_batch_tok_s'] / ar['full_batch_tok_s']:.2f}x"])
    return Table(["concurrency", "AR tok/s", "whole block: DFlash tok/s", "speedup", "τ", "adaptive: DFlash tok/s", "speedup",
                  "τ", "width (mean)", "adaptive, until the first request ends"], out,
                 ["Fixed and adaptive widths draw the same synthetic uniforms; every graph captured before the rows."])


def engine_speed_before_after(results: list[Any]) -> Table:
    """Two engine_speed runs of one command (before, after a change), row by row."""
    before, after = ({r["concurrency"]: r for r in res["rows"]} for res in results)
    pct = lambda a, b: f"{100 * (b / a - 1):+.1f}%"  # noqa: E731
    out = [[str(c)] + [v for k in ("ar", "adaptive") for v in (f1(before[c][k]["tok_s"]), f1(after[c][k]["tok_s"]),
                                                                pct(before[c][k]["tok_s"], after[c][k]["tok_s"]))]
           + [f2(before[c]["adaptive"]["tau"]), f2(after[c]["adaptive"]["tau"])] for c in sorted(before) if c in after]
    return Table(["concurrency", "AR tok/s before", "after", "change", "adaptive DFlash tok/s before", "after", "change",
                  "τ before", "after"], out)


def serve_speed_gpu(results: list[Any]) -> Table:
    data = results[0]
    out = []
    for conc, cells in sorted(data["rows"].items(), key=lambda kv: int(kv[0])):
        for label, suffix in (("on", ""), ("off", "_no_step_ahead")):
            ar, df = cells.get("ar" + suffix), cells.get("dflash" + suffix)
            if ar is None or df is None:
                continue
            out.append([conc, label, f1(ar["output_throughput"]), f1(ar["ttft_ms"]["p50"]), f2(ar["tpot_ms"]["p50"]),
                        f1(df["output_throughput"]), f1(df["ttft_ms"]["p50"]), f2(df["tpot_ms"]["p50"]),
                        f2(df["acceptance_length"]), f"{df['output_throughput'] / ar['output_throughput']:.2f}x"])
    return Table(["concurrency", "step ahead", "AR tok/s", "AR TTFT ms", "AR TPOT ms", "DFlash tok/s", "DFlash TTFT ms",
                  "DFlash TPOT ms", "τ", "speedup"], out,
                 [f"GSM8K prompts, {data['new_tokens']} new tokens, synthetic τ {data['tau']}; TTFT and TPOT are medians."])


def gemma_fast(results: list[Any]) -> Table:
    """benchmarks/speed/gemma_fast.py: the builtin engine's fast path on a big shape, per mode and batch, against the
    weight-read floor (the weights' bytes over the measured copy bandwidth)."""
    data = results[0]
    out = [[ph["mode"], str(r["batch"]), f2(r["ms_per_step"]), f1(r["tok_s"]), f2(r["tokens_per_row_step"]),
            f"{100 * r['floor_share']:.0f}%", f1(ph["peak_GiB"])]
           for ph in data["phases"] for r in ph["rates"]]
    floor = data["phases"][0]["floor_ms"]
    return Table(["mode", "batch", "ms per step", "tok/s", "tokens per row and step", "weight-read floor / step",
                  "peak GPU GiB"], out,
                 [f"In process, {data['slots']} slots of {data['max_len']} tokens; the floor is {f2(floor)} ms a step "
                  f"({data['phases'][0]['weight_bytes'] / 1e9:.1f} GB of weights at a measured "
                  f"{data['copy_bandwidth_GBps']:.0f} GB/s). DFlash: a random drafter with synthetic acceptance (the file's notes)."])


def _lengths(group: dict[str, Any]) -> str:
    """A prefill group's prompt length, or its span (`gemma_fast --prefill KxA-B`)."""
    longest = group["prompt_len"]
    return str(longest) if group.get("shortest", longest) == longest else f"{group['shortest']}-{longest}"


def gemma_prefill(results: list[Any]) -> Table:
    """benchmarks/speed/gemma_fast.py --prefill: one prefill group of k prompts of P tokens (a graph for k = 1, else
    the one eager forward a wave's batch runs), its time and the share of the GPU's dense peak its matmuls reach; and
    a decode step of the same engine, for the cost of a step a prefill holds back."""
    data = results[0]
    ph = data["phases"][0]
    out = [[str(p["prompts"]), _lengths(p), str(p["tokens"]), "graph" if p["graphed"] else "eager",
            f1(p["ms"]), f"{1e3 * p['ms_per_token']:.0f}", f"{p['matmul_tflops']:.0f}", f"{100 * p['peak_share']:.0f}%"]
           for p in ph["prefills"]]
    notes = [f"In process on one {data['device']}, {ph['mode'].upper()}, {data['slots']} slots of {data['max_len']} "
             "tokens; the median of the file's repeats after a warm-up. TFLOP/s counts the layers' matmuls only "
             "(2 x their parameters x the tokens): attention's own and the head's are left out, so the share is a "
             "floor."]
    notes += [f"A decode step at {r['batch']} rows on the same engine: {f2(r['ms_per_step'])} ms (the weight-read "
              f"floor, {f2(ph['floor_ms'])} ms at a measured {data['copy_bandwidth_GBps']:.0f} GB/s, is "
              f"{100 * r['floor_share']:.0f}% of it)." for r in ph.get("rates", [])]
    return Table(["prompts", "tokens each", "tokens", "forward", "ms", "µs per token", "matmul TFLOP/s",
                  "of the dense peak"], out, notes)


# gemma_prefill_anatomy's files, in order
PREFILL_LABELS = ("before", "a prefill attends to its own keys", "and packs its tokens",
                  "the same at tensor parallel 2 (rank 0)")


def gemma_prefill_anatomy(results: list[Any]) -> Table:
    """benchmarks/speed/gemma_fast.py --prefill ... --anatomy, one file per version of the engine (PREFILL_LABELS):
    each prefill group's time, and where its device time went by kernel kind (kernel_kinds.Anatomy) in one more,
    profiled run; a gather is a read of cached keys (index_select, which the classifier of the first file called
    'embedding': a prefill's embedding is the one fused embedding+norm kernel)."""
    out = []
    for label, data in zip(PREFILL_LABELS, results):
        for p in data["phases"][0]["prefills"]:
            a = p["anatomy"]
            ms = {k: v["ms"] for k, v in a["classes"].items()}
            gather = ms.pop("gather (index)", 0.0) + ms.pop("embedding", 0.0)
            big = [ms.pop(k, 0.0) for k in ("matmul", "attention", "copy/cat/where", "collective")]
            padded = p.get("padded_tokens", p["tokens"])
            tokens = str(p["tokens"]) if padded == p["tokens"] else f"{p['tokens']} ({padded} padded)"
            out.append([label, f"{p['prompts']} x {_lengths(p)}", tokens, "graph" if p["graphed"] else "eager",
                        f1(p["ms"]), f1(a["busy_ms"]), *(f1(x) for x in big), f1(gather), f1(sum(ms.values())),
                        f1(a["idle_ms"])])
    first = results[0]
    return Table(["engine", "prompts x tokens", "tokens", "forward", "ms", "device busy", "matmul", "attention",
                  "copy/cat", "all-reduce", "gather", "the rest", "idle"], out,
                 [f"In process on one {first['device']} (the last file's rows: rank 0 of two, tensor parallel), AR, "
                  f"{first['slots']} slots of {first['max_len']} tokens: ms is the "
                  "median of the timed repeats; tokens: the prompts' own (and the group padded to its longest, as a "
                  "forward that does not pack them runs it); the kinds (ms of device time) are one more run of the "
                  "group under torch's profiler. Gather: cached keys read back; the rest: norms, GeGLU, q/k norms + RoPE + cache "
                  "store, masks, copies to the device; all-reduce: the tensor-parallel collectives, a rank's wait for "
                  "the other included; idle: the device waiting between kernels (an upper bound: the profiler slows "
                  "each launch)."])


def rows_anatomy(results: list[Any]) -> Table:
    """benchmarks/speed/rows_anatomy.py: one step's device time by kernel class as rows grow, against the read floor
    (the weights once plus every row's KV at the step's context, at the measured copy bandwidth)."""
    data = results[0]
    classes = ("gemm", "attention", "norms/rope/elementwise", "sampling+commit")

    def label(width_policy: str) -> str:  # the points' AR has width policy "ar"
        return "AR" if width_policy == "ar" else f"DFlash, width {width_policy}"
    out = []
    for p in data["points"]:
        floor = p["weight_floor_us"] + p["kv_floor_us"]
        out.append([p["shape"], label(p["width_policy"]), str(p["rows"]), f2(p["tokens_per_row_step"]), f2(p["wall_us"] / 1e3)]
                   + [f2(p["classes_us"].get(c, 0.0) / 1e3) for c in classes]
                   + [f2(p["host_us"] / 1e3), f2(floor / 1e3), f"{p['wall_us'] / floor:.2f}x"])
    notes = [f"Milliseconds a step, {data['dtype']}, context {data['context']} tokens, synthetic τ {data['tau']} for "
             f"DFlash (random weights of the shape); the floor reads the weights once and every row's KV at the step's "
             f"context at the measured {data['bandwidth_GBps']:.0f} GB/s. Device time by class is from the profiler's "
             "kernels; host is the step's wall time the GPU waited on the host. TFLOP/s below: 2 FLOPs per target "
             "parameter (its weight bytes / 2) and token verified, over the step's GEMM time, which holds the "
             "drafter's matmuls too (and an untied embedding counts as a matmul): an estimate."]
    for p in data["points"]:  # how near a wide verify is to the compute bound
        if p["mode"] == "dflash" and p["rows"] >= 32 and p["classes_us"].get("gemm"):
            tokens = p["rows"] * p["width"]
            tflops = data["shapes"][p["shape"]]["weight_bytes"] * tokens / p["classes_us"]["gemm"] / 1e6
            peak = f" ({100 * tflops / DENSE_PEAK_TFLOPS[data['device']]:.0f}% of the dense peak)" \
                if data["device"] in DENSE_PEAK_TFLOPS else ""
            notes.append(f"{p['shape']} {label(p['width_policy'])}, {p['rows']} rows: {tokens} tokens verified a "
                         f"step, the target's matmuls at about {tflops:.0f} TFLOP/s{peak}.")
    for g in data["growth"]:
        per = g["us_per_row"]
        notes.append(f"{g['shape']} {label(g['width_policy'])}, "
                     f"{g['rows'][0]}-{g['rows'][-1]} rows: each row adds {f1(per['wall'])} µs a step "
                     f"(GEMMs {f1(per['gemm'])}, attention {f1(per['attention'])}, host {f1(per['host'])}).")
    return Table(["shape", "mode", "rows", "tokens per row and step", "step", "GEMMs", "attention",
                  "norms, RoPE, elementwise", "sampling+commit", "host", "read floor", "step / floor"], out, notes)


ENGINE_NAMES = {"builtin": "builtin", "vllm": "vLLM", "sglang": "SGLang"}
CLIENT_NAMES = {"dflash-bench": "`dflash-bench run`", "vllm-bench": "`vllm bench serve`"}


def two_clients(results: list[Any]) -> Table:
    """benchmarks/peers/two_clients.py: per (shape, mode, concurrency, output length), the builtin engine beside each other
    engine, by each client, with the ratio of their output tok/s; rows not measured say why in the notes. A server on
    several GPUs (tensor parallel) is its own shape row, its tok/s per GPU."""
    data = results[0]

    def shape(r: dict[str, Any]) -> str:
        g = r.get("gpus", 1)
        return r["shape"] if g == 1 else f"{r['shape']}, {g} GPUs"
    rows = {(r["engine"], shape(r), r["mode"], r["synthetic_tau"], r["concurrency"], r["new_tokens"], r["client"]): r
            for r in data["rows"]}
    others = sorted({k[0] for k in rows} - {"builtin"})
    clients = [c for c in CLIENT_NAMES if any(k[6] == c for k in rows)]

    def cell(r: dict[str, Any] | None) -> str:
        if r is None:
            return "-"
        if r["status"] != "ok":
            return r["status"]
        tau = f", τ {f2(r['tau'])}" if r["mode"] == "dflash" and r["tau"] is not None else ""
        return f"{f1(r['output_tok_s'] / r.get('gpus', 1))} ({f2(r['tpot_ms_p50'])}{tau})"

    def ratio(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str:
        if not a or not b or a["status"] != "ok" or b["status"] != "ok" or not b["output_tok_s"]:
            return "-"
        return f"{a['output_tok_s'] / b['output_tok_s']:.2f}"

    out = []
    for shape, mode, tau, conc, new in sorted({k[1:6] for k in rows}, key=lambda k: (k[0], k[1], k[2] or 0, k[4], k[3])):
        label = "AR" if mode == "ar" else "DFlash" + (f", synthetic τ {tau:g}, drawn" if tau is not None else "")
        row = [shape, label, str(conc), str(new)]
        for client in clients:
            mine = rows.get(("builtin", shape, mode, tau, conc, new, client))
            row.append(cell(mine))
            for other in others:
                theirs = rows.get((other, shape, mode, tau, conc, new, client))
                row += [cell(theirs), ratio(mine, theirs)]
        out.append(row)
    header = ["shape", "mode", "c", "out tokens"]
    for client in clients:
        header.append(f"builtin, {CLIENT_NAMES[client]}")
        for other in others:
            header += [f"{ENGINE_NAMES.get(other, other)}, {CLIENT_NAMES[client]}", f"builtin / {ENGINE_NAMES.get(other, other)}"]
    notes = ["Output tok/s per GPU (TPOT p50 ms; τ from the server's counters over the cell): a server on N GPUs "
             "(tensor parallel, the shape's 'N GPUs' rows) gives its tok/s over N. `dflash-bench run` sends the "
             "suite's prompts through the chat API; `vllm bench serve` sends random prompts of their mean length "
             "through /v1/completions; both ask for `--ignore-eos` and as many requests, after warm-ups."]
    measured: dict[str, dict[tuple[str, int, str], set[int]]] = {}  # run -> (mode, tokens, client) -> concurrencies
    for r in data["rows"]:
        if r["status"] == "ok":
            cells = measured.setdefault(r["run"], {})
            cells.setdefault((r["mode"], r["new_tokens"], CLIENT_NAMES.get(r["client"], r["client"])), set()).add(
                r["concurrency"])
    for key, run in sorted(data["runs"].items()):
        m = run["machine"]
        versions = ", ".join(f"{k} {v}" for k, v in sorted(m["versions"].items()))
        which = "; ".join(f"{mode} n={n} c={', '.join(map(str, sorted(cs)))} by {client}"
                          for (mode, n, client), cs in sorted(measured.get(key, {}).items())) or "nothing measured"
        notes.append(f"{key} ({m['gpu']}{', driver ' + m['driver'] if m.get('driver') else ''}; {versions}; "
                     f"{run['suite']} prompts of {f1(run['input_tokens'])} tokens on average, context limit "
                     f"{run['context_len']}; measured here: {which}): `{run['command']}`.")
        notes += [f"{key}, {mode} server: `{cmd}`." for mode, cmd in sorted(run["servers"].items())]
    why: dict[tuple[str, str, str, str], list[str]] = {}
    for r in data["rows"]:
        if r["status"] != "ok":
            why.setdefault((r["engine"], r["client"], r["status"], (r["reason"] or "").split("\n")[0]), []).append(
                f"{r['shape']} {r['mode']} c={r['concurrency']} n={r['new_tokens']}")
    notes += [f"{ENGINE_NAMES.get(e, e)} by {CLIENT_NAMES.get(c, c)}, {status} ({', '.join(cells)}): {reason}"
              for (e, c, status, reason), cells in sorted(why.items())]
    return Table(header, out, notes)

"""The card's table across sweep folders: each engine x machine x suite x concurrency, AR against DFlash (and
against EAGLE-3, on rows of its own that say so, where a sweep ran it), beside the model card's row of the same suite
and concurrency, with what makes a row unlike the card's said on it.

    rows = card_rows(cells, pair="gemma-4-31B-it")   # cells: one CellLine per measured cell (any folder)
    header, body = card_table(rows)                  # the same table for the report and the docs

A CellLine is one complete cell as every source has it (a sweep folder's `done` frame, a results file's rows),
so the HTML report and the docs' generated tables compute the ratio, the per-GPU rate and the labels in one place.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel

from dflash_bench import profiles
from dflash_bench.profiles.base import random_weights
from dflash_bench.speedup import speedup_of
from dflash_bench.published import published_for
from dflash_bench.store import SPECULATIVE, mode_name

Weights = Literal["real", "random", "emulated"]


class CellLine(BaseModel):
    """One complete cell: one repeat of it, or its repeats averaged (`card_rows` averages them)."""

    engine: str
    mode: str  # ar, or a speculative mode (store.SPECULATIVE: dflash, eagle3)
    suite: str
    concurrency: int
    device: str  # "1x NVIDIA H100 80GB HBM3": the machine the server ran on
    gpus: int | None = None  # GPUs per server (tensor parallel); None: not recorded
    tok_s: float | None = None
    ttft_ms_p50: float | None = None
    tpot_ms_p50: float | None = None
    tau: float | None = None
    weights: Weights = "real"
    synthetic_tau: float | None = None  # its DFlash server's synthetic acceptance: tau drawn, not measured
    synthetic_source: str | None = None  # where that tau came from, as the cell records it ("card gsm8k", "rates")
    source: str = ""  # the sweep id (or results file) it came from
    repeat: int = 0
    workload: str = ""  # workload_of its sweep's settings: an AR cell of another sweep partners it only if equal
    input_len: int = 0  # the prompts' length in tokens on the --input-len axis (its long-<N> suites); 0: the suite's own
    routed_at_random: bool = False  # its server drew a mixture's experts at random (profiles' routing_simulation)


class CardRow(BaseModel):
    """AR against one speculative mode of one engine, machine, suite and concurrency. `dflash` is the speculative
    side's cell: DFlash's, or EAGLE-3's where `mode` says so (the card is DFlash's: an EAGLE-3 row is labelled and
    never set beside it)."""

    engine: str
    device: str
    gpus: int | None
    suite: str
    concurrency: int
    mode: str = "dflash"  # the speculative side's mode (store.SPECULATIVE)
    ar: CellLine | None = None
    dflash: CellLine | None = None
    card_ar: float | None = None
    card_dflash: float | None = None
    card_speedup: float | None = None
    card_tau: float | None = None
    reference_tau: float | None = None  # the builtin engine's measured tau in the same suite and concurrency
    ratios: list[float] = []  # each repeat's DFlash / AR tok/s, where both sides of that repeat were measured
    repeats: int = 1

    @property
    def speedup(self) -> float | None:
        """The cell's one speedup (speedup.py speedup_of: the median of its repeats' ratios)."""
        return speedup_of(self.ratios)

    @property
    def mode_name(self) -> str:
        return mode_name(self.mode)

    @property
    def labels(self) -> list[str]:
        """What makes this row unlike the card's: said on the row itself."""
        out = [] if self.mode == "dflash" else [f"{self.mode_name}, not DFlash"]
        weights = {c.weights for c in (self.ar, self.dflash) if c}
        if "emulated" in weights:
            out.append("emulated (no model ran)")
        elif "random" in weights:
            out.append("random weights (τ about 1 unless synthetic)")
        if any(c.routed_at_random for c in (self.ar, self.dflash) if c):
            out.append("experts routed at random")
        synthetic = self.dflash.synthetic_tau if self.dflash else None
        if synthetic is not None:
            out.append(f"synthetic τ {synthetic:g}, drawn")
        return out


def weights_of(engine_args: Iterable[str], engine: str) -> Weights:
    """How the sweep's servers got their weights: the emulator has none; `--load-format dummy` makes random ones."""
    if engine == "emulator":
        return "emulated"
    return "random" if random_weights(engine_args) else "real"


# The sweep settings that do not change what one cell measures or the server it runs on: which cells a sweep holds
# (engines, suites, concurrencies, modes), the DFlash side's synthetic acceptance, and how the harness reached the
# servers. Two sweeps that agree on the rest ran the same requests against the same servers' flags.
NOT_WORKLOAD = frozenset({"engines", "suites", "concurrency", "modes", "synthetic_acceptance", "input_lens", "runner",
                          "port", "url_ar", "url_dflash", "slo", "expect_model"})
# settings added after results were committed: in the digest only where a sweep sets them, so that a committed run's
# workload still matches a new sweep's of the same settings
ONLY_WHERE_SET = frozenset({"api"})


def workload_of(settings: Mapping[str, Any] | None) -> str:
    """A short digest of what a sweep's cells send and to which servers' flags (its settings less NOT_WORKLOAD);
    empty where the sweep recorded no settings (`dflash-bench run`, a console's lines), which partners nothing."""
    if not settings:
        return ""
    kept = {k: v for k, v in settings.items() if k not in NOT_WORKLOAD and not (k in ONLY_WHERE_SET and v is None)}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:12]


def card_rows(cells: Iterable[CellLine], pair: str | None) -> list[CardRow]:
    """AR and DFlash of each (engine, device, GPUs, synthetic tau, suite, concurrency) side by side, with the card's
    row for that suite and concurrency where the pair's card has one; AR and EAGLE-3 the same way, on rows of their
    own (mode "eagle3") that the card's row never sits beside. A DFlash cell sits beside the AR cell of its
    own sweep; where its sweep measured DFlash alone (`--modes dflash`, as mission.sh's -tau steps do), beside the AR
    cell of the one other sweep of the same engine, machine and workload (workload_of), and that AR cell then has
    no row of its own. A cell's repeats (lines of one source differing only in `repeat`) show averaged, and the
    row's speedup is the median of each repeat's own ratio (speedup.py speedup_of)."""
    table = published_for(pair) if pair else None
    card = {(r.suite, r.concurrency): r for r in table.rows} if table else {}
    # (engine, device, GPUs, synthetic tau (the speculative side's), source, suite, concurrency) -> repeat -> line;
    # the speculative cells per mode
    spec: dict[str, dict[tuple[Any, ...], dict[int, CellLine]]] = {m: {} for m in SPECULATIVE}
    ar: dict[tuple[Any, ...], dict[int, CellLine]] = {}
    for line in cells:
        if line.mode != "ar" and line.mode not in spec:
            continue
        key = (line.engine, line.device, line.gpus, line.synthetic_tau if line.mode != "ar" else None,
               line.source, line.suite, line.concurrency)
        (ar if line.mode == "ar" else spec[line.mode]).setdefault(key, {})[line.repeat] = line
    rows: dict[tuple[Any, ...], CardRow] = {}
    borrowed: set[tuple[Any, ...]] = set()  # AR cells a speculative cell of another sweep sits beside
    for mode, key, lines in [(m, k, v) for m, cells_of in spec.items() for k, v in cells_of.items()]:
        row = rows[(mode, *key)] = CardRow(engine=key[0], device=key[1], gpus=key[2], suite=key[5],
                                           concurrency=key[6], mode=mode, dflash=_averaged(list(lines.values())))
        partner = _ar_partner(key, next(iter(lines.values())).workload, ar)
        if partner is None:
            continue
        if partner[4] != key[4]:
            borrowed.add(partner)
        mates = ar[partner]
        row.ar = _averaged(list(mates.values()))
        row.ratios = [d / a for n, line in sorted(lines.items())
                      if n in mates and (d := line.tok_s) and (a := mates[n].tok_s)]
        row.repeats = max(len(lines), len(mates))
    for key, lines in ar.items():
        if key in borrowed or any(k[:3] == key[:3] and k[4:] == key[4:] for m in spec.values() for k in m):
            continue
        rows[("ar", *key)] = CardRow(engine=key[0], device=key[1], gpus=key[2], suite=key[5], concurrency=key[6],
                            ar=_averaged(list(lines.values())))
    # the reference: the builtin engine runs z-lab's DFlash step for step, so its measured tau (not a synthetic one)
    # in the same suite and concurrency is what another engine's tau should match (gate/reference.py judges it)
    reference: dict[tuple[str, int], float] = {}
    for r in rows.values():
        if r.engine == "builtin" and r.mode == "dflash" and r.dflash and r.dflash.synthetic_tau is None \
                and r.dflash.tau is not None:
            reference.setdefault((r.suite, r.concurrency), r.dflash.tau)
    for r in rows.values():
        if r.mode != "dflash":
            continue  # the reference and the card are DFlash's: not set beside EAGLE-3
        if r.engine != "builtin" and r.dflash and r.dflash.synthetic_tau is None:
            r.reference_tau = reference.get((r.suite, r.concurrency))
        c = card.get((r.suite, r.concurrency))
        if c:
            r.card_ar, r.card_dflash, r.card_tau = c.ar_tok_s, c.dflash_tok_s, c.tau
            r.card_speedup = c.speedup if c.speedup is not None else (
                c.dflash_tok_s / c.ar_tok_s if c.ar_tok_s and c.dflash_tok_s else None)
    order = {m: i for i, m in enumerate(SPECULATIVE)}
    return sorted(rows.values(), key=lambda r: (r.engine, r.device, r.gpus or 0, order.get(r.mode, len(order)),
                                                 r.dflash.synthetic_tau or 0 if r.dflash else 0, r.suite, r.concurrency))


def _ar_partner(key: tuple[Any, ...], workload: str, ar: dict[tuple[Any, ...], dict[int, CellLine]]
                ) -> tuple[Any, ...] | None:
    """The AR cell a DFlash cell (its key) is read against: its own sweep's; else, where its sweep has none, the
    AR cell of the same engine, machine, suite and concurrency in the one other sweep of the same workload (none
    where no sweep or several do: which would be a guess)."""
    own = (*key[:3], None, *key[4:])
    if own in ar:
        return own
    if not workload:
        return None
    others = [k for k, lines in ar.items() if k[:3] == key[:3] and k[5:] == key[5:]
              and next(iter(lines.values())).workload == workload]
    return others[0] if len(others) == 1 else None


def _averaged(lines: list[CellLine]) -> CellLine:
    """One line for a cell's repeats: each measured number the mean of the repeats that have it."""
    if len(lines) == 1:
        return lines[0]

    def mean(name: str) -> float | None:
        values = [getattr(x, name) for x in lines if getattr(x, name) is not None]
        return sum(values) / len(values) if values else None

    return lines[0].model_copy(update={name: mean(name) for name in ("tok_s", "ttft_ms_p50", "tpot_ms_p50", "tau")}
                               | {"repeat": 0})


HEADER = ["engine", "mode", "sweep", "machine (GPUs per server)", "suite", "c", "AR tok/s", "DFlash tok/s", "DFlash / AR",
          "AR tok/s per GPU", "DFlash tok/s per GPU", "TTFT p50 ms AR / DFlash", "TPOT p50 ms AR / DFlash", "τ", "τ builtin (reference)",
          "card: AR / DFlash tok/s", "card: DFlash / AR", "card: τ", "not the card's"]


def number(v: float | None, digits: int = 1) -> str:
    """A measured number as every engines' and card table writes it: thousands separated, "-" where missing."""
    return "-" if v is None else f"{v:,.{digits}f}"


def _per(v: float | None, gpus: int | None, device: str, gpu_view: bool) -> str:
    """Per GPU where the table is per GPU ("-" for a row whose GPUs are not listed); per server, the tok/s itself,
    where no row ran on listed GPUs (a CPU run)."""
    if v is None:
        return "-"
    if not gpu_view:
        return f"{v:,.1f}"
    return f"{v / gpus:,.1f}" if gpus and device != "no GPU" else "-"


def per_gpu(rows: list[CardRow]) -> bool:
    """Whether any row ran on GPUs the manifest lists: else (a CPU run) throughput is per server, not per GPU."""
    return any(r.gpus and r.device != "no GPU" for r in rows)


def card_table(rows: list[CardRow]) -> tuple[list[str], list[list[str]]]:
    """The table as text cells, the same for the HTML report and the docs."""
    gpu_view = per_gpu(rows)
    header = HEADER if gpu_view else [h.replace(" per GPU", " per server") for h in HEADER]
    modes = any(r.mode != "dflash" for r in rows if r.dflash)
    # rows that only their numbers would tell apart (one engine, machine, mode and kind swept twice) name their sweep
    seen: dict[tuple[Any, ...], int] = {}
    for r in rows:
        k = (r.engine, r.device, r.gpus, r.mode, r.suite, r.concurrency, tuple(r.labels))
        seen[k] = seen.get(k, 0) + 1
    sweeps = any(n > 1 for n in seen.values())
    if modes:  # a row's speculative side is EAGLE-3's: the measured columns say "speculative", each row its mode
        header = [h if h.startswith("card") else h.replace("DFlash", "speculative") for h in header]
    body = []
    for r in rows:
        a, d = r.ar or CellLine(engine=r.engine, mode="ar", suite=r.suite, concurrency=r.concurrency, device=r.device), \
            r.dflash or CellLine(engine=r.engine, mode="dflash", suite=r.suite, concurrency=r.concurrency, device=r.device)
        machine = f"{r.device} ({r.gpus})" if r.gpus and r.device != "no GPU" else r.device
        body.append([
            r.engine, r.mode_name if r.dflash else "-", (r.dflash or r.ar or a).source, machine, r.suite, str(r.concurrency), number(a.tok_s), number(d.tok_s),
            "-" if r.speedup is None else f"{r.speedup:.2f}x", _per(a.tok_s, r.gpus, r.device, gpu_view),
            _per(d.tok_s, r.gpus, r.device, gpu_view), f"{number(a.ttft_ms_p50)} / {number(d.ttft_ms_p50)}",
            f"{number(a.tpot_ms_p50, 2)} / {number(d.tpot_ms_p50, 2)}", number(d.tau, 2), number(r.reference_tau, 2),
            f"{number(r.card_ar, 0)} / {number(r.card_dflash, 0)}",
            "-" if r.card_speedup is None else f"{r.card_speedup:.1f}x", number(r.card_tau, 2), "; ".join(r.labels) or "-",
        ])
    # a column that only some tables fill (no card for the pair, no builtin engine beside another, nothing unlike
    # the card) is left out where no row fills it
    keep = [i for i, h in enumerate(header) if (h != "mode" or modes) and (h != "sweep" or sweeps) and
            (h not in OPTIONAL or any(row[i] not in ("-", "- / -") for row in body))]
    return [header[i] for i in keep], [[row[i] for i in keep] for row in body]


OPTIONAL = {"τ builtin (reference)", "card: AR / DFlash tok/s", "card: DFlash / AR", "card: τ", "not the card's"}
TEXT_COLUMNS = {"engine", "mode", "sweep", "machine (GPUs per server)", "suite", "not the card's"}  # the rest are numbers


def device_of(hardware: dict[str, Any]) -> str:
    """'2x NVIDIA H100 80GB HBM3': the GPUs a sweep's manifest lists; 'no GPU' where it lists none (a CPU run)."""
    names = [str(g.get("name", "GPU")) if isinstance(g, dict) else str(g) for g in hardware.get("gpus") or []]
    return f"{len(names)}x {names[0]}" if names else "no GPU"


def view_lines(view: Any) -> list[CellLine]:
    """The complete cells of one report view (report/views.SweepView), one CellLine per repeat."""
    m = view.manifest
    device = device_of(m.hardware.model_dump() if hasattr(m.hardware, "model_dump") else dict(m.hardware or {}))
    args = list(m.settings.engine_args) if m.settings else []
    workload = workload_of(m.settings.model_dump(mode="json") if m.settings else None)
    routed = {key for key, server in (m.servers or {}).items()
              if server.engine and profiles.get(server.engine).routes_at_random(server.env_names)}
    out = []
    frame = view.frame
    done = frame[frame["status"].isin(["complete", "partial"])] if not frame.empty else frame
    for rec in done.to_dict("records"):
        synthetic = rec.get("synthetic_acceptance")
        out.append(CellLine(
            engine=rec["engine"], mode=rec["mode"], suite=rec["suite"], concurrency=int(rec["concurrency"]),
            device=device, gpus=view.gpus, tok_s=_f(rec.get("output_throughput")), ttft_ms_p50=_f(rec.get("ttft_ms_p50")),
            tpot_ms_p50=_f(rec.get("tpot_ms_p50")), tau=_f(rec.get("acceptance_length")) if rec["mode"] != "ar" else None,
            weights=weights_of(args, rec["engine"]), synthetic_tau=_f(synthetic),
            synthetic_source=_text(rec.get("synthetic_source")), source=m.sweep_id,
            repeat=int(rec.get("repeat") or 0), workload=workload, input_len=int(rec.get("input_len") or 0),
            routed_at_random=f"{rec['engine']}-{rec['mode']}" in routed))
    return out


def _f(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if f != f else f  # NaN: not measured


def _text(v: Any) -> str | None:
    """A text column's value, None where the cell has none (pandas reads a missing one as NaN, a float)."""
    return v if isinstance(v, str) and v else None

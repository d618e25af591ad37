"""Token-level lossless check: at temperature 0 DFlash must emit the AR target's own tokens.

For every AR cell and its DFlash cell (same CellKey but the mode: `CellKey.pair_key`), requests
are paired by prompt id and turn (warm-up excluded; a prompt sent twice pairs by its occurrence), and
their saved token ids compared:

- identical or not, and the first divergence position;
- the AR side's top-1 minus top-2 logprob at that position (`margin`, nats). A margin at or below
  `near_tie` (default NEAR_TIE_NATS) is labelled a near-tie numerical flip (verify and decode kernels may
  round differently); above it, a `mismatch` (suspect a real bug). No logprobs saved: `unknown`;
  one output a strict prefix of the other: `length`;
- whether the divergence fell inside an accepted draft block, where the DFlash stream's chunk boundaries
  tell (one chunk = one verify step: its tokens but the last are accepted drafts, the last is the
  target's bonus token). None when they cannot tell (first chunk, no chunk data).

`annotate_sweep` writes the per-prompt rows to `cells/<dflash-cell>/lossless.jsonl`, the aggregates to the
DFlash summary's `lossless` field (a store.LosslessSummary), and rebuilds results.csv. Example texts in the
summary are raw model output: whoever shows them escapes them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Literal

from pydantic import BaseModel

from dflash_bench.metrics.stats import percentile
from dflash_bench.store import (
    MEASURED, SPECULATIVE, CellSummary, LosslessSummary, RequestRecord, StoreError, SweepDir, atomic_write_text, read_text,
)
from dflash_bench.store.layout import present
from dflash_bench.store.reading import parse_json

__all__ = ["LosslessSummary", "Comparison", "annotate_sweep", "compare_cells", "read_comparisons", "summarize"]

# AR top-1 minus top-2 logprob at or below this: a near-tie numerical flip (the summary's default records it)
NEAR_TIE_NATS: float = LosslessSummary.model_fields["near_tie_threshold_nats"].default
LOSSLESS_FILE = "lossless.jsonl"
MAX_EXAMPLES = 5
EXCERPT_BEFORE, EXCERPT_AFTER = 60, 120

Kind = Literal["identical", "near_tie", "mismatch", "length", "unknown"]


class Comparison(BaseModel):
    """One prompt turn: the AR output against the DFlash output."""

    prompt_id: str
    turn: int = 0
    occurrence: int = 0  # k-th time this prompt turn was sent in the cell
    kind: Kind
    position: int | None = None  # first index where the token ids differ
    ar_len: int
    dflash_len: int
    ar_token: int | None = None
    dflash_token: int | None = None
    margin: float | None = None  # AR top-1 minus top-2 logprob at `position`
    dflash_is_ar_runner_up: bool | None = None  # DFlash took the AR side's second choice
    dflash_margin: float | None = None  # the same margin on the DFlash side, where saved
    in_accepted_draft: bool | None = None

    @property
    def identical(self) -> bool:
        return self.kind == "identical"


# ---------------------------------------------------------------- one prompt


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token; the shorter length when one is a prefix of the other; None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def top2_margin(top: list[tuple[int, float]] | list[list] | None) -> tuple[float | None, int | None]:
    """(top-1 minus top-2 logprob, runner-up token id) of one position's top logprobs."""
    if not top or len(top) < 2:
        return None, None
    ranked = sorted(((int(t), float(lp)) for t, lp in top), key=lambda x: -x[1])
    return ranked[0][1] - ranked[1][1], ranked[1][0]


def in_accepted_draft(chunk_tokens: list[int], position: int) -> bool | None:
    """Was `position` an accepted draft token? Chunk j covers [cum[j-1], cum[j]); its last token is the bonus.

    None where the chunks cannot tell: no chunk data, the position beyond them, or the first chunk
    (which holds the prefill token and maybe more).
    """
    prev = 0
    for j, cum in enumerate(chunk_tokens):
        if prev <= position < cum:
            if j == 0 and cum - prev > 1:
                return None
            return position < cum - 1
        prev = cum
    return None


def compare(ar: RequestRecord, df: RequestRecord, near_tie: float = NEAR_TIE_NATS, occurrence: int = 0) -> Comparison:
    """Compare the token ids of one AR request and its DFlash partner (both must carry token ids)."""
    a, b = ar.token_ids or [], df.token_ids or []
    pos = first_divergence(a, b)
    base = dict(prompt_id=ar.prompt_id, turn=ar.turn, occurrence=occurrence, ar_len=len(a), dflash_len=len(b))
    if pos is None:
        return Comparison(kind="identical", **base)
    ar_tok = a[pos] if pos < len(a) else None
    df_tok = b[pos] if pos < len(b) else None
    margin, runner_up = top2_margin(_at(ar.top_logprobs, pos))
    df_margin, _ = top2_margin(_at(df.top_logprobs, pos))
    if ar_tok is None or df_tok is None:
        kind: Kind = "length"
    elif margin is None or not math.isfinite(margin):
        kind = "unknown"
    else:
        kind = "near_tie" if margin <= near_tie else "mismatch"
    return Comparison(
        kind=kind, position=pos, ar_token=ar_tok, dflash_token=df_tok, margin=margin,
        dflash_is_ar_runner_up=None if runner_up is None or df_tok is None else runner_up == df_tok,
        dflash_margin=df_margin, in_accepted_draft=in_accepted_draft(df.chunk_tokens, pos), **base,
    )


def _at(top: list | None, pos: int) -> list | None:
    return top[pos] if top is not None and pos < len(top) else None


def excerpt(ar_text: str | None, df_text: str | None) -> dict:
    """Raw text around the first differing character of the two outputs (escape before showing)."""
    x, y = ar_text or "", df_text or ""
    i = next((k for k, (c, d) in enumerate(zip(x, y)) if c != d), min(len(x), len(y)))
    lo = max(0, i - EXCERPT_BEFORE)
    return {"char_offset": i, "excerpt_start": lo, "ar_text": x[lo:i + EXCERPT_AFTER], "dflash_text": y[lo:i + EXCERPT_AFTER]}


# ---------------------------------------------------------------- one pair of cells


def _measured(records: Iterable[RequestRecord]) -> dict[tuple[str, int, int], RequestRecord]:
    """(prompt_id, turn, occurrence) -> record, warm-up excluded, in send order."""
    seen: dict[tuple[str, int], int] = defaultdict(int)
    out = {}
    for r in sorted((r for r in records if not r.warmup), key=lambda r: r.t_send):
        k = seen[(r.prompt_id, r.turn)]
        seen[(r.prompt_id, r.turn)] += 1
        out[(r.prompt_id, r.turn, k)] = r
    return out


def compare_cells(ar_records: list[RequestRecord], df_records: list[RequestRecord],
                  near_tie: float = NEAR_TIE_NATS) -> tuple[list[Comparison], dict[str, int], list[dict]]:
    """Per-prompt comparisons, counts of what could not be compared (by reason), and example excerpts."""
    ar, df = _measured(ar_records), _measured(df_records)
    skipped: dict[str, int] = defaultdict(int)
    skipped["unpaired"] = len(set(ar) ^ set(df))
    rows: list[Comparison] = []
    examples: list[dict] = []
    diverged: set[tuple[str, int]] = set()  # (prompt_id, occurrence) whose conversation already differs
    for key in sorted(set(ar) & set(df), key=lambda k: (k[0], k[2], k[1])):
        pid, turn, occ = key
        a, d = ar[key], df[key]
        if not (a.ok and d.ok):
            skipped["failed"] += 1
        elif a.token_ids is None or d.token_ids is None:
            skipped["no_token_ids"] += 1
        elif (pid, occ) in diverged:
            skipped["earlier_turn_diverged"] += 1
        else:
            c = compare(a, d, near_tie, occ)
            rows.append(c)
            if not c.identical:
                diverged.add((pid, occ))
                if len(examples) < MAX_EXAMPLES:
                    examples.append({"prompt_id": pid, "turn": turn, "position": c.position, "kind": c.kind,
                                     "margin": c.margin, **excerpt(a.output_text, d.output_text)})
    return rows, {k: v for k, v in skipped.items() if v}, examples


def summarize(rows: list[Comparison], skipped: dict[str, int], examples: list[dict],
              near_tie: float = NEAR_TIE_NATS, ar_cell: str | None = None) -> LosslessSummary:
    div = [r for r in rows if not r.identical]
    kinds: dict[str, int] = defaultdict(int)
    for r in div:
        kinds[r.kind] += 1
    positions = sorted(r.position for r in div if r.position is not None)
    return LosslessSummary(
        status="ok" if rows else "nothing to compare: " + (", ".join(f"{k} {v}" for k, v in skipped.items()) or "no requests"),
        ar_cell=ar_cell, n=len(rows), identical=len(rows) - len(div),
        exact_match_rate=(len(rows) - len(div)) / len(rows) if rows else None,
        near_tie_threshold_nats=near_tie, divergences=dict(kinds),
        in_accepted_draft=sum(r.in_accepted_draft is True for r in div),
        at_target_token=sum(r.in_accepted_draft is False for r in div),
        first_divergence=_stats(positions), divergence_histogram=_histogram(positions),
        not_compared=skipped, examples=examples,
    )


def _stats(xs: list[int]) -> dict[str, float | int | None]:
    """n, min, p50, p90, mean, max of sorted positions (percentiles as everywhere else: metrics.stats)."""
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "min": xs[0], "p50": percentile(xs, 50), "p90": percentile(xs, 90),
            "mean": sum(xs) / len(xs), "max": xs[-1]}


def _histogram(xs: list[int]) -> dict[str, list[int]]:
    """Power-of-two bins: [0,1), [1,2), [2,4), [4,8), ... up to the largest position."""
    if not xs:
        return {}
    edges = [0, 1]
    while edges[-1] <= xs[-1]:
        edges.append(edges[-1] * 2)
    counts = [sum(lo <= x < hi for x in xs) for lo, hi in zip(edges, edges[1:])]
    return {"lower_edges": edges[:-1], "counts": counts}


# ---------------------------------------------------------------- the sweep folder


def annotate_sweep(sweep_dir: Path | str, near_tie: float = NEAR_TIE_NATS) -> dict[str, LosslessSummary]:
    """Compare every complete cell of a speculative mode (DFlash, EAGLE-3) with its AR partner; write the results
    into the sweep folder.

    Returns the speculative cell's id -> LosslessSummary. Idempotent: running it again rewrites the same files.
    """
    sweep = SweepDir.open(Path(sweep_dir))
    done = [s for s in sweep.summaries() if s.status in MEASURED]
    ar_cells = {s.pair_key(): s for s in done if s.mode == "ar"}
    out: dict[str, LosslessSummary] = {}
    for df in (s for s in done if s.mode in SPECULATIVE):
        ar = ar_cells.get(df.pair_key())
        if ar is None:
            continue
        out[df.cell_id] = _annotate_pair(sweep, ar, df, near_tie)
    sweep.write_results_csv()
    return out


def _annotate_pair(sweep: SweepDir, ar: CellSummary, df: CellSummary, near_tie: float) -> LosslessSummary:
    temps = {float(s.settings.temperature or 0.0) for s in (ar, df)}
    if max(temps) > 0:
        result = LosslessSummary(status=f"not checked: temperature {max(temps):g} > 0 (tokens match only at temperature 0)",
                                 ar_cell=ar.cell_id, near_tie_threshold_nats=near_tie)
        rows: list[Comparison] = []
    else:
        rows, skipped, examples = compare_cells(sweep.read_requests(ar.cell_id), sweep.read_requests(df.cell_id), near_tie)
        result = summarize(rows, skipped, examples, near_tie, ar.cell_id)
        if not rows and skipped.get("no_token_ids"):
            result.status = "nothing to compare: no token ids saved (run the sweep with --save-token-ids)"
    text = "".join(r.model_dump_json() + "\n" for r in rows)
    atomic_write_text(sweep.cell_dir(df.cell_id) / LOSSLESS_FILE, text)
    df.lossless = result
    sweep.write_summary(df)
    return result


def read_comparisons(sweep_dir: Path | str, dflash_cell: str) -> list[Comparison]:
    """The per-prompt rows `annotate_sweep` wrote for one DFlash cell (empty if none)."""
    file = SweepDir(Path(sweep_dir)).cell_dir(dflash_cell) / LOSSLESS_FILE
    if not present(file):
        return []
    try:
        return [Comparison.model_validate(parse_json(line)) for line in read_text(file).splitlines() if line.strip()]
    except ValueError:  # pydantic's ValidationError, or JSON no writer writes (store.reading.parse_json)
        raise StoreError(f"{file} holds a line that is not a lossless comparison; it is damaged (run "
                         "`dflash-bench quality` on the folder again)") from None

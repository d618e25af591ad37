"""What the gate shows and writes: a terminal table (rich), a markdown summary for a PR comment, JUnit XML.

Cell and suite names come from sweep folders, so every output escapes them for its format.
"""

from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
from rich import box
from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from dflash_bench.speedup import speedup_of
from dflash_bench.console import new_console
from dflash_bench.gate.baseline import Baseline
from dflash_bench.gate.compare import Check, GateResult, level
from dflash_bench.gate.reference import REFERENCE_TAU, tolerance
from dflash_bench.store import atomic_write_text

VERDICT_STYLE = {"fail": "bold red", "improved": "green", "pass": "", "skipped": "yellow"}


# ---------------------------------------------------------------- numbers as text


def pct(x: float | None) -> str:
    if x is None or not np.isfinite(x):
        return "n/a" if x is None else ("+inf" if x > 0 else "-inf")
    return f"{x * 100:+.1f}%" if abs(x) >= 5e-4 else "+0.0%"


def value(chk: Check, values: list[float]) -> str:
    """One side's value of a check: the mean of its repeats, but a speedup as the report shows it (the median of
    the repeats' ratios: speedup.py speedup_of), so a cell has one speedup wherever it is shown."""
    if not values:
        return "-"
    shown = speedup_of(values) if chk.metric.threshold == "speedup" else float(np.mean(values))
    text = f"{shown:.4g}"
    if len(values) < 2:
        return text
    return f"{text} (median of {len(values)})" if chk.metric.threshold == "speedup" else f"{text} (n={len(values)})"


def interval(chk: Check) -> str:
    return f"{pct(chk.ci[0])} .. {pct(chk.ci[1])}" if chk.ci else ""


def summary(chk: Check, confidence: float = 0.95) -> str:
    """One line: what changed, how it was judged, what was allowed."""
    label = chk.metric.label
    if chk.metric.explained and chk.note:
        return chk.note
    if chk.change is None:
        return f"{label}: {chk.note}"
    if chk.method == "bootstrap":
        how = f"{level(chk.confidence or confidence)} CI {interval(chk)}, {len(chk.baseline)} vs {len(chk.current)} repeats"
    elif chk.method == "plain":
        how = f"plain threshold, {len(chk.baseline)} vs {len(chk.current)} repeats"
    else:
        how = "tight threshold"
    return f"{label} {pct(chk.change)} ({how}); allowed {pct(chk.allowed)}"


def details(chk: Check) -> str:
    return "\n".join([
        f"cell: {chk.cell}",
        f"metric: {chk.metric.name} ({'higher' if chk.metric.higher_is_better else 'lower'} is better)",
        f"method: {chk.method}",
        f"baseline: {_list(chk.baseline)}",
        f"sweep: {_list(chk.current)}",
        f"change of the means: {pct(chk.change)}" + (f"; interval {interval(chk)}" if chk.ci else ""),
        f"allowed: {pct(chk.allowed)}",
    ] + ([f"note: {chk.note}"] if chk.note else []))


def _list(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.6g}" for v in values) + "]" + (f" mean {np.mean(values):.6g}" if values else "")


def counts(result: GateResult) -> dict[str, int]:
    out = {v: 0 for v in ("pass", "fail", "improved", "skipped")}
    for chk in result.checks:
        out[chk.verdict] += 1
    return out


# ---------------------------------------------------------------- terminal


def print_table(result: GateResult, console: Console | None = None) -> None:
    """The checks, each cell's under its name, in as many columns as the console holds: the change, what was
    allowed and the verdict always; the method and the interval where there is room (at 80 columns the failures'
    lines below give them)."""
    if console is None:
        console = new_console()
    conf = result.config.bootstrap.confidence
    console.print(Text(f"gate: {result.sweep} against {result.baseline}", style="bold", overflow="fold"))
    console.print(terminal_table(result.checks, console.width, conf))
    for line in _side_lines(result):
        console.print(Text(line, overflow="fold"))
    console.print(Text(verdict_line(result), style="bold red" if not result.passed else "bold green"))
    for chk in result.failures:
        console.print(Padding(Text(f"{chk.cell}: {summary(chk, conf)}", overflow="fold"), (0, 0, 0, 2)))


LABEL_WORDS = 12  # the narrowest the metric column gets: its labels fold at words ("acceptance", "throughput")
GAP = 3  # between two columns: a space each side of the (blank) rule


def terminal_table(checks: list[Check], width: int, confidence: float = 0.95) -> Table:
    """The checks as a table no wider than `width` (from 80 columns up) with no word split: a row with each cell's
    name, then a row per metric; the method and the interval columns only where they fit."""
    rows = [(chk, _shown(chk, chk.baseline), _shown(chk, chk.current), pct(chk.change) if chk.change is not None else "",
             pct(chk.allowed), chk.method, interval(chk)) for chk in checks]
    names = max([len(c.cell) for c in checks] + [len("cell / metric")])
    labels = max([len(c.metric.label) + 2 for c in checks] + [0])
    fixed = [("baseline", 1), ("sweep", 2), ("change", 3), ("allowed", 4), ("verdict", 0)]
    optional = [("method", 5), ("interval", 6)]

    def need(col: str, i: int) -> int:
        return max([len(col)] + [len(r[0].verdict if i == 0 else str(r[i])) for r in rows])

    used = sum(need(c, i) + GAP for c, i in fixed)
    shown = []
    for col, i in optional:  # each where the names still fit beside it
        if used + need(col, i) + GAP + names <= width:
            shown.append((col, i))
            used += need(col, i) + GAP
    columns = fixed[:4] + shown + fixed[4:]
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("cell / metric", width=max(min(max(names, labels), width - used), LABEL_WORDS))
    for col, i in columns:
        table.add_column(col, justify="right" if i in (1, 2, 3, 4) else "left", no_wrap=True, min_width=need(col, i))
    cell = None
    for r in rows:
        chk = r[0]
        if chk.cell != cell:
            cell = chk.cell
            table.add_row(Text(cell, style="bold", overflow="fold"), *[""] * len(columns))
        values = [Text(chk.verdict, style=VERDICT_STYLE[chk.verdict]) if i == 0 else str(r[i]) for _, i in columns]
        table.add_row(Padding(Text(chk.metric.label), (0, 0, 0, 2)), *values)
    return table


def _shown(chk: Check, values: list[float]) -> str:
    """A side's value in the terminal table: as `value` shows it, without the count of repeats."""
    return value(chk, values).split(" (")[0]


def _side_lines(result: GateResult) -> list[str]:
    lines = []
    if result.missing:
        how = "fails the gate" if result.missing_fails else "not gated"
        lines.append(f"missing from the sweep ({how}): {', '.join(result.missing)}")
    if result.new:
        lines.append(f"new in the sweep, not in the baseline (not gated): {', '.join(result.new)}")
    lines += [f"note: {n}" for n in result.notes]
    return lines


def verdict_line(result: GateResult) -> str:
    c = counts(result)
    tail = f"{len(result.checks)} checks: {c['pass']} pass, {c['improved']} improved, {c['fail']} failed, {c['skipped']} skipped"
    if result.passed:
        return f"PASS: {tail}"
    reasons = [f"{len(result.failures)} regression(s)"] if result.failures else []
    if result.missing_fails:
        reasons.append(f"{len(result.missing)} cell(s) missing")
    return f"FAIL ({', '.join(reasons)}): {tail}"


def print_export(baseline: Baseline, output: Path) -> None:
    cells = [c for c in baseline.cells if c.repeats]
    most = max((len(c.repeats) for c in cells), default=0)
    noisy = [c for c in cells if c.noise]
    noise = (f"; run-to-run noise measured over {max(c.noise_runs for c in noisy)} runs for {len(noisy)} cells"
             if noisy else "")
    new_console().print(Text(f"wrote {output}: {len(cells)} cells (up to {most} repeats each) of sweep "
                             f"{baseline.sweep_id}{noise}"), soft_wrap=True)


# ---------------------------------------------------------------- markdown (PR comment)


def md(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return html.escape(str(text), quote=False).replace("|", "\\|").replace("\n", " ")


def markdown(result: GateResult) -> str:
    conf = result.config.bootstrap.confidence
    c = counts(result)
    head = ":white_check_mark: pass" if result.passed else ":x: regression"
    t = result.config.thresholds
    lines = [
        f"## dflash-bench gate: {head}",
        "",
        md(verdict_line(result)) + ".",
        "",
        f"Sweep {md(result.sweep)} against baseline {md(result.baseline)}. Allowed changes: acceptance length "
        f"{t.acceptance_length:.0%}, throughput {t.throughput:.0%}, TPOT {t.tpot:.0%}, speedup {t.speedup:.0%}, "
        f"exact match {t.exact_match:.0%}, task accuracy {t.accuracy:.0%}; noisy metrics with repeats fail only when the whole "
        "bootstrap interval (each side's repeats and the baseline's run-to-run noise) is past the threshold, the "
        f"intervals together held at {conf:.0%} confidence." + _reference_line(result),
        "",
    ]
    if result.failures:
        lines += ["### Regressions", "", *_md_table(result.failures, conf), ""]
        said = [f"- {md(c.note)}" for c in result.failures if c.metric.explained and c.note]
        lines += [*said, ""] if said else []
    side = _side_lines(result)
    if side:
        lines += [f"- {md(s)}" for s in side] + [""]
    if c["improved"]:
        lines += [f"{c['improved']} check(s) improved past their threshold: consider exporting a new baseline.", ""]
    lines += ["<details><summary>All checks</summary>", "", *_md_table(result.checks, conf), "", "</details>", ""]
    return "\n".join(lines)


def _reference_line(result: GateResult) -> str:
    """The reference check's tolerance, where the sweep had one (gate/reference.py)."""
    if not any(c.metric is REFERENCE_TAU for c in result.checks):
        return ""
    t = tolerance(result.config)
    return (f" Another engine's τ against the builtin engine's (the reference) on the same pair: {t:.0%} below it "
            "allowed, by the same rule.")


def _md_table(checks: list[Check], confidence: float) -> list[str]:
    rows = ["| cell | metric | method | baseline | sweep | change | interval | allowed | verdict |",
            "|---|---|---|---:|---:|---:|---|---:|---|"]
    for chk in checks:
        change = pct(chk.change) if chk.change is not None else md(chk.note)
        verdict = f"**{chk.verdict}**" if chk.verdict == "fail" else chk.verdict
        cells = [md(chk.cell), md(chk.metric.label), chk.method, value(chk, chk.baseline), value(chk, chk.current),
                 change, interval(chk), pct(chk.allowed), verdict]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def write_markdown(result: GateResult, path: Path) -> None:
    atomic_write_text(Path(path), markdown(result))


# ---------------------------------------------------------------- JUnit XML


def junit_xml(result: GateResult) -> str:
    """One test case per gated metric and cell, plus one per baseline cell missing from the sweep."""
    conf = result.config.bootstrap.confidence
    c = counts(result)
    missing_failures = len(result.missing) if result.missing_fails else 0
    root = ET.Element("testsuites")
    suite = ET.SubElement(root, "testsuite", {
        "name": "dflash-bench gate",
        "tests": str(len(result.checks) + len(result.missing)),
        "failures": str(c["fail"] + missing_failures),
        "errors": "0",
        "skipped": str(c["skipped"] + len(result.missing) - missing_failures),
        "time": "0",
    })
    props = ET.SubElement(suite, "properties")
    for name, val in (("sweep", result.sweep), ("baseline", result.baseline),
                      ("thresholds", result.config.thresholds.model_dump_json()),
                      ("bootstrap", result.config.bootstrap.model_dump_json())):
        ET.SubElement(props, "property", name=name, value=val)
    for chk in result.checks:
        case = ET.SubElement(suite, "testcase", classname=_classname(chk.cell), name=chk.metric.label, time="0")
        if chk.verdict == "fail":
            ET.SubElement(case, "failure", message=summary(chk, conf), type="regression").text = details(chk)
        elif chk.verdict == "skipped":
            ET.SubElement(case, "skipped", message=chk.note)
        else:
            ET.SubElement(case, "system-out").text = details(chk)
    for cell in result.missing:
        case = ET.SubElement(suite, "testcase", classname=_classname(cell), name="present in the sweep", time="0")
        message = "in the baseline, missing from the sweep"
        ET.SubElement(case, "failure" if result.missing_fails else "skipped", message=message)
    _xml_safe(root)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml_safe(element: ET.Element) -> None:
    """Drop characters XML 1.0 cannot hold (terminal escapes in a server's failure reason, ...)."""
    for el in element.iter():
        el.attrib = {k: _NOT_XML.sub("", v) for k, v in el.attrib.items()}
        if el.text:
            el.text = _NOT_XML.sub("", el.text)


def _classname(cell: str) -> str:
    return "dflash_bench.gate." + cell.replace("/", ".")


def write_junit(result: GateResult, path: Path) -> None:
    atomic_write_text(Path(path), junit_xml(result))

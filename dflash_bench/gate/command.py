"""The `gate` command: export a baseline, or gate a sweep and write its reports."""

from __future__ import annotations

from pathlib import Path

from dflash_bench.errors import UserError
from dflash_bench.gate import output as show
from dflash_bench.gate.baseline import collect, export_baseline, load_baseline
from dflash_bench.gate.compare import GateResult, compare, set_aside
from dflash_bench.gate.config import GateConfig, load_config
from dflash_bench.gate.noise import export_with_noise
from dflash_bench.gate.reference import reference_checks
from dflash_bench.gate.slo import slo_checks
from dflash_bench.slo import parse_slo


def gate(sweep_dir: Path | str, baseline: Path | str, config: GateConfig | None = None,
         slo: str | None = None) -> GateResult:
    """Load both sides and compare them; with an SLO (`slo`, else the sweep's own --slo) also at the target; where
    the sweep holds the builtin engine and another, also their tau (gate/reference.py)."""
    target = parse_slo(slo) if slo is not None else None
    base = load_baseline(baseline)
    sweep = collect(sweep_dir)
    result = compare(sweep, base, config, sweep_label=str(sweep_dir), baseline_label=str(baseline))
    result.checks += reference_checks(sweep, result.config)  # the sweep's other engines against its builtin one
    saved = sweep.provenance.settings.slo if sweep.provenance.settings is not None else None
    if target is None and saved:
        target = parse_slo(saved)
    if target is not None:
        at_slo = slo_checks(sweep, base, target, result.config)
        if result.machine is not None:
            set_aside(at_slo, result.machine)
        result.checks += at_slo
        result.notes.append(f"SLO read off on both sides: {target.label()}")
    return result


def main(sweep_dir: Path, *, baseline: Path | None = None, export: bool = False, output: Path | None = None,
         thresholds: Path | None = None, junit: Path | None = None, markdown: Path | None = None,
         slo: str | None = None, noise_from: list[Path] | None = None) -> int:
    """The `gate` command: export a baseline, or gate a sweep and write the reports; returns the exit code."""
    if export:
        if output is None:
            raise UserError("--export-baseline needs -o FILE, the baseline file to write")
        if baseline or thresholds or junit or markdown or slo:
            raise UserError("--export-baseline only writes a baseline; leave out --baseline, --thresholds, --junit, "
                            "--markdown and --slo")
        written = export_with_noise(sweep_dir, output, noise_from) if noise_from else export_baseline(sweep_dir, output)
        show.print_export(written, output)
        return 0
    if noise_from:
        raise UserError("--noise-from measures the noise a baseline carries: use it with --export-baseline")
    if output is not None:
        raise UserError("-o is for --export-baseline; use --junit FILE or --markdown FILE for the gate's reports")
    if baseline is None:
        raise UserError("give --baseline, a sweep folder or a file written by `dflash-bench gate --export-baseline`")
    config = load_config(thresholds)
    result = gate(sweep_dir, baseline, config, slo=slo)
    show.print_table(result)
    if junit is not None:
        show.write_junit(result, junit)
    if markdown is not None:
        show.write_markdown(result, markdown)
    return result.exit_code

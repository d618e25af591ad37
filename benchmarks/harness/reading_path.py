"""How much code a newcomer reads to follow one prompt from a suite file to a results.csv row and a figure.

Runs, in this process, `dflash-bench sweep` against the timing emulator (one suite, one concurrency, one
prompt per mode) and then `dflash-bench report` on the folder, with a tracer that records every function of
dflash_bench that runs. The emulator itself runs in its own process and is not counted: it stands in for the
server. What is counted is what the harness executes:

- files: the dflash_bench Python modules with at least one function that ran (templates are not counted);
- function lines: per file, the union of the line spans (first to last line) of the functions that ran, so
  a nested function is not counted twice. Module-level code and class bodies (imports, schema fields) are
  not counted.

    python -m benchmarks.harness.reading_path --data-dir ../shared/datasets [--json out.json]
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import tempfile
import threading
from pathlib import Path
from types import CodeType

ROOT = Path(__file__).resolve().parents[2] / "dflash_bench"


def _span(code: CodeType) -> range:
    lines = [ln for _, _, ln in code.co_lines() if ln is not None]
    return range(min(lines, default=code.co_firstlineno), max(lines, default=code.co_firstlineno) + 1)


def trace(argvs: list[list[str]]) -> dict[str, set[int]]:
    """Run each command line of the CLI in turn; the line numbers of every dflash_bench function that ran."""
    from dflash_bench import cli

    seen: set[CodeType] = set()

    def profiler(frame, event, _arg):
        if event == "call" and frame.f_code.co_flags & inspect.CO_NEWLOCALS:  # functions, not module or class bodies
            seen.add(frame.f_code)

    sys.setprofile(profiler)
    threading.setprofile(profiler)
    try:
        for argv in argvs:
            try:
                cli.app(argv, standalone_mode=False)
            except SystemExit as exc:
                if exc.code not in (0, None):
                    raise
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    out: dict[str, set[int]] = {}
    for code in seen:
        path = Path(code.co_filename).resolve()
        if ROOT in path.parents and path.suffix == ".py" and not code.co_name.startswith("<"):  # comprehensions count with their function
            out.setdefault(str(path.relative_to(ROOT.parent)), set()).update(_span(code))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--suite", default="gsm8k")
    ap.add_argument("--json", type=Path, help="also write the per-file counts here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sweep = ["sweep", "--model", "org/emulated", "--drafter", "org/emulated-d", "--engine", "emulator",
                 "--suites", args.suite, "--concurrency", "1", "--num-prompts", "1", "--max-tokens", "16",
                 "--engine-arg=--itl-ms=1", "--engine-arg=--ttft-ms=1", "--out", tmp, "--data-dir", args.data_dir]
        files = trace([sweep])
        folder = next(p for p in Path(tmp).iterdir() if p.is_dir())
        for name, lines in trace([["report", str(folder)]]).items():
            files.setdefault(name, set()).update(lines)
    rows = sorted(((name, len(lines)) for name, lines in files.items()), key=lambda r: -r[1])
    for name, n in rows:
        print(f"{n:6d}  {name}")
    total = sum(n for _, n in rows)
    print(f"{len(rows)} files, {total} lines of functions")
    if args.json:
        args.json.write_text(json.dumps({"files": len(rows), "function_lines": total, "per_file": dict(rows)}, indent=2) + "\n")


if __name__ == "__main__":
    main()

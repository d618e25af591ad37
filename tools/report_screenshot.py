"""The README's picture of a report (docs/images/report.png), made the same way every time.

    python tools/report_screenshot.py --data-dir ../shared/datasets                  # the demo, then its report
    python tools/report_screenshot.py --sweep reports/SWEEP [--sweep ...] --out F.png  # any sweep folders

Without --sweep it runs `dflash-bench demo` (the embedded pair on this machine's CPU, about two minutes) into a
temporary folder. Then `dflash-bench report` over the sweeps, and headless Chromium (Debian's `chromium`, or
$DFLASH_BENCH_CHROMIUM) draws the page's first --height pixels at --width, offline, into --out.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars"]


def chromium() -> str:
    found = os.environ.get("DFLASH_BENCH_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        sys.exit("no Chromium here: install Debian's `chromium` (apt-get install chromium) or set DFLASH_BENCH_CHROMIUM")
    return found


def run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv[:4])} ... failed ({proc.returncode}): {proc.stderr.strip()[-1500:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweep", type=Path, action="append", default=[], help="a sweep folder (default: run the demo)")
    ap.add_argument("--data-dir", type=Path, help="the demo's offline prompt sets (dflash-bench demo --data-dir)")
    ap.add_argument("--out", type=Path, default=Path("docs/images/report.png"))
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=2000)
    args = ap.parse_args()
    browser = chromium()
    with tempfile.TemporaryDirectory(prefix="report-screenshot-") as tmp:
        work = Path(tmp)
        sweeps = list(args.sweep)
        if not sweeps:
            demo = [sys.executable, "-m", "dflash_bench", "demo", "--out", str(work / "demo")]
            run(demo + (["--data-dir", str(args.data_dir)] if args.data_dir else []))
            sweeps = sorted(p.parent for p in (work / "demo").glob("**/manifest.json"))
        page = work / "site" / "report.html"
        run([sys.executable, "-m", "dflash_bench", "report", *map(str, sweeps), "--out", str(page)])
        shot = work / "shot.png"
        run([browser, *FLAGS, f"--user-data-dir={work / 'profile'}", f"--screenshot={shot}",
             f"--window-size={args.width},{args.height}", page.as_uri()])
        args.out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, args.out)
    print(f"wrote {args.out} ({args.width} x {args.height} px) from {len(sweeps)} sweep(s)")


if __name__ == "__main__":
    main()

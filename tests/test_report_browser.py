"""The report in a real browser: headless Chromium (Debian's `chromium`, installed by .ci/run) renders it with no
console message, a screenshot that is not blank, and the planted `<script>` text as text."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from benchmarks.fixtures.report_sweeps import XSS, make_sweep
from services import service_missing

from dflash_bench.report import build_report

CHROMIUM = os.environ.get("DFLASH_BENCH_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def chromium_bin() -> str:  # every test here takes it, so each is marked `browser` (conftest.py)
    if CHROMIUM is None:
        service_missing("chromium", "chromium is not installed (apt-get install chromium; .ci/run does)")
    return CHROMIUM
CONSOLE = re.compile(r":CONSOLE[:(]\d*\)?\]\s*(.*)")


def chromium(page: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    """Run headless Chromium on a local file, offline, with console messages logged to stderr."""
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
           "--disable-dev-shm-usage",
           f"--user-data-dir={tmp / 'chromium-profile'}", "--enable-logging=stderr", "--v=0", *args, page.as_uri()]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    finally:  # chromium's helper processes share its session: none may outlive the test
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    assert proc.returncode == 0, err[-2000:]
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def console_messages(stderr: str) -> list[str]:
    return [m.group(1) for m in map(CONSOLE.search, stderr.splitlines()) if m]


class Dom(HTMLParser):
    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.title = ""
        self._in_title = False
        self.text: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self._in_title = tag == "title"

    def handle_endtag(self, tag):
        self._in_title = False

    def handle_data(self, data):
        self.text.append(data)
        if self._in_title:
            self.title += data


def test_console_detector_sees_errors(tmp_path):
    """The check below can fail: a page with a script error is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><body><p>x</p><script>undefined_function_xyz();</script></body></html>")
    msgs = console_messages(chromium(bad, tmp_path, "--dump-dom").stderr)
    assert any("undefined_function_xyz" in m for m in msgs), msgs


def test_report_renders_in_chromium(tmp_path):
    a = make_sweep(tmp_path / "h100", sweep_id=f"h100{XSS}", output_text=f"answer {XSS}",
                   failed={"vllm-dflash-mt-bench-c32": f"crash {XSS}"}, lossless=True)
    b = make_sweep(tmp_path / "cpu", engine="builtin", gpus=None, telemetry=False, concurrency=(1, 4),
                   failed={"builtin-ar-gsm8k-c4": "server exited with code 1"})
    page = build_report([a, b], tmp_path / "site" / "report.html")

    dom_run = chromium(page, tmp_path, "--dump-dom")
    assert console_messages(dom_run.stderr) == []  # no script error, no blocked resource, no CSP violation
    dom = Dom(dom_run.stdout)
    assert "script" not in dom.tags
    assert dom.title.startswith("DFlash speedup report")  # a planted script that ran would have set it to 'pwned'
    text = "".join(dom.text)
    assert f"answer {XSS}" in text and f"crash {XSS}" in text
    assert "Measured: engine vllm · 1× NVIDIA H100 80GB HBM3 · target Qwen/Qwen3-8B" in text  # what was measured, on top
    assert "Measured: engine builtin · CPU (no GPU recorded)" in text
    assert dom.tags.count("img") == len(list((page.parent / "figures").glob("*.png")))

    shot = tmp_path / "shot.png"
    run = chromium(page, tmp_path, f"--screenshot={shot}", "--window-size=1280,2400")
    assert console_messages(run.stderr) == []
    assert shot.exists()
    from PIL import Image, ImageStat

    img = Image.open(shot).convert("L")
    assert img.size == (1280, 2400)
    stat = ImageStat.Stat(img)
    assert stat.stddev[0] > 20, "screenshot is (nearly) one colour"
    colours = img.convert("RGB").resize((320, 600)).getcolors(maxcolors=1_000_000)
    assert colours is not None and len(colours) > 50  # text, tables and figures, not a blank page


LAYOUT = """<script>
window.addEventListener("load", () => {
  const over = (el) => el.scrollWidth > el.clientWidth + 1;
  const tables = [...document.querySelectorAll("#quality .scroll")];
  const out = {page: document.documentElement.scrollWidth, window: window.innerWidth,
               quality: tables.length, quality_cut: tables.filter(over).length,
               quality_rows: document.querySelectorAll("#quality table.quality tr").length - tables.length,
               not_scored: (document.querySelector("#quality").innerText.match(/not scored/gi) || []).length};
  const pre = document.createElement("pre");
  pre.id = "layout";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def layout(page: Path, tmp: Path, width: int) -> dict:
    """The page laid out by Chromium at `width` px: a copy with a measuring script (the report itself runs none,
    and its Content-Security-Policy forbids them), read back from the DOM Chromium dumps."""
    import json

    html = page.read_text()
    html = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", html).replace("</body>", LAYOUT + "</body>")
    measured = page.with_name("measured.html")
    measured.write_text(html)
    run = chromium(measured, tmp, "--dump-dom", f"--window-size={width},1000", "--virtual-time-budget=5000")
    found = re.search(r'<pre id="layout">(.*?)</pre>', run.stdout)
    assert found, run.stdout[-2000:]
    return json.loads(found.group(1).replace("&quot;", '"'))


def test_the_demos_report_fits_1400_px_with_one_quality_row_per_cell(tmp_path):
    """A CPU run's report as the demo writes it (one sweep, repeats, the lossless check run, accuracy not scored)
    at 1400 px: the quality table folds the repeats, says once what is left to score, and fits the page."""
    path = make_sweep(tmp_path / "demo", engine="builtin", gpus=None, telemetry=False, suites=("gsm8k", "humaneval",
                      "mt-bench"), concurrency=(1, 8), repeats=3, lossless=True)
    from dflash_bench.store import SweepDir
    from dflash_bench.store.manifest import ServerRecord

    sweep = SweepDir.open(path)
    for s in sweep.summaries():
        s.accuracy = None  # the demo never scores accuracy
        sweep.write_summary(s)
    manifest = sweep.read_manifest()  # as the demo records it: a host with no GPU, servers of one "GPU" each
    manifest.hardware = {"host": {"hostname": "box", "cpu": "AMD EPYC", "cpus": 2}, "gpus": []}
    for name in ("builtin-ar", "builtin-dflash"):
        manifest.servers[name] = ServerRecord(runner="process", url="http://127.0.0.1:8000", gpus=1,
                                              command=["dflash-bench", "serve", "--device", "cpu"])
    sweep.write_manifest(manifest)
    page = build_report([path], tmp_path / "site" / "report.html")
    got = layout(page, tmp_path, 1400)
    assert got["window"] == 1400 and got["page"] <= 1400, got  # nothing runs off the page
    assert got["quality"] == 1 and got["quality_cut"] == 0, got  # the quality table fits its column
    assert got["quality_rows"] == 3 * 2 and got["not_scored"] == 2, got  # a row per cell; once per kind of suite
    shot = tmp_path / "shot.png"
    run = chromium(page, tmp_path, f"--screenshot={shot}", "--window-size=1400,2400")
    assert console_messages(run.stderr) == []
    from PIL import Image, ImageStat

    img = Image.open(shot).convert("L")
    assert img.size == (1400, 2400) and ImageStat.Stat(img).stddev[0] > 20  # drawn, not blank
    text = " ".join(Dom(page.read_text()).text)
    assert "per GPU" not in text and "per server" in text  # a CPU run


SWEEP_LAYOUT = """<script>
window.addEventListener("load", () => {
  const visible = (el) => el.offsetParent !== null && !el.closest("details:not([open])");
  const over = (el) => el.scrollWidth > el.clientWidth + 1;
  const cut = [...document.querySelectorAll(".scroll")].filter(visible).filter(over)
    .map((el) => (el.closest("section") || {}).id + ": " + el.scrollWidth + " > " + el.clientWidth);
  const columns = [...document.querySelectorAll("#headline .cols > div")].map((el) => el.getBoundingClientRect().width);
  const out = {page: document.documentElement.scrollWidth, window: window.innerWidth, cut: cut, columns: columns,
               warnings: [...document.querySelectorAll("#headline .call.bad li")].length};
  const pre = document.createElement("pre");
  pre.id = "layout";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def test_four_sweeps_fit_1400_px_without_sideways_scrolling(tmp_path):
    """The mission's four sweeps of one model (vLLM, SGLang and the builtin engine with a random drafter, the builtin
    engine at a synthetic τ) at 1400 px: no table scrolls sideways, each sweep's column is wide enough for its
    tables, and a warning every DFlash cell of a sweep repeats is one line per sweep."""
    import json

    warning = "tau 1.00: the drafter's tokens were (almost) never accepted (0 accepted over {c}00 drafts)"
    common = dict(suites=("gsm8k", "mt-bench"), concurrency=(1, 8, 32), gpus=2, model="gemma-4-31B-it",
                  engine_args=("--load-format=dummy",))
    sweeps = [make_sweep(tmp_path / "vllm", engine="vllm", boost=0.9, warning=warning, **common),
              make_sweep(tmp_path / "sglang", engine="sglang", boost=0.85, warning=warning, **common),
              make_sweep(tmp_path / "builtin", engine="builtin", boost=0.95, warning=warning, **common),
              make_sweep(tmp_path / "builtin-tau", engine="builtin", synthetic=6.5, **common)]
    page = build_report(sweeps, tmp_path / "site" / "report.html")
    html = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page.read_text())
    measured = page.with_name("measured.html")
    measured.write_text(html.replace("</body>", SWEEP_LAYOUT + "</body>"))
    run = chromium(measured, tmp_path, "--dump-dom", "--window-size=1400,1000", "--virtual-time-budget=5000")
    got = json.loads(re.search(r'<pre id="layout">(.*?)</pre>', run.stdout).group(1).replace("&quot;", '"'))
    assert got["window"] == 1400 and got["page"] <= 1400, got  # nothing runs off the page
    assert got["cut"] == [], got  # no table, in any section, is wider than its column
    assert len(got["columns"]) == 4 and min(got["columns"]) >= 600, got  # two sweeps a row, not four narrow ones
    assert got["warnings"] == 3, got  # three sweeps' six warnings each: one line a sweep
    shot = tmp_path / "shot.png"
    run = chromium(page, tmp_path, f"--screenshot={shot}", "--window-size=1400,3000")
    assert console_messages(run.stderr) == []
    from PIL import Image, ImageStat

    img = Image.open(shot).convert("L")
    assert img.size == (1400, 3000) and ImageStat.Stat(img).stddev[0] > 20  # drawn, not blank

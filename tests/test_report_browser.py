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

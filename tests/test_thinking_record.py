"""Each cell records thinking as its rendered prompt shows it (thinking.record), through a whole sweep."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dflash_bench.launch import free_port
from dflash_bench.store import SweepDir, read_results_csv
from dflash_bench.thinking import record, template_hash

QWEN_LIKE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
             "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and "
             "enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}")


def tokenizer_folder(path: Path, template: str = QWEN_LIKE) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel({"[UNK]": 0, "hi": 1}, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]")
    fast.chat_template = template
    fast.save_pretrained(path)
    return path


def test_record_reads_the_rendered_prompt_not_the_flag(tmp_path):
    folder = tokenizer_folder(tmp_path / "tok")
    hi = [{"role": "user", "content": "hi"}]
    off, on, default = record(str(folder), hi, False), record(str(folder), hi, True), record(str(folder), hi, None)
    assert (off.mode, off.evidence) == ("off", "empty <think></think> block")
    assert on.mode == "on" and default.mode == "on"  # the template closes no block unless told: the model opens one
    assert off.template_hash == on.template_hash == template_hash(QWEN_LIKE)
    plain = record(str(tokenizer_folder(tmp_path / "plain", "{{ messages[0]['content'] }}")), hi, True)
    assert (plain.mode, plain.evidence) == ("off", "the chat template has no thinking mode")  # the flag is ignored
    gone = record(str(tmp_path / "missing"), hi, False)
    assert gone.mode == "unknown" and gone.evidence.startswith("the target's tokenizer is not on this machine")


@pytest.mark.parametrize("flag,mode", [("--no-thinking", "off"), ("--thinking=on", "on")])
def test_every_cell_of_a_sweep_records_its_thinking(tmp_path, data_dir, flag, mode):
    target = tokenizer_folder(tmp_path / "target")
    proc = subprocess.run([sys.executable, "-m", "dflash_bench", "sweep", "--model", str(target), "--drafter",
                           "org/d", "--engine", "emulator", "--suites", "gsm8k", "-c", "1", "-n", "2", "--max-tokens",
                           "8", "--port", str(free_port()), "--out", str(tmp_path / "out"), "--data-dir", str(data_dir),
                           flag], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (folder,) = [p for p in (tmp_path / "out").iterdir() if (p / "manifest.json").exists()]
    cells = SweepDir.open(folder).summaries()
    assert len(cells) == 2 and {(s.thinking, s.template_hash) for s in cells} == {(mode, template_hash(QWEN_LIKE))}
    assert {r.thinking for r in read_results_csv(folder / "results.csv")} == {mode}


def test_thinking_both_runs_every_cell_in_both_arms_and_the_report_pairs_them(tmp_path, data_dir):
    target = tokenizer_folder(tmp_path / "target")
    proc = subprocess.run([sys.executable, "-m", "dflash_bench", "sweep", "--model", str(target), "--drafter",
                           "org/d", "--engine", "emulator", "--suites", "gsm8k", "-c", "1,2", "-n", "2", "--max-tokens",
                           "8", "--port", str(free_port()), "--out", str(tmp_path / "out"), "--data-dir", str(data_dir),
                           "--thinking", "both", "--slo", "10"], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (folder,) = [p for p in (tmp_path / "out").iterdir() if (p / "manifest.json").exists()]
    cells = {s.cell_id: s for s in SweepDir.open(folder).summaries()}
    assert len(cells) == 8
    # each arm asked for its setting, and its rendered prompt shows it: the record follows the arm, not a default
    assert {(s.thinking_asked, s.thinking) for s in cells.values()} == {(False, "off"), (True, "on")}
    assert cells["emulator-dflash-gsm8k-c2-think"].thinking == "on"
    assert cells["emulator-ar-gsm8k-c1-nothink"].thinking == "off"
    assert "emulator / gsm8k / thinking on: at >= 10 tok/s/user" in proc.stdout
    assert "emulator / gsm8k / thinking off: at >= 10 tok/s/user" in proc.stdout
    report = subprocess.run([sys.executable, "-m", "dflash_bench", "report", str(folder)], capture_output=True,
                            text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    html = (folder / "report.html").read_text()
    assert "Thinking off and on, paired" in html and "gsm8k (thinking on)" in html and "gsm8k (thinking off)" in html
    assert "The model card beside this sweep" not in html  # a pair whose card publishes no table


def test_thinking_both_reads_the_card_beside_the_arm_the_card_names(tmp_path, data_dir):
    """gemma-4-31B-it's card measured with thinking on: its rows take the sweep's thinking-on cells, and the
    page cites the card's own URL."""
    import json
    import re
    import shutil

    target = tokenizer_folder(tmp_path / "target")
    proc = subprocess.run([sys.executable, "-m", "dflash_bench", "sweep", "--model", str(target), "--drafter",
                           "org/d", "--engine", "emulator", "--suites", "gsm8k", "-c", "1", "-n", "2", "--max-tokens",
                           "8", "--port", str(free_port()), "--out", str(tmp_path / "out"), "--data-dir", str(data_dir),
                           "--thinking", "both", "--engine-arg=--acceptance-length=5"], capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (folder,) = [p for p in (tmp_path / "out").iterdir() if (p / "manifest.json").exists()]
    copy = tmp_path / "gemma"
    shutil.copytree(folder, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["settings"]["model"] = "gemma-4-31B-it"  # a pair whose card publishes a table (thinking on)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    marked = copy / "cells" / "emulator-dflash-gsm8k-c1-nothink" / "summary.json"
    summary = json.loads(marked.read_text())
    summary["output_throughput"] = 54321.0  # the off arm, marked: its row must not reach the card's table
    marked.write_text(json.dumps(summary))
    report = subprocess.run([sys.executable, "-m", "dflash_bench", "report", str(copy)], capture_output=True,
                            text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    html = re.sub(r"\s+", " ", (copy / "report.html").read_text())
    assert "The model card beside this sweep" in html and "beside this sweep's thinking-on arm" in html
    assert '<a href="https://huggingface.co/z-lab/gemma-4-31B-it-DFlash">' in html and "dflash.md" not in html
    sweep = SweepDir.open(copy)
    on = [sweep.read_summary(f"emulator-{m}-gsm8k-c1-think").output_throughput for m in ("ar", "dflash")]
    row = re.search(r"<tr><td>gsm8k</td><td class=\"n\">1</td>(.*?)</tr>", html).group(1)
    assert "not measured" not in row and f"{on[1] / on[0]:,.2f}×" in row, row
    assert f"{on[0]:,.0f}</td><td class=\"n\">{on[1]:,.0f}</td>" in row and "54,321" not in row
    assert "<b>thinking</b>" not in html  # the arm's prompts show thinking on, as the card's did


def test_a_bad_thinking_value_is_one_sentence(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "dflash_bench", "sweep", "--model", "org/x", "--engine", "emulator",
                           "--thinking", "maybe", "--dry-run"], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "--thinking takes on, off or both, not 'maybe'" in proc.stderr

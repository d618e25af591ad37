"""Benchmark suites: offline loading of the real upstream files, DFlash's templates, sampling, SPEED-Bench placeholders,
and the errors a user sees for bad paths and malformed records."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dflash_bench.cli import app
from dflash_bench.errors import UserError
from dflash_bench.suites import get_suite, list_suites, load_prompts

# Record counts from shared/datasets/README.md (mbpp: the sanitized test split, task_id 11..510).
COUNTS = {"gsm8k": 1319, "math500": 500, "humaneval": 164, "mbpp": 257, "mt-bench": 80, "spec-bench": 480}
# Templates exactly as DFlash's own benchmark (z-lab/dflash benchmark.py) writes them.
BOXED = "\nPlease reason step by step, and put your final answer within \\boxed{}."
HUMANEVAL_HEAD = "Write a solution to the following problem and make sure that it passes the tests:\n```python\n"
HUMANEVAL_TAIL = "\n```"
PLACEHOLDER = "FULL BENCHMARK DATA SHOULD BE FETCHED FROM THE SOURCE USING SPECDEC_BENCH"


def _jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _write_jsonl(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def test_all_seven_suites_are_defined():
    names = {s.name for s in list_suites()}
    assert names == {"gsm8k", "math500", "humaneval", "mbpp", "mt-bench", "speed-bench", "spec-bench"}
    for s in list_suites():
        assert s.default_max_tokens > 0 and (s.hf_id or s.hf_url) and s.files


@pytest.mark.parametrize("name,count", sorted(COUNTS.items()))
def test_every_suite_loads_offline_with_the_upstream_counts(data_dir, name, count):
    prompts = load_prompts(name, data_dir=data_dir)
    assert len(prompts) == count
    assert len({p.id for p in prompts}) == count, "prompt ids must be unique within a suite"
    assert all(p.suite == name and p.turns and all(t.strip() for t in p.turns) for p in prompts)


def test_math_templates_append_dflash_suffix(data_dir):
    raw = _jsonl(data_dir / "gsm8k" / "test.jsonl")
    prompts = load_prompts("gsm8k", data_dir=data_dir)
    assert [p.turns for p in prompts[:5]] == [[r["question"] + BOXED] for r in raw[:5]]
    assert prompts[0].reference == "18"  # the first test answer ends in '#### 18'
    assert all("####" not in p.reference for p in prompts)

    raw = _jsonl(data_dir / "math500" / "test.jsonl")
    prompts = load_prompts("math500", data_dir=data_dir)
    assert prompts[7].turns == [raw[7]["problem"] + BOXED]
    assert prompts[7].reference == raw[7]["answer"] and prompts[7].category == raw[7]["subject"]


def test_humaneval_template_wraps_the_prompt_in_a_python_block(data_dir):
    raw = _jsonl(data_dir / "humaneval" / "HumanEval.jsonl.gz")
    prompts = load_prompts("humaneval", data_dir=data_dir)
    assert prompts[0].turns == [HUMANEVAL_HEAD + raw[0]["prompt"] + HUMANEVAL_TAIL]
    assert prompts[163].meta["entry_point"] == raw[163]["entry_point"]
    assert prompts[163].meta["test"] == raw[163]["test"]


def test_mbpp_is_the_sanitized_test_split_with_the_prompt_as_is(data_dir):
    raw = json.loads((data_dir / "mbpp" / "sanitized-mbpp.json").read_text())
    test = [r for r in raw if 11 <= r["task_id"] <= 510]
    prompts = load_prompts("mbpp", data_dir=data_dir)
    assert [p.turns for p in prompts] == [[r["prompt"]] for r in test]
    assert prompts[0].id == "mbpp/11"
    assert prompts[0].meta["test_list"] == test[0]["test_list"]


def test_mt_bench_has_two_turns(data_dir):
    raw = _jsonl(data_dir / "mt_bench" / "question.jsonl")
    prompts = load_prompts("mt-bench", data_dir=data_dir)
    assert get_suite("mt-bench").num_turns == 2
    assert all(len(p.turns) == 2 for p in prompts)
    assert prompts[0].turns == raw[0]["turns"] and prompts[0].id == "mt-bench/81"
    with_ref = [p for p in prompts if p.reference is not None]
    assert len(with_ref) == 39 and all(isinstance(p.meta["references"], list) for p in with_ref)


def test_spec_bench_has_six_task_groups_of_80(data_dir):
    prompts = load_prompts("spec-bench", data_dir=data_dir)
    groups: dict[str, int] = {}
    for p in prompts:
        groups[p.category] = groups.get(p.category, 0) + 1
    assert groups == {g: 80 for g in ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")}
    mt = [p for p in prompts if p.category == "mt_bench"]
    assert all(len(p.turns) == 2 for p in mt) and mt[0].meta["sub_category"] == "writing"
    assert all(len(p.turns) == 1 for p in prompts if p.category != "mt_bench")


def test_sampling_is_deterministic_and_cycles(data_dir):
    a = load_prompts("mt-bench", data_dir=data_dir, num_prompts=20, seed=3)
    b = load_prompts("mt-bench", data_dir=data_dir, num_prompts=20, seed=3)
    c = load_prompts("mt-bench", data_dir=data_dir, num_prompts=20, seed=4)
    assert [p.id for p in a] == [p.id for p in b]
    assert [p.id for p in a] != [p.id for p in c]

    many = load_prompts("mt-bench", data_dir=data_dir, num_prompts=170, seed=3)
    assert len(many) == 170 and len({p.id for p in many}) == 170
    first = [p.id for p in many[:80]]
    assert sorted(first) == sorted(p.id for p in load_prompts("mt-bench", data_dir=data_dir))
    assert [p.id for p in many[80:160]] == [f"{i}#1" for i in first]
    assert [p.id for p in many[160:]] == [f"{i}#2" for i in first[:10]]
    assert many[80].turns == many[0].turns
    with pytest.raises(UserError, match="at least 1"):
        load_prompts("mt-bench", data_dir=data_dir, num_prompts=0)


def test_category_and_field_filters(data_dir):
    assert {p.category for p in load_prompts("mt-bench", data_dir=data_dir, categories=["math"])} == {"math"}
    assert len(load_prompts("mt-bench", data_dir=data_dir, categories=["math", "coding"])) == 20
    assert len(load_prompts("math500", data_dir=data_dir, level=5)) == 134  # README: by level 43/90/105/128/134
    with pytest.raises(UserError, match="no category 'nope'|no category nope"):
        load_prompts("mt-bench", data_dir=data_dir, categories=["nope"])
    with pytest.raises(UserError, match="has no filter colour"):
        load_prompts("gsm8k", data_dir=data_dir, colour="red")
    with pytest.raises(UserError, match="unknown suite 'gsm9k'.*gsm8k"):
        load_prompts("gsm9k", data_dir=data_dir)


# ---------------------------------------------------------------- SPEED-Bench


def _speed_row(i: int, category: str, text: str, **extra) -> dict:
    row = {"question_id": f"{i:032x}", "category": category, "sub_category": "x", "turns": [text],
           "source": "src", "src_id": str(i), "difficulty": "easy", "multiturn": False}
    return {**row, **extra}


def test_speed_bench_refuses_placeholder_rows(tmp_path):
    rows = [
        _speed_row(1, "coding", "Write a quicksort in Rust."),
        _speed_row(2, "rag", PLACEHOLDER),
        _speed_row(3, "rag", PLACEHOLDER + "\n\nContext:\n{context}"),
    ]
    _write_jsonl(tmp_path / "speed_bench" / "qualitative" / "test.jsonl", rows)
    with pytest.raises(UserError) as err:
        load_prompts("speed-bench", data_dir=tmp_path)
    msg = str(err.value)
    assert "2 of 3 records" in msg and "prepare_data.py" in msg and "\n" not in msg
    # the resolved category alone is fine: placeholders are only refused when they would be sent
    coding = load_prompts("speed-bench", data_dir=tmp_path, categories=["coding"])
    assert [p.turns for p in coding] == [["Write a quicksort in Rust."]]


def test_speed_bench_loads_a_prepared_parquet_copy_with_tier_filter(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [_speed_row(i, tier, f"long text {i}") for i, tier in enumerate(["low_entropy", "mixed", "high_entropy", "mixed"])]
    rows.append(_speed_row(9, "mixed", "first turn", turns=["first turn", "second turn"], multiturn=True))
    out = tmp_path / "speed" / "throughput_1k"  # where NVIDIA's prepare_data.py writes it
    out.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), out / "test.parquet")

    mixed = load_prompts("speed-bench", data_dir=tmp_path, config="throughput_1k", tier="mixed")
    assert [p.turns for p in mixed] == [["long text 1"], ["long text 3"], ["first turn", "second turn"]]
    assert mixed[0].id == f"speed-bench/{1:032x}" and mixed[0].meta["difficulty"] == "easy"
    with pytest.raises(UserError, match="no prepared copy of config throughput_8k.*prepare_data.py"):
        load_prompts("speed-bench", data_dir=tmp_path, config="throughput_8k")
    with pytest.raises(UserError, match="no config 'throughput_3k'"):
        load_prompts("speed-bench", data_dir=tmp_path, config="throughput_3k")


# ---------------------------------------------------------------- errors


def test_missing_data_dir_and_file_name_the_suite_and_path(tmp_path):
    with pytest.raises(UserError, match=r"suite gsm8k: data dir .*nowhere does not exist"):
        load_prompts("gsm8k", data_dir=tmp_path / "nowhere")
    (tmp_path / "a-file").write_text("")
    with pytest.raises(UserError, match=r"suite gsm8k: data dir .*a-file is a file, not a folder"):
        load_prompts("gsm8k", data_dir=tmp_path / "a-file")
    with pytest.raises(UserError, match=r"suite humaneval: file .*humaneval/HumanEval.jsonl.gz not found"):
        load_prompts("humaneval", data_dir=tmp_path)


def test_malformed_records_name_the_file_and_line(tmp_path):
    path = _write_jsonl(tmp_path / "gsm8k" / "test.jsonl", [{"question": "q", "answer": "#### 1"}, "{not json"])
    with pytest.raises(UserError, match=rf"suite gsm8k: {path} line 2 is not valid JSON"):
        load_prompts("gsm8k", data_dir=tmp_path)
    _write_jsonl(path, [{"question": "q", "answer": "#### 1"}, {"answer": "#### 2"}])
    with pytest.raises(UserError, match=rf"suite gsm8k: {path} line 2 has no text field 'question'"):
        load_prompts("gsm8k", data_dir=tmp_path)
    _write_jsonl(tmp_path / "mt_bench" / "question.jsonl", [{"question_id": 1, "category": "x", "turns": "oops"}])
    with pytest.raises(UserError, match=r"line 1 has no list of text turns in field 'turns'"):
        load_prompts("mt-bench", data_dir=tmp_path)
    (tmp_path / "mbpp").mkdir()
    (tmp_path / "mbpp" / "sanitized-mbpp.json").write_text('{"task_id": 11}')
    with pytest.raises(UserError, match="suite mbpp: .*sanitized-mbpp.json is not a JSON list"):
        load_prompts("mbpp", data_dir=tmp_path)
    (tmp_path / "humaneval").mkdir()
    (tmp_path / "humaneval" / "HumanEval.jsonl.gz").write_text("not gzip")
    with pytest.raises(UserError, match="suite humaneval: .*HumanEval.jsonl.gz could not be read as jsonl.gz"):
        load_prompts("humaneval", data_dir=tmp_path)


def test_suites_folder_can_be_overridden(tmp_path, monkeypatch):
    (tmp_path / "tiny.toml").write_text(
        'name = "tiny"\ndefault_max_tokens = 16\n[hub]\nid = "x/y"\nsplit = "test"\n'
        '[offline]\nfiles = ["tiny.jsonl"]\nformat = "jsonl"\n[prompt]\ntemplate = "Q: {q}"\n'
    )
    _write_jsonl(tmp_path / "data" / "tiny.jsonl", [{"q": "one"}, {"q": "two"}])
    monkeypatch.setenv("DFLASH_BENCH_SUITES", str(tmp_path))
    assert [s.name for s in list_suites()] == ["tiny"]
    assert [p.turns for p in load_prompts("tiny", data_dir=tmp_path / "data")] == [["Q: one"], ["Q: two"]]
    (tmp_path / "tiny.toml").write_text('name = "tiny"\n')
    assert list_suites() == []  # a broken file is left out of the list ...
    with pytest.raises(UserError, match="suite file .*tiny.toml is invalid"):
        get_suite("tiny")  # ... and named when that suite is asked for


TINY = ('name = "tiny"\ndefault_max_tokens = 16\n[offline]\nfiles = ["tiny.jsonl"]\n[prompt]\ntemplate = "Q: {q}"\n'
        '[fields]\nreference = "a"\n')


@pytest.mark.parametrize("typo, key", [
    (TINY.replace("[fields]", "[feilds]"), "feilds"),
    (TINY + 'refrence_after = "#### "\n', "fields.refrence_after"),
    (TINY.replace('template = "Q: {q}"', 'template = "Q: {q}"\ntemplat = "x"'), "prompt.templat"),
])
def test_a_misspelt_key_is_refused_naming_the_key_and_the_file(tmp_path, monkeypatch, typo, key):
    """An unknown key would be ignored and change what is loaded or scored (refrence_after: GSM8K answers)."""
    (tmp_path / "tiny.toml").write_text(typo)
    monkeypatch.setenv("DFLASH_BENCH_SUITES", str(tmp_path))
    with pytest.raises(UserError) as info:
        get_suite("tiny")
    message = str(info.value)
    assert f"unknown key '{key}'" in message and str(tmp_path / "tiny.toml") in message and "\n" not in message


def test_one_broken_suite_file_does_not_break_the_others(tmp_path, monkeypatch):
    (tmp_path / "tiny.toml").write_text(TINY)
    (tmp_path / "broken.toml").write_text(TINY.replace('"tiny"', '"broken"').replace("[fields]", "[feilds]"))
    _write_jsonl(tmp_path / "data" / "tiny.jsonl", [{"q": "one", "a": "1"}])
    monkeypatch.setenv("DFLASH_BENCH_SUITES", str(tmp_path))
    assert [s.name for s in list_suites()] == ["tiny"]
    assert [p.reference for p in load_prompts("tiny", data_dir=tmp_path / "data")] == ["1"]
    with pytest.raises(UserError, match="broken.toml has an unknown key 'feilds'"):
        load_prompts("broken", data_dir=tmp_path / "data")
    with pytest.raises(UserError, match=r"unknown suite 'other'; known suites: tiny \(unreadable: broken.toml\)"):
        get_suite("other")
    res = CliRunner().invoke(app, ["suites", "list"], env={"COLUMNS": "250", "DFLASH_BENCH_SUITES": str(tmp_path)})
    assert res.exit_code == 0, res.output
    assert "tiny" in res.output and "unknown key 'feilds'" in res.output


def test_every_shipped_suite_file_matches_the_schema():
    from dflash_bench.suite_file import read_suite_file, suites_dir

    files = sorted(suites_dir().glob("*.toml"))
    assert len(files) == 7 and all(read_suite_file(f).name == f.stem for f in files)


# ---------------------------------------------------------------- CLI


def test_cli_list_counts_offline_records(data_dir):
    res = CliRunner().invoke(app, ["suites", "list", "--data-dir", str(data_dir)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    lines = {line.split("│")[1].strip(): line for line in res.output.splitlines() if line.count("│") > 3}
    for name, count in COUNTS.items():
        assert f" {count} " in lines[name]
    assert " hub " in lines["speed-bench"]


def test_cli_show_prints_dataset_text_verbatim(tmp_path):
    text = "Explain [bold red]this[/] markup and [link=x]that[/link]."
    _write_jsonl(tmp_path / "mt_bench" / "question.jsonl",
                 [{"question_id": 81, "category": "writing", "turns": [text, "And again?"]}])
    res = CliRunner().invoke(app, ["suites", "show", "mt-bench", "-n", "1", "--data-dir", str(tmp_path)],
                             env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert text in res.output and "And again?" in res.output and "mt-bench/81" in res.output


@pytest.mark.parametrize("args,expect", [
    (["suites", "show", "nope"], "unknown suite 'nope'"),
    (["suites", "show", "gsm8k", "--data-dir", "{bad}"], "suite gsm8k: {bad}/gsm8k/test.jsonl line 1 is not valid JSON"),
])
def test_cli_errors_are_one_line_and_nonzero(tmp_path, args, expect):
    _write_jsonl(tmp_path / "gsm8k" / "test.jsonl", ["{"])
    args = [a.replace("{bad}", str(tmp_path)) for a in args]
    out = subprocess.run([sys.executable, "-m", "dflash_bench", *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and expect.replace("{bad}", str(tmp_path)) in out.stderr
    assert "Traceback" not in out.stderr


_HUB_SUITE = """name = "tiny"
default_max_tokens = 16
num_turns = 2
[hub]
url = "{url}"
rename = {{ prompt = "turns" }}
[offline]
files = ["tiny.jsonl"]
[prompt]
turns_field = "turns"
template = "{{turn}}!"
[fields]
category = "category"
"""


def test_hub_path_reads_through_datasets_and_renames_columns(tmp_path):
    """data_dir=None goes through `datasets.load_dataset` (here its json builder on a local file: no network)."""
    rows = _write_jsonl(tmp_path / "rows.jsonl", [{"prompt": ["a", "b"], "category": "c"}, {"prompt": ["x"], "category": "d"}])
    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / "tiny.toml").write_text(_HUB_SUITE.format(url=rows))
    (suites / "gone.toml").write_text(_HUB_SUITE.format(url=tmp_path / "missing.jsonl").replace('"tiny"', '"gone"'))
    env = {**os.environ, "DFLASH_BENCH_SUITES": str(suites), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(tmp_path / "cache")}
    env.pop("DFLASH_BENCH_DATA", None)  # the hub path: no offline folder, whatever the caller's environment says
    code = "import json; from dflash_bench.suites import load_prompts; print(json.dumps([[p.id, p.turns, p.category] for p in load_prompts('tiny')]))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [["tiny/0", ["a!", "b!"], "c"], ["tiny/1", ["x!"], "d"]]
    out = subprocess.run([sys.executable, "-m", "dflash_bench", "suites", "show", "gone"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 2 and "suite gone: could not load" in out.stderr and "--data-dir" in out.stderr

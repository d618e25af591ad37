import os
import subprocess
import sys

from typer.testing import CliRunner

from dflash_bench import __version__
from dflash_bench.cli import app


def test_version():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"dflash-bench {__version__}"


def test_every_command_has_help():
    runner = CliRunner()
    top = runner.invoke(app, ["--help"])
    assert top.exit_code == 0
    import click
    import typer.main

    def commands(group: click.Group, path: list[str]):
        for name, cmd in group.commands.items():
            yield [*path, name], cmd
            if isinstance(cmd, click.Group):
                yield from commands(cmd, [*path, name])

    assert "<bool>" not in top.output, top.output
    for path, cmd in commands(typer.main.get_command(app), []):
        res = runner.invoke(app, [*path, "--help"])
        assert res.exit_code == 0, (path, res.output)
        assert (cmd.help or "").strip(), f"command {path} has no help text"
        # a flag takes no value: no type beside --help, --version, --dry-run
        assert "<bool>" not in res.output, (path, res.output)


def test_console_script_runs_as_module():
    out = subprocess.run([sys.executable, "-m", "dflash_bench", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and __version__ in out.stdout


def test_a_port_out_of_range_is_refused_before_anything_binds():
    runner = CliRunner()
    for args in (["emulate", "--port", "99999"], ["emulate", "--port", "-1"], ["serve", "--model", "m", "--port", "70000"],
                 ["launch", "-m", "Qwen3-8B", "--port", "0", "--dry-run"]):
        res = runner.invoke(app, args)
        assert res.exit_code == 2 and "--port" in res.output, (args, res.output)
        assert not isinstance(res.exception, OverflowError)


def test_an_output_path_that_cannot_be_written_is_one_line_and_exit_2(tmp_path):
    """The gate's exit 1 means regression: an unwritable --junit must not exit 1 through a traceback."""
    from benchmarks.fixtures.report_sweeps import make_sweep

    sweep = make_sweep(tmp_path / "s")
    blocked = tmp_path / "file"
    blocked.write_text("")
    for args in (["gate", str(sweep), "--baseline", str(sweep), "--junit", str(blocked / "j.xml")],
                 ["gate", str(sweep), "--export-baseline", "-o", str(blocked / "b.json")],
                 ["report", str(sweep), "--out", str(blocked / "r.html")]):
        out = subprocess.run([sys.executable, "-m", "dflash_bench", *args], capture_output=True, text=True, timeout=120)
        assert out.returncode == 2, (args, out.stderr[-500:])
        last = out.stderr.strip().splitlines()[-1]
        assert "Traceback" not in out.stderr and last.startswith(("error: cannot use ", "error: cannot write ")), last
        assert str(blocked) in last, last  # the sentence names the path in the way


def test_tables_are_never_cut_when_stdout_is_not_a_terminal(data_dir):
    """A pipe or a CI log gets each table whole: no cell cut to "concurren…" or "(2.16-2.…"."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    out = subprocess.run([sys.executable, "-m", "dflash_bench", "suites", "list", "--data-dir", str(data_dir)],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and "gsm8k" in out.stdout and "…" not in out.stdout, out.stdout
    # the sweep's closing table, printed as the sweep prints it, its stdout a pipe
    code = ("import pandas as pd; from dflash_bench.console import new_console; "
            "from dflash_bench.sweep.progress import headline_table; "
            "new_console().print(headline_table(pd.DataFrame([dict(engine='builtin', suite='spec-bench', concurrency=8, "
            "ar_tok_s=1234.5, spec_tok_s=2666.4, speedup=2.16, speedup_min=2.16, speedup_max=2.55, tau=3.1, repeats=3)])))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "…" not in out.stdout and "concurrency" in out.stdout and "2.16x (2.16-2.55)" in out.stdout, out.stdout


def test_a_table_wider_than_an_80_column_terminal_wraps_and_keeps_every_value_whole():
    """At COLUMNS=80 the sweep's closing table of servers of two GPUs (nine columns) fits the width: headers wrap,
    and every value stays whole on its line: nothing cut to "1,481…", no number folded."""
    code = ("import pandas as pd; from dflash_bench.console import new_console; "
            "from dflash_bench.sweep.progress import headline_table; "
            "new_console().print(headline_table(pd.DataFrame([dict(engine='emulator', suite='gsm8k', concurrency=2, "
            "ar_tok_s=1481.6, spec_tok_s=2977.2, speedup=2.01, speedup_min=2.01, speedup_max=2.01, tau=7.0, "
            "repeats=1)]), gpus=2))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COLUMNS": "80"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "…" not in out.stdout and max(len(line) for line in lines) <= 80, out.stdout
    (row,) = [line for line in lines if "emulator" in line]
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells == ["emulator", "gsm8k", "2", "1,481.6", "2,977.2", "740.8", "1,488.6", "2.01x", "7.00"], out.stdout


def test_the_embedded_default_is_explained_where_it_first_appears():
    """README and --help name "the embedded default" and, in the same place, say what it is."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    first = readme.index("embedded default")
    paragraph = readme[first:readme.index("\n\n", first)]
    assert "dflash_bench/assets/default_pair" in paragraph and "drafter" in paragraph, paragraph
    runner = CliRunner()
    for args in (["--help"], ["demo", "--help"]):
        text = " ".join(runner.invoke(app, args).output.replace("│", " ").split())  # rich's box, its lines joined
        assert "embedded default (the tiny target and DFlash drafter that ship inside the package" in text, text


def test_the_sweep_command_line_is_made_from_the_declared_options():
    """Each declared option (settings.py) is on `sweep --help` under its names with its help, and what its text
    reads as lands in its field; an option not given is not in what the command receives."""
    import pytest

    from dflash_bench.cli_options import given
    from dflash_bench.errors import UserError
    from dflash_bench.options import flags
    from dflash_bench.settings import SlurmOptions, SweepSettings

    out = CliRunner().invoke(app, ["sweep", "--help"], env={"COLUMNS": "300"}).output
    text = " ".join(out.replace("│", " ").split())
    declared = [flag for model in (SweepSettings, SlurmOptions) for _, flag in flags(model)]
    assert len(declared) > 30
    for flag in declared:
        shown = all(f" {name} " in f" {text} ".replace(",", " ") for name in flag.names)
        assert shown != flag.hidden and (" ".join(flag.help.split()) in text) != flag.hidden, flag
    raw = {"concurrency": "1,8", "thinking": "both", "drafter": "d", "eagle3": "e", "engine_arg": [],
           "input_len": "1k,2000", "seed": None, "modes": "ar,dflash,eagle3"}
    assert given(SweepSettings, raw) == {"concurrency": [1, 8], "thinking_both": True, "modes": ["ar", "dflash", "eagle3"],
                                         "engine_options": {"drafter": "d", "eagle3": "e"}, "input_lens": [1024, 2000]}
    assert given(SweepSettings, {"no_thinking": True}) == {"thinking": False}
    with pytest.raises(UserError, match="give --thinking on.off.both or --no-thinking, not both"):
        given(SweepSettings, {"thinking": "on", "no_thinking": True})
    assert given(SlurmOptions, {"sbatch_arg": ["--qos=high"], "gpus_per_node": 0}) == {
        "sbatch_args": ["--qos=high"], "gpus_per_node": 0}

def test_a_model_path_that_does_not_exist_is_refused_before_anything_launches(tmp_path):
    """One sentence and exit 2, no sweep folder and no server; a Hugging Face id (org/name) is not a local path, and
    a sweep of servers given by URL leaves --model to them."""
    missing = tmp_path / "no" / "such-model"
    pair = "dflash_bench/assets/default_pair"
    cases = (["sweep", "--model", str(missing), "--engine", "builtin", "--suites", "gsm8k", "-c", "1", "--out", str(tmp_path / "r")],
             ["sweep", "--model", "./no-such-model", "--engine", "builtin", "--suites", "gsm8k", "--dry-run"],
             ["sweep", "--model", f"{pair}/target", "--drafter", str(missing), "--engine", "builtin", "--dry-run"],
             ["launch", "--engine", "builtin", "--model", str(missing), "--mode", "ar", "--runner", "process"])
    for args in cases:
        out = subprocess.run([sys.executable, "-m", "dflash_bench", *args], capture_output=True, text=True, timeout=120)
        option = "--drafter" if "--drafter" in args else "--model"
        assert out.returncode == 2 and "Traceback" not in out.stderr, (args, out.stderr[-500:])
        assert out.stderr.strip().splitlines() == [out.stderr.strip()] and out.stderr.startswith(f"error: {option} ")
        assert "no such file or folder" in out.stderr and "Hugging Face id" in out.stderr
    assert not (tmp_path / "r").exists()
    res = CliRunner().invoke(app, ["sweep", "--model", "org/not-here", "--drafter", "org/not-here-dflash", "--engine", "vllm",
                                   "--suites", "gsm8k", "--dry-run"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(app, ["sweep", "--model", str(missing), "--engine", "vllm", "--suites", "gsm8k",
                                   "--drafter", "org/d", "--url-ar", "http://127.0.0.1:1", "--url-dflash", "http://127.0.0.1:2",
                                   "--dry-run"])
    assert res.exit_code == 0, res.output

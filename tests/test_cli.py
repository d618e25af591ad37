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
    import typer.main

    group = typer.main.get_command(app)
    for name, cmd in group.commands.items():
        res = runner.invoke(app, [name, "--help"])
        assert res.exit_code == 0, (name, res.output)
        assert (cmd.help or "").strip(), f"command {name} has no help text"


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

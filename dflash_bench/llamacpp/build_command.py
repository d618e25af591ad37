"""`dflash-bench engines build llamacpp`."""

from __future__ import annotations

import shutil

import typer

from dflash_bench.errors import UserError


def build_command(engine: str, *, jobs: int | None = None, force: bool = False) -> None:
    """Build llama-server into the cache folder and say what was done, step by step."""
    from dflash_bench.llamacpp import VERSION, install_dir
    from dflash_bench.llamacpp.server_build import SERVER, build_server

    if engine != "llamacpp":
        raise UserError(f"cannot build {engine!r}: only llamacpp is built from source (vLLM and SGLang ship images).")
    say = lambda line: typer.echo(line, err=True)  # noqa: E731
    on_path = shutil.which(SERVER)
    if on_path:
        say(f"note: {on_path} is on PATH and is used before the build in {install_dir()}")
    say(f"building {SERVER} from llama-cpp-python=={VERSION} (vendor/llama.cpp) into {install_dir()}")
    result = build_server(jobs=jobs, force=force, log=say)
    if result.reused:
        say(f"already built (pass --force to build again): {result.server}")
    else:
        total = sum(s for _, s in result.steps)
        say(f"built in {total:.0f} s: " + ", ".join(f"{what} {s:.0f} s" for what, s in result.steps))
        say(f"converter: {result.source / 'convert_hf_to_gguf.py'}")
    typer.echo(str(result.server))

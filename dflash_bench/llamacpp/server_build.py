"""`dflash-bench engines build llamacpp`: the sdist from PyPI, cmake + ninja for the CPU, `llama-server` only.

The install folder holds bin/llama-server and src/ (the tree's GGUF converter: convert_hf_to_gguf.py,
conversion/, gguf-py/, models/templates/). A build that fails leaves no half-installed folder: it is built in a temporary folder beside
the target and renamed into place.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

from dflash_bench.errors import UserError
from dflash_bench.llamacpp import PACKAGE, VERSION, install_dir

T = TypeVar("T")

SERVER = "llama-server"
# CPU build of the server alone. The web UI is neither built nor fetched (LLAMA_USE_PREBUILT_UI would
# download it from Hugging Face); no TLS, no OpenMP (llama.cpp's own thread pool); static so the one
# binary is all that is installed.
CMAKE_FLAGS = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=ON", "-DGGML_OPENMP=OFF",
               "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=ON",
               "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_UI=OFF",
               "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF"]

CONVERTER = ("convert_hf_to_gguf.py", "conversion", "gguf-py", "models/templates", "LICENSE")


@dataclass
class BuildResult:
    server: Path
    source: Path  # the llama.cpp tree (converter included)
    steps: list[tuple[str, float]] = field(default_factory=list)  # (what, seconds)
    reused: bool = False


def find_server() -> Path | None:
    """llama-server on PATH first, then the one `build_server` installed."""
    on_path = shutil.which(SERVER)
    if on_path:
        return Path(on_path)
    built = install_dir() / "bin" / SERVER
    return built if built.is_file() else None


def server_version(server: Path) -> str | None:
    """The `version: ...` line `llama-server --version` prints (None when it prints none)."""
    try:
        proc = subprocess.run([str(server), "--version"], capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in (proc.stdout + "\n" + proc.stderr).splitlines():
        if line.startswith("version:"):
            return line.split(":", 1)[1].strip()
    return None


def check_server_version(server: Path) -> None:
    """Refuse a llama-server (from PATH) whose version differs from the build beside the converter's tree:
    GGUF files written by one llama.cpp and served by another measure a different program."""
    built = install_dir() / "bin" / SERVER
    if not built.is_file() or source_tree() is None or Path(server).resolve() == built.resolve():
        return
    ours, theirs = server_version(built), server_version(Path(server))
    if ours != theirs:
        raise UserError(f"{server} is llama-server {theirs or 'of an unknown version'}, but the GGUF converter is "
                        f"llama.cpp {ours} ({install_dir()}): take it off PATH, or put a llama-server of that "
                        "version first on it.")


def source_tree(version: str = VERSION) -> Path | None:
    """The llama.cpp tree of the installed build (where the converter lives), if any."""
    src = install_dir(version) / "src"
    return src if (src / "convert_hf_to_gguf.py").is_file() else None


def build_server(version: str = VERSION, jobs: int | None = None, force: bool = False,
                 log: Callable[[str], object] = print) -> BuildResult:
    """Download the sdist, build llama-server for this CPU, install it into the cache folder."""
    dest = install_dir(version)
    if (dest / "bin" / SERVER).is_file() and source_tree(version) and not force:
        return BuildResult(dest / "bin" / SERVER, dest / "src", reused=True)
    for tool in ("cmake", "ninja", "c++"):
        if not shutil.which(tool):
            raise UserError(f"building llama-server needs {tool} on PATH (apt-get install cmake ninja-build g++).")
    dest.parent.mkdir(parents=True, exist_ok=True)
    steps: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory(prefix=f"{dest.name}.", dir=dest.parent) as tmp:
        work = Path(tmp)
        sdist = _timed(steps, f"download {PACKAGE}=={version} (sdist, PyPI)", log, _download, version, work)
        src = _timed(steps, "unpack vendor/llama.cpp", log, _unpack, sdist, work / "tree")
        build = work / "build"
        _timed(steps, "configure (cmake, CPU)", log, _run,
               ["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja", *CMAKE_FLAGS], work / "build.log")
        _timed(steps, f"build the {SERVER} target (ninja)", log, _run,
               ["cmake", "--build", str(build), "--target", SERVER, "-j", str(jobs or _jobs())], work / "build.log")
        (work / "stage" / "bin").mkdir(parents=True)
        shutil.copy2(build / "bin" / SERVER, work / "stage" / "bin" / SERVER)
        for part in CONVERTER:  # the converter and its gguf package, not the 170 MB tree
            (work / "stage" / "src" / part).parent.mkdir(parents=True, exist_ok=True)
            copy = shutil.copytree if (src / part).is_dir() else shutil.copy2
            copy(src / part, work / "stage" / "src" / part)
        if dest.exists():
            shutil.rmtree(dest)
        (work / "stage").rename(dest)
    return BuildResult(dest / "bin" / SERVER, dest / "src", steps)


def _timed(steps: list[tuple[str, float]], what: str, log: Callable[[str], object], fn: Callable[..., T],
           *args: Any) -> T:
    log(f"{what} ...")
    t0 = time.monotonic()
    out = fn(*args)
    steps.append((what, time.monotonic() - t0))
    log(f"  {what}: {steps[-1][1]:.0f} s")
    return out


def _jobs() -> int:
    import os

    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def _download(version: str, work: Path) -> Path:
    """The sdist through pip (PyPI's ordinary client); only this package is taken from source."""
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", PACKAGE,
           f"{PACKAGE}=={version}", "-d", str(work / "dl")]
    _run(cmd, work / "download.log")
    found = sorted((work / "dl").glob("*.tar.gz"))
    if not found:
        raise UserError(f"pip download of {PACKAGE}=={version} gave no sdist; see {work / 'download.log'}")
    return found[0]


def _unpack(sdist: Path, dest: Path) -> Path:
    prefix = f"{sdist.name[:-len('.tar.gz')]}/vendor/llama.cpp/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and (m.isfile() or m.isdir())]
        if not members:
            raise UserError(f"{sdist.name} carries no vendor/llama.cpp tree")
        for m in members:
            m.name = m.name[len(prefix):]
        tar.extractall(dest, members=[m for m in members if m.name], filter="data")
    return dest


def _run(cmd: list[str], log_path: Path) -> None:
    with open(log_path, "ab") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-20:]
        raise UserError(f"{cmd[0]} {cmd[1]} failed (exit {proc.returncode}):\n" + "\n".join(tail))

"""Where a sweep's numbers come from: versions, host, model revisions, chat-template hash. No secrets."""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import re
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from dflash_bench import __version__
from dflash_bench.store.manifest import HostInfo, ModelRevision

# option names whose value is secret: --hf-token, --api-key, --client-secret; not --max-tokens or --tokenizer
SECRET_OPTION = re.compile(r"(^|[_-])(token|key)$|secret|passw|auth", re.I)
HF_TOKEN = re.compile(r"\bhf_[A-Za-z0-9]{8,}")


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"dflash_bench": __version__, "git_revision": git_revision(), "python": sys.version.split()[0]}
    for dist in ("torch", "transformers", "vllm", "sglang", "httpx", "aiohttp"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def git_revision() -> str | None:
    """The dflash-bench checkout's commit (with '+dirty' when it has changes), or None outside git."""
    here = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return rev.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


def host() -> HostInfo:
    return HostInfo(hostname=socket.gethostname(), platform=platform.platform(), cpu_count=os.cpu_count(),
                    machine=platform.machine())


def model_revision(model: str) -> ModelRevision:
    """What can be known offline about a model: a local folder's config hash, chat-template hash and parameter
    count, or the commit the local Hugging Face cache resolved `main` to (and its snapshot's)."""
    info = ModelRevision(id=model)
    local = Path(model)
    folder = local if local.is_dir() else _hf_snapshot(model, info)
    if folder is not None and folder.is_dir():
        config = folder / "config.json"
        if config.exists():
            info.config_sha256 = hashlib.sha256(config.read_bytes()).hexdigest()[:16]
        template = chat_template(folder)
        if template:
            info.chat_template_sha256 = hashlib.sha256(template.encode()).hexdigest()[:16]
        info.parameters = parameter_count(folder)
    return info


def parameter_count(folder: Path) -> int | None:
    """The parameters in a model folder's *.safetensors files, read from their headers alone (a header is
    8 bytes of length, then JSON naming each tensor's shape); None without such files or with a broken one."""
    total = 0
    files = sorted(folder.glob("*.safetensors"))
    try:
        for file in files:
            with open(file, "rb") as fh:
                size = int.from_bytes(fh.read(8), "little")
                if not 0 < size < 100_000_000:
                    return None
                header = json.loads(fh.read(size))
            total += sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return total or None


def chat_template(folder: Path) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text()
    tok = folder / "tokenizer_config.json"
    if tok.exists():
        try:
            template = json.loads(tok.read_text()).get("chat_template")
        except (json.JSONDecodeError, OSError):
            return None
        return template if isinstance(template, str) else json.dumps(template, sort_keys=True) if template else None
    return None


def redact(argv: list[str]) -> list[str]:
    """The command line with the values of secret-looking options, and Hugging Face tokens, replaced by '***'.

    An option may sit inside another's value (`--engine-arg=--hf-token=hf_...`): everything after it is hidden."""
    out, hide_next = [], False
    for arg in argv:
        if hide_next:
            out.append("***")
            hide_next = False
            continue
        parts = arg.split("=")
        i = next((i for i, part in enumerate(parts) if _secret_option(part)), None)
        if i is None:
            out.append(HF_TOKEN.sub("hf_***", arg))
        elif i + 1 < len(parts):  # --api-key=v, --engine-arg=--hf-token=v
            out.append("=".join(parts[:i + 1]) + "=***")
        else:  # --hf-token v, --engine-arg=--hf-token v
            out.append(arg)
            hide_next = True
    return out


def _secret_option(part: str) -> bool:
    return part.startswith("-") and SECRET_OPTION.search(part.lstrip("-")) is not None


def _hf_snapshot(model: str, info: ModelRevision) -> Path | None:
    cache = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub")
    repo = cache / ("models--" + model.replace("/", "--"))
    ref = repo / "refs" / "main"
    if not ref.exists():
        return None
    info.revision = ref.read_text().strip()
    return repo / "snapshots" / info.revision

"""What one sweep run carries from phase to phase: `SweepContext`, and what it comes to: `SweepResult`.

The phases (plan.py, launch.py, measure.py, write.py) each take the context instead of a list of its
parts; the local sweep (run.py), a Slurm job (slurm_job.py) and the Slurm submitter (slurm_run.py) build one.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from dflash_bench.errors import UserError
from dflash_bench.store import Manifest, SweepDir, SweepSettings
from dflash_bench.sweep.progress import SweepProgress

if TYPE_CHECKING:
    from dflash_bench.models import ModelPair
    from dflash_bench.suites import Prompt
    from dflash_bench.telemetry import TelemetrySampler

PromptLoader = Callable[[str, int], "tuple[list[Prompt], int]"]  # (suite, concurrency) -> (prompts, max_tokens)


@dataclass
class SweepResult:
    path: Path
    failed: list[str] = field(default_factory=list)
    interrupted: bool = False

    @property
    def exit_code(self) -> int:
        return 130 if self.interrupted else (1 if self.failed else 0)


@dataclass
class SweepContext:
    """One sweep folder under way: what it measures, with which pair and prompts, where it writes, how it went."""

    settings: SweepSettings
    pair: ModelPair
    sweep: SweepDir  # a Slurm job's: its own manifest file and logs (slurm_job.JobSweepDir)
    manifest: Manifest
    prompts: PromptLoader
    result: SweepResult
    progress: SweepProgress
    telemetry: TelemetrySampler | None = None  # one sampler for the whole run (each cell is one window)

    @property
    def image(self) -> str | None:
        """--image: the container image for every server (None: the profile's)."""
        return self.settings.image


def reason(err: UserError, engine: str | None = None) -> str:
    """A server's death explained by the log lines that say why (launch.common.explain), else the message;
    led by the engine's own sentence where its log names a known cause (profiles' `failure`)."""
    text = getattr(err, "reason", None) or str(err)
    if engine is None:
        return text
    from dflash_bench import profiles

    known = profiles.get(engine).failure(getattr(err, "log_tail", "") or "")
    return f"{known} ({text})" if known else text


@contextlib.contextmanager
def stops_recorded(result: SweepResult) -> Iterator[None]:
    """Ctrl-C and SIGTERM (which unwinds as launch.Terminated, a SystemExit) end the run as interrupted."""
    from dflash_bench.launch import Terminated

    try:
        yield
    except KeyboardInterrupt:
        result.interrupted = True
    except SystemExit as err:
        result.interrupted = True
        if not isinstance(err, Terminated):
            raise

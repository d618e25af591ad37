"""The builtin engine's configuration: one frozen value, built once from `serve`'s options (or a profile's), read
whole by the engine, its scheduler and its runner. Each option keeps its flag's name from the command line to its
use (`--verify-width` is `verify_width`, `--prefill` is `prefill`, `--cut-draft` is `cut_draft`, ...).

No torch at import (`resolve_prefill` asks torch for a GPU only when `--device auto` must be resolved).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dflash_bench.errors import UserError

if TYPE_CHECKING:
    from dflash_bench.synthetic import SyntheticProfile

PREFILL = ("auto", "first", "mixed")  # serve --prefill; `resolve_prefill` turns auto into one of the other two
MODES = ("ar", "dflash")
DEFAULT_SLOTS = 32  # --max-slots when none is asked: the reference engine's, and the fast path's without a memory budget
MIN_MODEL_LEN = 16  # the shortest --max-model-len
DEFAULT_MEMORY_UTILIZATION = 0.9  # --memory-utilization when none is given: the fast path's KV pool on a GPU


@dataclass(frozen=True)
class StepConfig:
    """How the fast path steps (`serve --fast`): what its scheduler and runner read."""

    verify_width: str | int = "auto"  # --verify-width: auto (by load), full (the block) or N tokens per row
    step_ahead: bool = True  # --step-ahead: the next step launched before this one's tokens are read
    cut_draft: bool = False  # --cut-draft: draft only the positions a step verifies
    prefix_caching: bool = True  # --enable-prefix-caching: a prompt resumes a freed slot's tokens (scheduling/prefix.py)
    prefill: str = "first"  # --prefill, resolved: first, or mixed (AR: prompts ride the rows' steps)
    synthetic_acceptance: float | None = None  # --synthetic-acceptance (benchmarks): drafts accepted at this mean
    # --synthetic-acceptance-rates (benchmarks): per draft position, the share of steps that accept that far
    synthetic_acceptance_rates: tuple[float, ...] | None = None
    kv_block: int = 256  # the KV-length bucket of a step's graphs (no flag)
    seed: int = 0  # synthetic acceptance's draws (no flag)

    def __post_init__(self) -> None:
        if self.prefill not in ("first", "mixed"):
            raise UserError(f"--prefill must be first or mixed once resolved, not {self.prefill!r}")
        w = self.verify_width
        if not (w in ("auto", "full") or (isinstance(w, int) and w >= 1)):
            raise UserError(f"--verify-width must be auto, full or a number of tokens of at least 1, not {w!r}")

    def synthetic(self, block_size: int) -> SyntheticProfile | None:
        """The acceptance profile drawn instead of the target's verdict (dflash_bench/synthetic.py), from the mean
        or the rates given; None without synthetic acceptance. One sentence for a mean or rates the block cannot take."""
        from dflash_bench.synthetic import SyntheticProfile

        if self.synthetic_acceptance_rates is not None:
            return SyntheticProfile.from_rates(self.synthetic_acceptance_rates, block_size)
        if self.synthetic_acceptance is not None:
            return SyntheticProfile.from_tau(self.synthetic_acceptance, block_size)
        return None

    @property
    def drawn(self) -> bool:
        """Acceptance is drawn (synthetic), not the target's."""
        return self.synthetic_acceptance is not None or self.synthetic_acceptance_rates is not None

    @property
    def adaptive(self) -> bool:
        """The verify width chosen by load (`width.py`)."""
        return self.verify_width == "auto"

    @property
    def width(self) -> int | None:
        """A fixed verify width (None: auto, or the whole block)."""
        return self.verify_width if isinstance(self.verify_width, int) else None


@dataclass(frozen=True)
class EngineConfig:
    """`serve`'s engine: the model, where and how it runs, and (with `fast`) how the fast path steps. `build.build`
    makes the engine from it, resolving `device` and `dtype` (auto) into the config every part then reads."""

    model: str
    draft: str | None = None
    mode: str = "dflash"  # --mode, resolved: ar or dflash
    dtype: str = "auto"
    device: str = "auto"
    max_slots: int | None = None  # None: DEFAULT_SLOTS, or on the fast path as many as the KV memory holds
    max_model_len: int = 4096  # the context limit: tokens per slot (prompt, output and one block)
    fast: bool = False
    load_format: str = "auto"  # auto (the weight files) or dummy (random weights of the configs' shapes)
    benchmark_only: bool = False
    kernels: bool = True  # --kernels/--no-kernels (fast path)
    memory_utilization: float | None = None  # fast path; None: DEFAULT_MEMORY_UTILIZATION of a GPU
    kv_cache_memory_bytes: int | None = None
    tensor_parallel_size: int = 1  # fast path: ranks, a GPU each (`fast/parallel/ranks.py`)
    enforce_eager: bool = False  # fast path on a GPU: every step without CUDA graphs
    step: StepConfig = field(default_factory=StepConfig)

    def __post_init__(self) -> None:
        """One sentence for a value no engine runs (a combination of options is `from_options`' and `build`'s)."""
        if self.mode not in MODES:
            raise UserError(f"unknown mode {self.mode!r}; use 'ar' or 'dflash'")
        if (self.max_slots is not None and self.max_slots < 1) or self.max_model_len < MIN_MODEL_LEN:
            raise UserError(f"--max-slots must be at least 1 and --max-model-len at least {MIN_MODEL_LEN}")
        if self.load_format not in ("auto", "dummy"):
            raise UserError(f"--load-format must be auto or dummy, not {self.load_format!r}")
        if self.memory_utilization is not None and not 0 < self.memory_utilization <= 1:
            raise UserError(f"--memory-utilization must lie in (0, 1], not {self.memory_utilization:g}")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes < 1:
            raise UserError("--kv-cache-memory-bytes must be a positive number of bytes")

    @property
    def dummy(self) -> bool:
        return self.load_format == "dummy"

    @property
    def slots(self) -> int | None:
        """The slots asked for: `max_slots`; None only on the fast path, whose pool then holds what memory holds."""
        return self.max_slots if self.max_slots is not None or self.fast else DEFAULT_SLOTS

    @property
    def utilization(self) -> float:
        """The share of a GPU's memory the fast path's KV pool may fill (with the weights loaded)."""
        return DEFAULT_MEMORY_UTILIZATION if self.memory_utilization is None else self.memory_utilization

    @classmethod
    def from_options(cls, model: str, draft: str | None = None, *, mode: str | None = None, dtype: str = "auto",
                     device: str = "auto", max_slots: int | None = None, max_model_len: int = 4096, fast: bool = False,
                     load_format: str = "auto", synthetic_acceptance: float | None = None,
                     synthetic_acceptance_rates: str | None = None, benchmark_only: bool = False,
                     step_ahead: bool = True, verify_width: str = "auto", cut_draft: bool = False,
                     prefill: str = "auto", kernels: bool = True, memory_utilization: float | None = None,
                     kv_cache_memory_bytes: int | None = None, tensor_parallel_size: int = 1,
                     enforce_eager: bool = False, enable_prefix_caching: bool = True) -> EngineConfig:
        """`serve`'s options checked (one sentence for each misuse) and resolved: the mode from --draft, --prefill
        auto, --verify-width N as a number. Options of the fast path without --fast are refused."""
        mode = mode or ("dflash" if draft else "ar")
        width = verify_width_option(verify_width)
        if prefill not in PREFILL:
            raise UserError(f"--prefill must be one of {', '.join(PREFILL)}, not {prefill!r}")
        prefill = resolve_prefill(prefill, fast=fast, mode=mode, device=device)
        if synthetic_acceptance is not None and synthetic_acceptance_rates is not None:
            raise UserError("give --synthetic-acceptance (a mean) or --synthetic-acceptance-rates (one rate per draft "
                            "position), not both")
        rates = None
        if synthetic_acceptance_rates is not None:
            from dflash_bench.synthetic import parse_rates

            rates = parse_rates(synthetic_acceptance_rates)
        if not fast:
            if memory_utilization is not None or kv_cache_memory_bytes is not None:
                raise UserError(f"{'--memory-utilization' if memory_utilization is not None else '--kv-cache-memory-bytes'}"
                                " sizes the fast path's KV pool: add --fast (without it, --max-slots sizes the cache)")
            if synthetic_acceptance is not None or rates is not None:
                which = "--synthetic-acceptance" + ("-rates" if rates is not None else "")
                raise UserError(f"{which} runs on the fast path only: add --fast --benchmark-only")
            if tensor_parallel_size > 1 or enforce_eager:
                raise UserError(f"{'--enforce-eager' if enforce_eager else f'--tensor-parallel-size {tensor_parallel_size}'}"
                                " runs on the fast path only: add --fast")
            if not step_ahead or prefill == "mixed":
                raise UserError(f"{'--no-step-ahead' if not step_ahead else '--prefill ' + prefill} applies to the "
                                "fast path only: add --fast")
            if verify_width != "auto" or cut_draft or not kernels:
                raise UserError(f"{'--cut-draft' if cut_draft else '--no-kernels' if not kernels else '--verify-width'}"
                                " applies to the fast path only: add --fast")
        step = StepConfig(verify_width=width if width is not None else verify_width, step_ahead=step_ahead,
                          cut_draft=cut_draft, prefill=prefill, prefix_caching=enable_prefix_caching,
                          synthetic_acceptance=synthetic_acceptance,
                          synthetic_acceptance_rates=rates)
        return cls(model, draft if mode == "dflash" else None, mode=mode, dtype=dtype, device=device,
                   max_slots=max_slots, max_model_len=max_model_len, fast=fast,
                   load_format=load_format, benchmark_only=benchmark_only, kernels=kernels,
                   memory_utilization=memory_utilization, kv_cache_memory_bytes=kv_cache_memory_bytes,
                   tensor_parallel_size=tensor_parallel_size, enforce_eager=enforce_eager, step=step)


def verify_width_option(value: str) -> int | None:
    """`--verify-width`: auto or full (None), or a fixed number of tokens per row and step (the anchor and its
    first N - 1 drafts; above the block size, the block)."""
    if value in ("auto", "full"):
        return None
    if value.isdigit() and int(value) >= 1:
        return int(value)
    raise UserError(f"--verify-width must be auto, full or a number of tokens of at least 1, not {value!r}")


def resolve_prefill(prefill: str, *, fast: bool, mode: str, device: str) -> str:
    """`serve --prefill auto`: mixed for AR on the fast path on a GPU (its best on the 8B shape at 32 rows, README),
    first everywhere else (a CPU's step and prefill are both compute-bound: riding saves nothing there); any other
    choice as given."""
    if prefill != "auto":
        return prefill
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return "mixed" if fast and mode == "ar" and device.startswith("cuda") else "first"

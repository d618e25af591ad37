"""Model-card tables beside the user's own numbers, and the settings that likely explain a gap.

    table = published_for("gemma-4-31B-it")          # None for a pair whose card has no table
    gaps = setting_gaps(table.settings, RunSettings(gpu="NVIDIA H100 80GB HBM3", engine="vllm",
                                                    thinking=False, max_tokens=2048))
    rows = side_by_side(table, measured_rows)

The figures are copied exactly from the Hugging Face model cards; each table names its card's URL, which
the report cites. Users who fail to reproduce a card usually differ in thinking,
chat template or max tokens, so `setting_gaps` lists every such difference, and the settings nobody can
compare (a template hash the card never published) as "unknown" rather than as a match.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, Field


class PublishedSettings(BaseModel):
    """How a card measured its table. None means the card does not say."""

    gpu: str  # "B300"
    gpus_per_server: int = 1
    engine: str  # "vllm" | "sglang", as this tool names its engines
    engine_version: str | None = None
    thinking: bool | None = None
    reasoning_effort: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None  # 0.0 is greedy
    block_size: int | None = None
    template_hash: str | None = None  # no card publishes one today
    metric: str = "generated tok/s, end to end, per server"


class PublishedRow(BaseModel):
    suite: str  # this tool's suite name (gsm8k, math500, humaneval, mbpp, mt-bench)
    concurrency: int
    ar_tok_s: float | None = None
    dflash_tok_s: float | None = None
    speedup: float | None = None  # as printed on the card (rounded there)
    tau: float | None = None


class PublishedTable(BaseModel):
    pair: str  # models.KNOWN name
    card: str  # the card's URL: the source the report cites
    settings: PublishedSettings
    rows: list[PublishedRow]
    notes: str = ""


def _rows(suite: str, cells: list[tuple[int, float, float, float, float]]) -> list[PublishedRow]:
    return [PublishedRow(suite=suite, concurrency=c, ar_tok_s=ar, dflash_tok_s=df, speedup=s, tau=t)
            for c, ar, df, s, t in cells]


# (concurrency, AR tok/s, DFlash tok/s, speedup, tau), exactly as on the card
_GEMMA4_31B = PublishedTable(
    pair="gemma-4-31B-it",
    card="https://huggingface.co/z-lab/gemma-4-31B-it-DFlash",
    settings=PublishedSettings(
        gpu="B300", engine="vllm", engine_version="build of vLLM PR #41703", thinking=True, max_tokens=4096,
        temperature=0.0, block_size=16),
    rows=[
        *_rows("math500", [(1, 77, 447, 5.8, 8.59), (8, 511, 2650, 5.2, 8.59), (32, 1308, 4962, 3.8, 8.62)]),
        *_rows("gsm8k", [(1, 78, 408, 5.3, 7.53), (8, 520, 2321, 4.5, 7.50), (32, 1382, 4447, 3.2, 7.52)]),
        *_rows("humaneval", [(1, 76, 420, 5.6, 8.00), (8, 494, 2389, 4.8, 7.89), (32, 1145, 4139, 3.6, 7.96)]),
        *_rows("mbpp", [(1, 79, 343, 4.4, 6.13), (8, 535, 2036, 3.8, 6.13), (32, 1389, 3636, 2.6, 6.14)]),
        *_rows("mt-bench", [(1, 79, 236, 3.0, 4.23), (8, 503, 1334, 2.7, 4.19), (32, 1177, 2257, 1.9, 4.19)]),
    ],
    notes="one B300 per server; draft attention_backend flash_attn, target --attention-backend triton_attn "
          "--max-num-batched-tokens 32768, num_speculative_tokens 15",
)

_QWEN35_4B = PublishedTable(
    pair="Qwen3.5-4B",
    card="https://huggingface.co/z-lab/Qwen3.5-4B-DFlash",
    settings=PublishedSettings(gpu="B200", engine="sglang", thinking=True, max_tokens=4096, block_size=16),
    rows=[PublishedRow(suite="math500", concurrency=c, ar_tok_s=ar, dflash_tok_s=df, speedup=s)
          for c, ar, df, s in [(1, 274, 959, 3.5), (8, 1971, 5851, 3.0), (16, 3663, 8563, 2.3),
                               (32, 5836, 10713, 1.8)]],
    notes="the card also gives MTP 458 tok/s (1.7x) at concurrency 1; it publishes no tau for this table",
)

_QWEN3_8B = PublishedTable(
    pair="Qwen3-8B",
    card="https://arxiv.org/abs/2602.06036",
    settings=PublishedSettings(gpu="B200", engine="transformers", thinking=False, temperature=0.0, block_size=16,
                               metric="decode speedup over AR (the paper's protocol: Transformers backend)"),
    rows=[PublishedRow(suite="gsm8k", concurrency=1, speedup=5.15, tau=6.54),
          PublishedRow(suite="math500", concurrency=1, speedup=4.64, tau=5.82)],
    notes="the DFlash paper's table (greedy, one B200); its other suites and the Qwen3-8B card's figures are not "
          "quoted in anything read here",
)

PUBLISHED: dict[str, PublishedTable] = {t.pair: t for t in (_GEMMA4_31B, _QWEN35_4B, _QWEN3_8B)}


def published_for(pair: str) -> PublishedTable | None:
    """The card's table for a known pair's name (models.KNOWN), or None where its card has none."""
    return PUBLISHED.get(pair)


# ---------------------------------------------------------------- the release's claims


class PublishedClaim(BaseModel):
    """One claim of DFlash's release, as published, and the setup it was measured on (None: not stated)."""

    key: str  # the claim's row: gemma-26b, qwen3-8b, gpt-oss-120b, eagle3
    pair: str  # models.KNOWN name
    claim: str  # the figures as published
    gpu: str
    gpus: int = 1
    engine: str
    concurrency: str  # as published: "1", "high", "1-32"
    speedup: float | None = None  # over AR (the low end of a range)
    tok_s: float | None = None  # per server, or per user where `per_user`
    per_user: bool = False
    tau: float | None = None
    over_eagle3: tuple[float, float] | None = None  # DFlash's speedup over EAGLE-3's, low and high
    source: str  # where it is quoted


CLAIMS: list[PublishedClaim] = [
    PublishedClaim(key="gemma-26b", pair="gemma-4-26B-A4B-it", claim="222.3 tok/s, 3.4x over AR, tau about 7.8",
                   gpu="H100", engine="vllm", concurrency="1", speedup=3.4, tok_s=222.3, tau=7.8,
                   source="an independent H100 report the release cites (one long HTML prompt)"),
    PublishedClaim(key="qwen3-8b", pair="Qwen3-8B", claim="5.1x over AR", gpu="not stated", engine="sglang",
                   concurrency="1", speedup=5.1, tau=6.54,
                   source="the release; the paper: GSM8K 5.15x at tau 6.54, MATH-500 4.64x at 5.82 (one B200)"),
    PublishedClaim(key="gpt-oss-120b", pair="gpt-oss-120b", claim="15x over AR at 500-600 tok/s per user",
                   gpu="B300", gpus=8, engine="vllm", concurrency="high", speedup=15.0, tok_s=500.0, per_user=True,
                   source="the release (an 8-GPU DGX B300)"),
    PublishedClaim(key="eagle3", pair="Qwen3-8B", claim="DFlash 1.5-1.7x over EAGLE-3 on SPEED-Bench",
                   gpu="not stated", engine="vllm", concurrency="1-32", over_eagle3=(1.5, 1.7),
                   source="the release (vLLM and SGLang); 'nearly doubles interactivity over EAGLE-3' on Llama 3.1 8B"),
]


def claim(key: str) -> PublishedClaim:
    """The release's claim of a row (CLAIMS), by its key."""
    return next(c for c in CLAIMS if c.key == key)


# ---------------------------------------------------------------- what differs


class RunSettings(BaseModel):
    """What a sweep ran with, as far as it knows. None means not recorded."""

    gpu: str | None = None  # the driver's name, e.g. "NVIDIA H100 80GB HBM3"
    engine: str | None = None
    thinking: bool | None = None  # as read from the rendered prompt (dflash_bench.thinking), not the flag
    reasoning_effort: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    block_size: int | None = None
    template_hash: str | None = None


class SettingGap(BaseModel):
    setting: str
    published: str
    measured: str
    status: Literal["differs", "unknown"]  # unknown: one side does not say, so it cannot be ruled out


_GPU_RE = re.compile(r"\b(GB\d{3}|[ABHL]\d{2,3}S?|RTX ?\w+|MI\d{3}X?)\b", re.IGNORECASE)


def gpu_model(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100'; a name with no known model token is returned stripped."""
    m = _GPU_RE.search(name)
    return m.group(1).upper().replace(" ", "") if m else name.strip()


def _show(v: object) -> str:
    if v is None:
        return "not stated"
    if isinstance(v, bool):
        return "on" if v else "off"
    return str(v)


def setting_gaps(published: PublishedSettings, run: RunSettings) -> list[SettingGap]:
    """Every setting where the run and the card differ, or where one side does not say: likely causes of a gap."""
    pairs: list[tuple[str, object, object, object, object]] = [
        ("GPU", published.gpu, run.gpu, gpu_model(published.gpu), run.gpu and gpu_model(run.gpu)),
        ("engine", published.engine, run.engine, published.engine.lower(), run.engine and run.engine.lower()),
        ("thinking", published.thinking, run.thinking, published.thinking, run.thinking),
        ("reasoning effort", published.reasoning_effort, run.reasoning_effort,
         published.reasoning_effort, run.reasoning_effort),
        ("max tokens", published.max_tokens, run.max_tokens, published.max_tokens, run.max_tokens),
        ("temperature", published.temperature, run.temperature, published.temperature, run.temperature),
        ("block size", published.block_size, run.block_size, published.block_size, run.block_size),
        ("template hash", published.template_hash, run.template_hash, published.template_hash, run.template_hash),
    ]
    gaps = []
    for name, pub, got, pub_key, got_key in pairs:
        if pub is None and got is None:
            continue  # neither side has it: nothing to point at (reasoning effort on a Qwen card)
        if pub is None or got is None:
            gaps.append(SettingGap(setting=name, published=_show(pub), measured=_show(got), status="unknown"))
        elif pub_key != got_key:
            gaps.append(SettingGap(setting=name, published=_show(pub), measured=_show(got), status="differs"))
    return gaps


# ---------------------------------------------------------------- side by side


class MeasuredRow(BaseModel):
    """One suite x concurrency of a sweep (analysis.headline()'s columns)."""

    suite: str
    concurrency: int
    ar_tok_s: float | None = None
    dflash_tok_s: float | None = None
    tau: float | None = None
    speedup: float | None = None  # the cell's one speedup (speedup.py speedup_of); else DFlash / AR tok/s


class SideBySide(BaseModel):
    suite: str
    concurrency: int
    published: PublishedRow
    measured: MeasuredRow | None = None  # None: the sweep did not run this cell
    measured_speedup: float | None = None
    speedup_ratio: float | None = Field(default=None, description="measured speedup / the card's")


def side_by_side(table: PublishedTable, measured: Iterable[MeasuredRow]) -> list[SideBySide]:
    """The card's rows, each with the sweep's cell of the same suite and concurrency where it ran one."""
    by_key = {(m.suite, m.concurrency): m for m in measured}
    out = []
    for row in table.rows:
        m = by_key.get((row.suite, row.concurrency))
        speedup = m.speedup if m and m.speedup is not None else (
            m.dflash_tok_s / m.ar_tok_s if m and m.ar_tok_s and m.dflash_tok_s is not None else None)
        card = row.speedup if row.speedup is not None else (
            row.dflash_tok_s / row.ar_tok_s if row.ar_tok_s and row.dflash_tok_s else None)
        ratio = speedup / card if speedup is not None and card else None
        out.append(SideBySide(suite=row.suite, concurrency=row.concurrency, published=row, measured=m,
                              measured_speedup=speedup, speedup_ratio=ratio))
    return out

"""Suite definitions: the schema of suites/<name>.toml (every table and key it may hold, nothing else),
and the Suite each file becomes.

A misspelt key (`feilds`, `refrence_after`) would otherwise be ignored and change what is loaded or how it
is scored, so unknown keys are refused, naming the key and the file.
"""

from __future__ import annotations

import os
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dflash_bench.errors import UserError

SUITES_ENV = "DFLASH_BENCH_SUITES"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HubSource(_Strict):
    id: str | None = None  # Hugging Face dataset id
    config: str | None = None
    split: str | None = None
    url: str | None = None  # a jsonl URL read through `datasets` when there is no hub dataset
    rename: dict[str, str] = Field(default_factory=dict)  # hub column -> offline field name
    configs: list[str] = Field(default_factory=list)  # selectable hub configs


class OfflineSource(_Strict):
    files: list[str]  # relative to a data dir; may hold {config} and glob patterns
    format: str = "auto"  # jsonl | jsonl.gz | json | parquet | auto (by suffix)
    prepare: str | None = None  # how to prepare the files when they are missing


class PromptSpec(_Strict):
    fields: list[str] | None = None
    template: str
    turns_field: str | None = None  # a list of turns; the template is applied to each as {turn}
    placeholder: str | None = None  # text that marks an unresolved record: never sent


class RecordFields(_Strict):
    id: str | None = None
    category: str | None = None
    reference: str | None = None
    reference_after: str | None = None  # the reference answer is the text after this marker
    meta: list[str] = Field(default_factory=list)


class SuiteFile(_Strict):
    """One suites/*.toml file."""

    name: str
    description: str = ""
    stands_in_for: str | None = None  # the suite it replaces where that one's data is not at hand (spec-bench)
    default_max_tokens: int
    num_turns: int | None = None
    hub: HubSource = Field(default_factory=HubSource)
    offline: OfflineSource
    prompt: PromptSpec
    fields: RecordFields = Field(default_factory=RecordFields)
    select: dict[str, tuple[int, int]] = Field(default_factory=dict)  # field -> inclusive range
    filters: dict[str, str] = Field(default_factory=dict)  # load_prompts keyword -> record field
    category_map: dict[str, str] = Field(default_factory=dict)
    categories: dict[str, list[str]] = Field(default_factory=dict)


def read_suite_file(path: Path) -> SuiteFile:
    """The validated contents of a suite TOML; anything wrong is one UserError sentence naming the file."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise UserError(f"suite file {path} is invalid ({type(err).__name__}: {err}).") from None
    try:
        return SuiteFile.model_validate(data)
    except ValidationError as err:
        e = err.errors()[0]
        where = ".".join(str(x) for x in e.get("loc", ()))
        if e.get("type") == "extra_forbidden":
            raise UserError(f"suite file {path} has an unknown key {where!r}; check its spelling "
                            "(see suites/gsm8k.toml for the known keys).") from None
        raise UserError(f"suite file {path} is invalid ({where}: {e.get('msg')}).") from None


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    path: Path  # the TOML file
    stands_in_for: str | None  # the suite it replaces where that one's data is not at hand (spec-bench)
    hf_id: str | None
    hf_config: str | None
    hf_split: str | None
    hf_url: str | None  # a jsonl URL read through `datasets` when the suite has no hub dataset (spec-bench)
    hf_rename: dict[str, str]  # hub column -> offline field name, so one field mapping serves both
    configs: tuple[str, ...]  # selectable hub configs (speed-bench); empty: only hf_config
    files: tuple[str, ...]  # offline files relative to a data dir; may hold {config} and glob patterns
    file_format: str  # jsonl | jsonl.gz | json | parquet | auto (by suffix)
    prompt_fields: tuple[str, ...]
    template: str
    turns_field: str | None  # a list of turns; the template is applied to each as {turn}
    placeholder: str | None  # text that marks an unresolved record: never sent
    prepare_hint: str | None
    default_max_tokens: int
    num_turns: int | None  # most turns sent per record (None: all of them)
    id_field: str | None
    category_field: str | None
    reference_field: str | None
    reference_after: str | None
    meta_fields: tuple[str, ...]
    select: dict[str, tuple[int, int]]  # field -> inclusive range, applied always (mbpp test split)
    filters: dict[str, str]  # load_prompts keyword -> record field
    category_map: dict[str, str]
    known_categories: tuple[str, ...]

    @property
    def source(self) -> str:
        if self.hf_url:
            return self.hf_url
        return ":".join(x for x in (self.hf_id, self.hf_config) if x) + f" [{self.hf_split}]"


# ---------------------------------------------------------------- suite definitions


def suites_dir() -> Path:
    """The folder of suite TOMLs: $DFLASH_BENCH_SUITES, the repo's suites/ (editable), or the installed copy."""
    candidates = [Path(p) for p in [os.environ.get(SUITES_ENV)] if p]
    candidates += [Path(__file__).resolve().parents[1] / "suites", Path(sys.prefix) / "share" / "dflash-bench" / "suites"]
    for path in candidates:
        if path.is_dir() and any(path.glob("*.toml")):
            return path
    raise UserError(f"no suite definitions found (looked in {', '.join(map(str, candidates))}); set {SUITES_ENV}.")


def parse_suite(path: Path) -> Suite:
    f = read_suite_file(path)
    hub, off, prm, fld = f.hub, f.offline, f.prompt, f.fields
    return Suite(
        name=f.name, description=f.description, path=path, stands_in_for=f.stands_in_for,
        hf_id=hub.id, hf_config=hub.config, hf_split=hub.split, hf_url=hub.url,
        hf_rename=dict(hub.rename), configs=tuple(hub.configs),
        files=tuple(off.files), file_format=off.format, prepare_hint=off.prepare,
        prompt_fields=tuple(prm.fields if prm.fields is not None else [prm.turns_field] if prm.turns_field else []),
        template=prm.template, turns_field=prm.turns_field, placeholder=prm.placeholder,
        default_max_tokens=f.default_max_tokens, num_turns=f.num_turns or None,
        id_field=fld.id, category_field=fld.category, reference_field=fld.reference,
        reference_after=fld.reference_after, meta_fields=tuple(fld.meta),
        select={k: (int(lo), int(hi)) for k, (lo, hi) in f.select.items()},
        filters=dict(f.filters), category_map=dict(f.category_map),
        known_categories=tuple(c for cs in f.categories.values() for c in cs),
    )


def load_suites() -> tuple[list[Suite], dict[Path, str]]:
    """Every suite that parses, sorted by name, and the reason of each file that does not: one broken file
    does not hide the others."""
    suites, broken = [], {}
    for path in sorted(suites_dir().glob("*.toml")):
        try:
            suites.append(parse_suite(path))
        except UserError as err:
            broken[path] = str(err)
    return sorted(suites, key=lambda s: s.name), broken


def list_suites() -> list[Suite]:
    """Every suite defined in the suites folder that parses, sorted by name."""
    return load_suites()[0]


def suite_headings(names: Iterable[str]) -> dict[str, str]:
    """How a table names each suite, the suite files read once: its name, with the suite it stands in for where it
    does ("spec-bench, in place of speed-bench"); a name no suite file has (the long-<N> suites, a folder's own)
    as it is."""
    try:
        stands = {s.name: s.stands_in_for for s in load_suites()[0]}
    except UserError:
        stands = {}
    return {n: f"{n}, in place of {stands[n]}" if stands.get(n) else n for n in names}


def get_suite(name: str) -> Suite:
    """The suite called `name`; an unknown name is a UserError listing the known ones, and a suite whose
    file is broken is that file's error."""
    found, broken = load_suites()
    suites = {s.name: s for s in found}
    if name in suites:
        return suites[name]
    for path, reason in broken.items():
        if path.stem == name:
            raise UserError(reason)
    unreadable = f" (unreadable: {', '.join(p.name for p in broken)})" if broken else ""
    raise UserError(f"unknown suite {name!r}; known suites: {', '.join(suites)}{unreadable}.")

"""Benchmark suites: definitions in suites/*.toml, prompts loaded from the Hugging Face hub or an offline folder.

    load_prompts("gsm8k", data_dir=Path("../shared/datasets"), num_prompts=128, seed=0)

Each TOML file states where a suite's records come from (hub id/config/split, or the upstream files under a
data dir), which fields form the user turn(s) and through which template (DFlash's own), and which fields hold
the id, category and reference answer. Loading turns records into `Prompt`s; anything wrong with the data
becomes one `UserError` sentence naming the suite and the file (and the line, for jsonl).
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import json
import os
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_bench.errors import UserError
from dflash_bench.store.reading import check_value
from dflash_bench.suite_file import SUITES_ENV, Suite, get_suite, list_suites, load_suites, suites_dir

__all__ = ["SUITES_ENV", "DataMissing", "Prompt", "Suite", "get_suite", "list_suites", "load_prompts",
           "load_suites", "print_prompts", "print_suites", "suites_dir"]

_FIELD_RE = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True)
class Prompt:
    id: str  # "<suite>/<record id>", unique within the suite; cycling past the end adds "#k"
    suite: str
    turns: list[str]  # rendered user turns (template applied); a turn after the first follows the model's reply
    category: str | None
    reference: str | None  # reference answer (gsm8k: text after '#### '; lists: their first element)
    meta: dict = field(default_factory=dict)  # what a scorer needs: humaneval test/entry_point, mbpp test_list, ...


# ---------------------------------------------------------------- reading records


class DataMissing(UserError):
    """The suite's data is not where it was looked for (a file, or a prepared copy)."""


def _read_file(suite: Suite, path: Path, fmt: str) -> Iterator[tuple[str, dict]]:
    """Yield (where, record) for every record of one upstream file; `where` names the file and line/record."""
    if fmt == "auto":
        fmt = "jsonl.gz" if path.name.endswith(".jsonl.gz") else path.suffix.lstrip(".")
    try:
        if fmt in ("jsonl", "jsonl.gz"):
            opener = gzip.open if fmt == "jsonl.gz" else open
            with opener(path, "rt", encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if line.strip():
                        yield f"{path} line {n}", _json_record(suite, f"{path} line {n}", line)
        elif fmt == "json":
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, list):
                raise UserError(f"suite {suite.name}: {path} is not a JSON list of records.")
            for i, rec in enumerate(data):
                yield f"{path} record {i}", _check_dict(suite, f"{path} record {i}", rec)
        elif fmt == "parquet":
            import pyarrow.parquet as pq

            for i, rec in enumerate(pq.read_table(path).to_pylist()):
                yield f"{path} row {i}", rec
        else:
            raise UserError(f"suite {suite.name}: {path} has an unknown format {fmt!r} (jsonl, jsonl.gz, json, parquet).")
    except (OSError, UnicodeDecodeError, EOFError, json.JSONDecodeError) as err:
        if isinstance(err, FileNotFoundError):
            raise DataMissing(f"suite {suite.name}: file {path} not found; point --data-dir at a folder laid out "
                              f"like shared/datasets, or leave it out to load from the hub.") from None
        raise UserError(f"suite {suite.name}: {path} could not be read as {fmt} ({type(err).__name__}: {err}).") from None
    except Exception as err:  # pyarrow's errors for a corrupt parquet file
        if isinstance(err, UserError):
            raise
        raise UserError(f"suite {suite.name}: {path} could not be read as {fmt} ({type(err).__name__}: {err}).") from None


def _json_record(suite: Suite, where: str, line: str) -> dict:
    try:
        return _check_dict(suite, where, json.loads(line))
    except json.JSONDecodeError as err:
        raise UserError(f"suite {suite.name}: {where} is not valid JSON ({err.msg}).") from None


def _check_dict(suite: Suite, where: str, rec: Any) -> dict:
    if not isinstance(rec, dict):
        raise UserError(f"suite {suite.name}: {where} is not a JSON object.")
    return rec


def _offline_files(suite: Suite, data_dir: Path, config: str | None) -> list[Path]:
    if not data_dir.is_dir():
        what = "is a file, not a folder" if data_dir.exists() else "does not exist"
        raise DataMissing(f"suite {suite.name}: data dir {data_dir} {what}.")
    patterns = [p.replace("{config}", config or "") for p in suite.files]
    if not any(glob.has_magic(p) for p in patterns):
        return [data_dir / p for p in patterns]
    for pattern in patterns:  # alternatives: the first pattern that matches wins
        found = sorted(Path(p) for p in glob.glob(str(data_dir / pattern)))
        if found:
            return found
    hint = (suite.prepare_hint or "").replace("{config}", config or "")
    raise DataMissing(f"suite {suite.name}: no prepared copy of config {config} under {data_dir} "
                      f"(looked for {', '.join(patterns)}); {hint}.")


HUB_PROBE_S = 5.0  # one request's wait for the hub before `datasets`, whose retries take minutes when offline
_hub_answers: dict[str, str | None] = {}  # origin -> None (it answered) or why not, asked once per process


def check_hub(url: str | None = None) -> None:
    """Refuse in one sentence, within HUB_PROBE_S, a hub (or a suite's remote URL) that does not answer.

    One plain request to the origin: any HTTP answer, an error status included, means it is reachable. Skipped
    where the user chose the hub's offline mode (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE: `datasets` reads its cache)."""
    import urllib.parse

    if any(os.environ.get(k, "").strip().lower() in ("1", "true", "yes", "on") for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")):
        return
    parts = urllib.parse.urlsplit(url or os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    if parts.scheme not in ("http", "https"):
        return  # a local file given as the suite's URL
    origin = f"{parts.scheme}://{parts.netloc}"
    if origin not in _hub_answers:
        _hub_answers[origin] = _probe(origin)
    why = _hub_answers[origin]
    if why is not None:
        raise UserError(f"the Hugging Face hub ({origin}) cannot be reached ({why}): pass --data-dir with offline "
                        "copies of the prompt sets (e.g. ../shared/datasets), or check the network.")


def _probe(origin: str) -> str | None:
    import http.client
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(urllib.request.Request(origin + "/", method="HEAD"), timeout=HUB_PROBE_S):
            return None
    except urllib.error.HTTPError:
        return None  # it answered
    except urllib.error.URLError as err:
        reason = err.reason
        return f"{type(reason).__name__}: {reason}" if isinstance(reason, BaseException) else str(reason)
    except (OSError, http.client.HTTPException) as err:
        return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


def _read_hub(suite: Suite, config: str | None) -> Iterator[tuple[str, dict]]:
    try:
        import datasets
    except ImportError:
        raise UserError("loading suites from the hub needs the 'datasets' package; pip install datasets, or pass --data-dir.") from None
    check_hub(suite.hf_url)
    try:
        if suite.hf_url:
            ds = datasets.load_dataset("json", data_files=suite.hf_url, split="train")
        else:
            ds = datasets.load_dataset(suite.hf_id, config or suite.hf_config, split=suite.hf_split)
    except Exception as err:  # network, auth, gated dataset, unknown config: all end the same way for the user
        msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"suite {suite.name}: could not load {suite.source} from the Hugging Face hub ({msg}); "
                        f"check the network and HF_TOKEN, or pass --data-dir with an offline copy.") from None
    for i, row in enumerate(ds):
        yield f"{suite.source} row {i}", {suite.hf_rename.get(k, k): v for k, v in row.items()}


def _records(suite: Suite, data_dir: Path | None, config: str | None) -> Iterator[tuple[str, dict]]:
    if data_dir is None:
        yield from _read_hub(suite, config)
        return
    for path in _offline_files(suite, Path(data_dir), config):
        yield from _read_file(suite, path, suite.file_format)


# ---------------------------------------------------------------- records -> prompts


def _render(suite: Suite, where: str, template: str, values: dict) -> str:
    def field_text(m: re.Match) -> str:
        value = values.get(m.group(1))
        if not isinstance(value, str):
            raise UserError(f"suite {suite.name}: {where} has no text field {m.group(1)!r}.")
        return value

    return _FIELD_RE.sub(field_text, template)


def _turns(suite: Suite, where: str, rec: dict) -> list[str]:
    if suite.turns_field is None:
        return [_render(suite, where, suite.template, rec)]
    raw = rec.get(suite.turns_field)
    if not isinstance(raw, list) or not raw or not all(isinstance(t, str) for t in raw):
        raise UserError(f"suite {suite.name}: {where} has no list of text turns in field {suite.turns_field!r}.")
    return [_render(suite, where, suite.template, {**rec, "turn": t}) for t in raw[: suite.num_turns]]


def _to_prompt(suite: Suite, where: str, index: int, rec: dict) -> Prompt:
    try:  # text no request body, folder file or terminal can hold (a lone surrogate), refused before anything is sent
        check_value(rec)
    except ValueError as err:
        raise UserError(f"suite {suite.name}: {where} {err}; fix or remove that record.") from None
    rid = rec.get(suite.id_field) if suite.id_field else None
    raw_cat = rec.get(suite.category_field) if suite.category_field else None
    category = None if raw_cat is None else suite.category_map.get(str(raw_cat), str(raw_cat))
    meta = {k: rec[k] for k in suite.meta_fields if k in rec}
    if category is not None and category != str(raw_cat):
        meta["sub_category"] = str(raw_cat)
    ref = rec.get(suite.reference_field) if suite.reference_field else None
    if isinstance(ref, list):
        meta["references"] = ref
        ref = ref[0] if ref else None
    if ref is not None:
        ref = str(ref)
        if suite.reference_after and suite.reference_after in ref:
            ref = ref.rsplit(suite.reference_after, 1)[1].strip()
    return Prompt(id=f"{suite.name}/{index if rid is None else rid}", suite=suite.name,
                  turns=_turns(suite, where, rec), category=category, reference=ref, meta=meta)


def _in_select(suite: Suite, where: str, rec: dict) -> bool:
    for name, (lo, hi) in suite.select.items():
        try:
            value = int(rec[name])
        except (KeyError, TypeError, ValueError):
            raise UserError(f"suite {suite.name}: {where} has no integer field {name!r}.") from None
        if not lo <= value <= hi:
            return False
    return True


def _matches(rec: dict, wanted: dict[str, set[str]]) -> bool:
    return all(str(rec.get(fld)) in values for fld, values in wanted.items())


def _as_set(value: Any) -> set[str]:
    return {str(v) for v in value} if isinstance(value, (list, tuple, set)) else {str(value)}


def _check_config(suite: Suite, config: str | None) -> str | None:
    if config is None or config == suite.hf_config:
        return suite.hf_config
    if config not in suite.configs:
        choices = ", ".join(suite.configs) if suite.configs else "none"
        raise UserError(f"suite {suite.name} has no config {config!r}; its configs: {choices}.")
    return config


def load_prompts(name: str, *, data_dir: Path | None = None, num_prompts: int | None = None, seed: int = 0,
                 categories: list[str] | None = None, config: str | None = None, **filters: Any) -> list[Prompt]:
    """The suite's prompts, rendered as they are sent.

    data_dir=None loads from the Hugging Face hub; a data dir reads the upstream files offline.
    num_prompts=None: every record, in file order. num_prompts=N: N prompts drawn in an order shuffled by `seed`
    (the same every time), cycling through the set again when N exceeds it (repeats get ids ending in "#k").
    categories keeps only those categories; config picks a hub config (speed-bench); other keywords are the
    suite's [filters] (speed-bench tier="mixed", math500 level=5), each a value or a list of values.
    """
    suite = get_suite(name)
    config = _check_config(suite, config)
    unknown = set(filters) - set(suite.filters)
    if unknown:
        raise UserError(f"suite {name} has no filter {', '.join(sorted(unknown))}; "
                        f"its filters: {', '.join(suite.filters) or 'none'}.")
    wanted = {suite.filters[k]: _as_set(v) for k, v in filters.items() if v is not None}
    prompts = [
        _to_prompt(suite, where, i, rec)
        for i, (where, rec) in enumerate(_records(suite, data_dir, config))
        if _in_select(suite, where, rec) and _matches(rec, wanted)
    ]
    if categories:
        present = sorted({p.category for p in prompts if p.category is not None})
        missing = sorted(set(categories) - set(present))
        if missing:
            raise UserError(f"suite {name} has no category {', '.join(missing)}; its categories: {', '.join(present) or 'none'}.")
        prompts = [p for p in prompts if p.category in categories]
    if not prompts:
        raise UserError(f"suite {name}: no records match the filters {filters or ''}.")
    _refuse_placeholders(suite, prompts, config)
    return _sample(prompts, num_prompts, seed)


def _refuse_placeholders(suite: Suite, prompts: list[Prompt], config: str | None) -> None:
    if not suite.placeholder:
        return
    bad = sum(any(suite.placeholder in t for t in p.turns) for p in prompts)
    if bad:
        hint = (suite.prepare_hint or "").replace("{config}", config or "")
        raise UserError(f"suite {suite.name}: {bad} of {len(prompts)} records hold the placeholder "
                        f"{suite.placeholder!r} instead of text and are never sent; {hint}.")


def _sample(prompts: list[Prompt], num_prompts: int | None, seed: int) -> list[Prompt]:
    if num_prompts is None:
        return prompts
    if num_prompts < 1:
        raise UserError(f"--num-prompts must be at least 1, not {num_prompts}.")
    order = list(range(len(prompts)))
    random.Random(seed).shuffle(order)
    out = []
    for i in range(num_prompts):
        k, j = divmod(i, len(order))
        p = prompts[order[j]]
        out.append(p if k == 0 else dataclasses.replace(p, id=f"{p.id}#{k}"))
    return out


# ---------------------------------------------------------------- CLI views


def print_suites(data_dir: Path | None = None) -> None:
    """`dflash-bench suites list`: one row per suite; records and categories counted offline when data is there."""
    from dflash_bench.console import new_console
    from rich.table import Table
    from rich.text import Text

    table = Table("suite", "source", "records", "categories", "turns", "max tokens")
    table.columns[1].overflow = "fold"
    suites, broken = load_suites()
    for suite in suites:
        records, cats = "hub", list(suite.known_categories)
        if data_dir is not None:
            try:
                prompts = load_prompts(suite.name, data_dir=data_dir)
                records, cats = str(len(prompts)), sorted({p.category for p in prompts if p.category})
            except DataMissing:
                records = "hub"
            except UserError:
                records = f"unreadable (dflash-bench suites show {suite.name})"
        table.add_row(Text(suite.name), Text(suite.source), Text(records), Text(", ".join(cats) or "-"),
                      Text(str(suite.num_turns or "all")), Text(str(suite.default_max_tokens)))
    for path, reason in broken.items():
        table.add_row(Text(path.stem), Text(reason), Text("unreadable"), Text("-"), Text("-"), Text("-"))
    new_console().print(table)


def print_prompts(name: str, num: int = 3, data_dir: Path | None = None, config: str | None = None,
                  categories: list[str] | None = None) -> None:
    """`dflash-bench suites show`: the first `num` prompts, rendered as sent. Dataset text is never read as markup."""
    from dflash_bench.console import new_console
    from rich.rule import Rule
    from rich.text import Text

    if num < 1:
        raise UserError(f"-n must be at least 1, not {num}.")
    suite = get_suite(name)
    prompts = load_prompts(name, data_dir=data_dir, config=config, categories=categories)
    console = new_console()
    console.print(Text(f"{suite.name}: {suite.description} {len(prompts)} records; source {suite.source}; "
                       f"max_tokens {suite.default_max_tokens}"))
    for p in prompts[:num]:
        console.print(Rule(Text(f"{p.id}" + (f"  [{p.category}]" if p.category else ""))))
        for i, turn in enumerate(p.turns, 1):
            if len(p.turns) > 1:
                console.print(Text(f"turn {i}:", style="bold"))
            console.print(Text(turn))
        if p.reference is not None:
            console.print(Text("reference: ", style="dim") + Text(p.reference))

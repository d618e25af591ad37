"""The sweep folder on disk: atomic writes, and reading every file back through its schema.

Every write is atomic (temporary file in the same folder, fsync, rename): a failure or a kill at any moment
leaves the old file or the new one, never half of one. Readers turn a half-written or foreign folder into a
StoreError (a UserError), and read files of schema version 1 as version 2 (store/migrate.py) without
writing them back; `SweepDir.migrate()` does that on request. A cell is reached only through store/layout.py: its
identity is its folder's name under cells/, never a path a file holds, and no link is followed.
"""

from __future__ import annotations

import errno
import io
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Iterable

from pydantic import BaseModel, ValidationError

from dflash_bench.store.migrate import OLDEST, manifest_v1, needs_migration, summary_v1
from dflash_bench.store import layout
from dflash_bench.store.cells import MEASURED, SCHEMA_VERSION, CellKey, CellSummary, RequestRecord, ServerMetrics
from dflash_bench.store.layout import STRAY_REMEDY, present
from dflash_bench.store.manifest import Manifest
from dflash_bench.store.reading import StoreError, load_json, parse_json, read_text, remedy, shown
from dflash_bench.store.results import csv_text
from dflash_bench.store.telemetry_csv import read_csv as read_telemetry
from dflash_bench.store.timestamps import now_iso

MANIFEST = "manifest.json"
SUMMARY = "summary.json"
REQUESTS = "requests.jsonl"
SERVER_METRICS = "server_metrics.json"
TELEMETRY = "telemetry.csv"
RESULTS = "results.csv"


# ---------------------------------------------------------------- atomic writes


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _umask()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` as `path` whole or not at all; a disk that is full (or refuses the write) is a StoreError
    naming the file, so the user knows which folder's disk to free."""
    path = Path(path)
    _check_writable(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:
        raise write_error(path, err) from None
    try:
        try:
            os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; the result should read like any other file
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise write_error(path, err) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _check_writable(path: Path) -> None:
    """A StoreError when `path` is a file made read-only: replacing it (a rename needs only the folder's
    permission) would undo what its owner asked for."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return  # nothing there yet (or nothing this check can say about)
    if stat.S_ISREG(mode) and not mode & 0o222:
        raise StoreError(f"cannot write {path}: it is read-only; make it writable (chmod u+w) or write to another path")


class DiskFull(StoreError):
    """A write refused because the disk (or the user's quota) is full."""


def write_error(path: Path, err: OSError) -> "StoreError":
    """The sentence for a write to `path` that failed: a full disk names the folder to free."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFull(f"cannot write {path}: the disk holding {path.parent} is full; free space there (what "
                          "was written before is kept, and --resume finishes a sweep)")
    if err.errno in (errno.EEXIST, errno.ENOTDIR):  # a file stands where a folder of the path should be
        blocker = next((p for p in path.parents if p.exists()), path.parent)
        return StoreError(f"cannot write {path}: {blocker} is a file, not a folder")
    return StoreError(f"cannot write {path}: {err.strerror or err}")


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: Path, obj: Any) -> None:
    if isinstance(obj, BaseModel):
        text = obj.model_dump_json(indent=2)
    else:
        text = json.dumps(obj, indent=2, default=str)
    atomic_write_text(path, text + "\n")


# ---------------------------------------------------------------- the folder


def check_folder_name(name: str, option: str = "--name") -> str:
    """`name` when it is one plain folder name (it stays under --out); a StoreError otherwise, before anything
    is written."""
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise StoreError(f"{option} {name!r} is not a folder name: give one name (no '/', not '.' or '..'); the "
                         "folder is made under --out")
    return name


class SweepDir:
    """A sweep folder on disk. `SweepDir.create` starts one, `SweepDir.open` reads one back."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.migrated_from: int | None = None  # the schema version read, when older than this one's

    @classmethod
    def create(cls, path: Path, manifest: Manifest) -> "SweepDir":
        path = Path(path)
        if (path / MANIFEST).exists():
            raise StoreError(f"{path} already holds a sweep; pass --resume {path} or choose another --out")
        sweep = cls(path)
        try:
            (path / layout.CELLS).mkdir(parents=True, exist_ok=True)
            (path / "logs").mkdir(exist_ok=True)
        except OSError as err:
            raise write_error(path / layout.CELLS, err) from None
        sweep.write_manifest(manifest)
        return sweep

    @classmethod
    def open(cls, path: Path) -> "SweepDir":
        sweep = cls(path)
        sweep.read_manifest()  # validates
        return sweep

    @property
    def migration_note(self) -> str | None:
        """One line for the user when the folder was read from an older schema (None otherwise)."""
        if self.migrated_from is None:
            return None
        return (f"note: {self.path} was written with schema version {self.migrated_from}; read as version "
                f"{SCHEMA_VERSION} (the folder is unchanged)")

    # manifest
    def read_manifest(self) -> Manifest:
        file = self.path / MANIFEST
        if not self.path.is_dir():
            raise StoreError(f"{self.path} is not a folder; give the path of a sweep folder")
        if not file.exists():
            raise StoreError(f"{self.path} has no {MANIFEST}: it is not a dflash-bench sweep folder")
        data = load_json(file)
        if needs_migration(data):
            self.migrated_from = OLDEST
            data = manifest_v1(data)
        version = data.get("schema_version") if isinstance(data, dict) else None
        if version != SCHEMA_VERSION:
            raise StoreError(f"{file} has schema version {version}; this dflash-bench reads versions "
                             f"{OLDEST} to {SCHEMA_VERSION}")
        return _validate(Manifest, data, file)

    def write_manifest(self, manifest: Manifest) -> None:
        manifest.updated_at = now_iso()
        atomic_write_json(self.path / MANIFEST, manifest)

    # cells
    def cell_dir(self, cid: str) -> Path:
        """The folder of cell `cid`: one plain name under cells/, never a symbolic link (store/layout.py)."""
        return layout.cell_path(self.path, cid)

    def log_path(self, engine: str, mode: str) -> Path:
        return self.path / "logs" / f"{engine}-{mode}.log"

    def is_complete(self, cid: str) -> bool:
        return present(self.cell_dir(cid) / SUMMARY)

    def write_requests(self, cid: str, records: Iterable[RequestRecord]) -> None:
        buf = io.StringIO()
        for r in records:
            buf.write(r.model_dump_json(exclude_none=True))
            buf.write("\n")
        atomic_write_text(self.cell_dir(cid) / REQUESTS, buf.getvalue())

    def read_requests(self, cid: str) -> list[RequestRecord]:
        file = self.cell_dir(cid) / REQUESTS
        if not present(file):
            return []
        out = []
        for lineno, line in enumerate(read_text(file).splitlines(), 1):
            if line.strip():
                try:
                    out.append(RequestRecord.model_validate(parse_json(line)))
                except ValidationError as err:
                    raise StoreError(f"{file} line {lineno} is not a request record ({_first_error(err)}): it is "
                                     f"corrupt; {remedy(file)}") from None
                except ValueError as err:
                    raise StoreError(f"{file} line {lineno} {err}: it is half-written or corrupt; {remedy(file)}") from None
        return out

    def write_server_metrics(self, cid: str, data: ServerMetrics | dict[str, Any]) -> None:
        file = self.cell_dir(cid) / SERVER_METRICS
        atomic_write_json(file, data if isinstance(data, ServerMetrics) else _validate(ServerMetrics, data, file))

    def read_server_metrics(self, cid: str) -> ServerMetrics | None:
        file = self.cell_dir(cid) / SERVER_METRICS
        return _validate(ServerMetrics, load_json(file), file) if present(file) else None

    def write_summary(self, summary: CellSummary) -> None:
        """Written last: its existence marks the cell complete (or failed, with the reason)."""
        atomic_write_json(self.cell_dir(summary.cell_id) / SUMMARY, summary)

    def read_summary(self, cid: str) -> CellSummary | None:
        """Cell `cid`'s summary (None before it is written); a StoreError when it does not read back, or when it
        says it is another cell's (a copy of another cell's folder, or a cell_id edited into a path)."""
        summary = self._load_summary(cid)
        if summary is not None and summary.cell_id != cid:
            raise _not_its_own(self.cell_dir(cid) / SUMMARY, summary.cell_id, remedy(self.cell_dir(cid) / SUMMARY))
        return summary

    def _load_summary(self, cid: str) -> CellSummary | None:
        file = self.cell_dir(cid) / SUMMARY
        if not present(file):
            return None
        data = load_json(file)
        if needs_migration(data):
            self.migrated_from = OLDEST
            data = summary_v1(data)
        return _validate(CellSummary, data, file)

    def damage(self, cid: str) -> str | None:
        """Why a cell with a summary cannot be trusted as measured (a file that does not read back, or a
        requests.jsonl that lost records), as one sentence; None when it reads back whole."""
        try:
            summary = self.read_summary(cid)
            records = self.read_requests(cid)
            self.read_server_metrics(cid)
            if present(self.cell_dir(cid) / TELEMETRY):
                read_telemetry(self.cell_dir(cid) / TELEMETRY)
        except StoreError as err:
            return str(err)
        # a steady stream's ramp-up and tail are recorded too, outside its window's count
        counted = summary.num_requests + summary.num_warmup if summary is not None else 0
        if summary is not None and summary.steady is not None:
            counted += summary.steady.ramp_requests + summary.steady.cooldown_requests
        if summary is not None and summary.status in MEASURED and len(records) != counted:
            return (f"{self.cell_dir(cid) / REQUESTS} holds {len(records)} records where its summary counted "
                    f"{counted}: it was cut short")
        return None

    def summaries(self) -> list[CellSummary]:
        """Summaries of every cell on disk that has one, in plan order (cells not in the plan last); a StoreError
        naming the first entry of cells/ that is not a cell of this folder (`strays`)."""
        manifest = self.read_manifest()
        order = [c.cell_id for c in manifest.plan]
        found, strays = self._census(set(order), strict=True)
        if strays:
            name, why = strays[0]
            raise StoreError(f"{shown(layout.cells_folder(self.path) / name)} is not a cell of this sweep: {why}; "
                             f"{STRAY_REMEDY}")
        ids = [c for c in order if c in found] + sorted(c for c in found if c not in order)
        return [found[c] for c in ids]

    def cell_names(self) -> list[str]:
        """The names of the cells' folders under cells/ (links left out: they are `strays`)."""
        return layout.scan(self.path)[0]

    def strays(self, keep: set[str]) -> list[tuple[str, str]]:
        """(name, why) for each entry of cells/ that is not a cell of this folder: a symbolic link, a folder whose
        summary is another cell's (a copy), or a second folder of one cell that `keep` (the plan) does not name
        (the one kept: a cell of `keep`, else the one its own id names, else the first by name). A summary that does not read back is no stray here:
        `damage` says why."""
        return self._census(keep, strict=False)[1]

    def _census(self, keep: set[str], strict: bool) -> tuple[dict[str, CellSummary], list[tuple[str, str]]]:
        names, links = layout.scan(self.path)
        strays = [(name, "a symbolic link, not a cell's folder") for name in links]
        found: dict[str, CellSummary] = {}
        for name in names:
            try:
                summary = self._load_summary(name)
            except StoreError:
                if strict:
                    raise
                continue
            if summary is None:
                continue
            if summary.cell_id != name:
                if strict:  # the sentence names the summary.json that says so
                    raise _not_its_own(self.cell_dir(name) / SUMMARY, summary.cell_id, STRAY_REMEDY)
                strays.append((name, f"its summary says it is cell {shown(summary.cell_id)!r}"))
                continue
            found[name] = summary
        by_key: dict[CellKey, list[str]] = {}
        for name, summary in found.items():
            by_key.setdefault(summary.key, []).append(name)
        for key, same in by_key.items():
            if len(same) > 1:
                kept = next((n for n in same if n in keep), None) or next((n for n in same if n == key.cell_id), same[0])
                for name in same:
                    if name != kept and name not in keep:  # the plan's own cells are never copies
                        strays.append((name, f"the same cell ({key.name}) as cells/{kept}, a copy of it"))
                        del found[name]
        return found, sorted(strays)

    def set_aside(self, name: str) -> Path:
        """Move the entry `name` of cells/ (a cell's folder, or a link, which is moved, never followed) to
        damaged/<name>[-n]/, out of every reader's way, keeping what was on disk; returns where it went."""
        import shutil

        source = layout.cells_folder(self.path) / layout.check_cell_id(name)
        damaged = self.path / "damaged"
        if damaged.is_symlink():
            raise StoreError(f"{shown(damaged)} is a symbolic link: a sweep folder's files are its own; remove it")
        dest, n = damaged / name, 1
        while present(dest):
            n += 1
            dest = damaged / f"{name}-{n}"
        damaged.mkdir(exist_ok=True)
        shutil.move(str(source), str(dest))
        return dest

    def write_results_csv(self) -> Path:
        """Rebuild results.csv from the summaries on disk (one row per cell)."""
        out = self.path / RESULTS
        atomic_write_text(out, csv_text(self.summaries()))
        return out

    def migrate(self) -> bool:
        """Rewrite an older folder as this schema version (manifest, summaries, results.csv); True if it was."""
        manifest = self.read_manifest()
        summaries = self.summaries()
        if self.migrated_from is None:
            return False
        for s in summaries:
            self.write_summary(s)
        self.write_manifest(manifest)
        self.write_results_csv()
        return True


def _not_its_own(file: Path, says: str, repair: str) -> StoreError:
    return StoreError(f"{shown(file)} says it is cell {shown(says)!r}, not {shown(file.parent.name)}, the folder it is in: "
                      f"a copy of another cell's folder, or an edited file; {repair}")


def read_json_model(model: type[BaseModel], file: Path) -> Any:
    """A JSON file read back through its schema; a StoreError naming the file when it is not one."""
    return _validate(model, load_json(file), file)


def _validate(model: type[BaseModel], data: Any, file: Path) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise StoreError(f"{file} does not match the {model.__name__} schema ({_first_error(err)}): it is corrupt; "
                         f"{remedy(file)}") from None


def _first_error(err: ValidationError) -> str:
    e = err.errors()[0]
    loc = ".".join(str(x) for x in e.get("loc", ())) or "record"
    return f"{loc}: {e.get('msg', 'invalid')}"

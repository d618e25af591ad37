"""Which cells a sweep folder holds, read from its own layout, and the one way to a cell's files.

A cell is a folder `cells/<cell-id>/`: its identity is that folder's name, and the `cell_id` in its summary.json
must say the same (SweepDir checks it), so a path a file holds (`../../elsewhere`, `/abs`) never becomes a path
the harness reads or writes. Nothing of a folder is reached through a symbolic link: cells/, a cell's folder or a
cell's file that is a link could name any place on the machine, and a write through it would land there. So:

- `cell_path` is the only way from a cell id to its folder: one plain name, and neither cells/ nor the cell's folder
  a link (a StoreError naming it otherwise);
- `scan` lists what cells/ holds without following anything: the cells' folders, and the links, which are strays
  (`sweep --resume` sets them aside, every other reader refuses them in one sentence);
- `present` says whether a file is there, a link included (so that reading it names the link, rather than
  skipping a dangling one as missing).
Reading a file of the folder never follows a link either (store/reading.py `read_text`).
"""

from __future__ import annotations

import os
from pathlib import Path

from dflash_bench.store.reading import StoreError, shown

CELLS = "cells"
STRAY_REMEDY = ("remove it or move it out of cells/; `sweep --resume` sets it aside under damaged/ (and measures a cell "
                "of its plan again)")


def check_cell_id(cid: str) -> str:
    """`cid` when it is one plain folder name; a StoreError otherwise (a cell id from a file is never a path)."""
    if not cid or cid in (".", "..") or "/" in cid or "\0" in cid or cid.startswith("."):
        raise StoreError(f"{shown(cid)!r} is not a cell id (one folder name under cells/): the file that holds it is "
                         "corrupt or was edited")
    return cid


def cells_folder(root: Path) -> Path:
    """`<root>/cells`, refused when it is a symbolic link."""
    folder = Path(root) / CELLS
    if folder.is_symlink():
        raise StoreError(f"{shown(folder)} is a symbolic link: a sweep folder's cells are its own; replace it with the "
                         "folder it names")
    return folder


def cell_path(root: Path, cid: str) -> Path:
    """The folder of cell `cid` (it may not exist yet): a StoreError when `cid` is not one plain name, or when the
    folder is a symbolic link (read or written through, it would reach outside the sweep folder)."""
    folder = cells_folder(root) / check_cell_id(cid)
    if folder.is_symlink():
        raise StoreError(f"{shown(folder)} is a symbolic link, not a cell's folder: {STRAY_REMEDY}")
    return folder


def scan(root: Path) -> tuple[list[str], list[str]]:
    """What cells/ holds, nothing followed, each sorted by name: the cells' folders, and the symbolic links
    (strays). Plain files there are no cells and are left alone."""
    folder = cells_folder(root)
    try:
        with os.scandir(folder) as entries:
            found = [(e.name, e.is_symlink(), e.is_dir(follow_symlinks=False)) for e in entries]
    except FileNotFoundError:
        return [], []
    except OSError as err:
        raise StoreError(f"cannot read {shown(folder)}: {err.strerror or err}") from None
    cells = sorted(name for name, link, is_dir in found if is_dir and not link)
    links = sorted(name for name, link, _ in found if link)
    return cells, links


def present(file: Path) -> bool:
    """Whether anything is at `file`, a symbolic link included (dangling or not)."""
    return os.path.lexists(file)

"""The one rich Console the commands print through: on a terminal its width, elsewhere (a pipe, a CI log) wide
enough that no table is cut ("concurren…"): a log keeps the whole line and lets its viewer wrap it."""

from __future__ import annotations

import os
from typing import Any

from rich.console import Console

NOT_A_TERMINAL_WIDTH = 400  # wider than any table the commands print; COLUMNS, when set, still wins


def new_console(stderr: bool = False, **options: Any) -> Console:
    """A Console for stdout (stderr=True: stderr) that never cuts a table when it is not a terminal."""
    out = Console(stderr=stderr, **options)
    if not out.is_terminal and not os.environ.get("COLUMNS") and "width" not in options:
        out = Console(stderr=stderr, width=NOT_A_TERMINAL_WIDTH, **options)
    return out

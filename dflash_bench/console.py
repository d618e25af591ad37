"""The one rich Console the commands print through: on a terminal its width, elsewhere (a pipe, a CI log) wide
enough that no table is cut ("concurren…"): a log keeps the whole line and lets its viewer wrap it.

A table wider than the console (an 80-column terminal, COLUMNS=80) is fitted before it prints: each column keeps
its longest word whole (a number, a piece of a source's name) and the room left goes to the columns that want it,
so cells wrap between words; where the words do not all fit, the headers' longest words fold onto the next line
(or, where the cells' words alone do not fit, the longest words). No character of a table is ever cut ("…")."""

from __future__ import annotations

import os
from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

NOT_A_TERMINAL_WIDTH = 400  # wider than any table the commands print; COLUMNS, when set, still wins


class _FittingConsole(Console):
    def print(self, *objects: Any, **options: Any) -> None:
        for o in objects:
            if isinstance(o, Table):
                fit(o, self)
        super().print(*objects, **options)


def new_console(stderr: bool = False, **options: Any) -> Console:
    """A Console for stdout (stderr=True: stderr) that never cuts a table: wide when it is not a terminal, and
    fitting each table it prints to its width."""
    width = options.pop("width", None)
    if width is None and not os.environ.get("COLUMNS") and not Console(stderr=stderr, **options).is_terminal:
        width = NOT_A_TERMINAL_WIDTH
    return _FittingConsole(stderr=stderr, width=width, **options)


def fit(table: Table, console: Console) -> None:
    """`table`'s columns sized for `console` in place, where it is wider than the console (see the module's note)."""
    options = console.options.update_width(NOT_A_TERMINAL_WIDTH * 10)  # each cell's and the table's natural width
    heads, bodies, highs = [], [], []
    for column in table.columns:
        head = Measurement.get(console, options, column.header) if table.show_header else Measurement(0, 0)
        body = [Measurement.get(console, options, cell) for cell in column.cells]
        heads.append(head.minimum)
        bodies.append(max((m.minimum for m in body), default=0))
        highs.append(max([head.maximum, *(m.maximum for m in body)]))
        column.overflow = "fold"
    room = console.width - (Measurement.get(console, options, table).maximum - sum(highs))  # less borders, padding
    if sum(highs) <= room:
        return
    widths = [max(head, words, 1) for head, words in zip(heads, bodies)]  # every word whole
    floors = [max(words, 1) for words in bodies]
    # too wide: the headers' longest words fold where that leaves every cell's words whole, else the longest words
    _narrow(widths, room, floors if sum(floors) <= room else [1] * len(widths))
    spare = max(room - sum(widths), 0)
    wanting = sorted(range(len(widths)), key=lambda i: highs[i] - widths[i])
    for n, i in enumerate(wanting):  # the least wanting first: each takes what it needs up to an even share
        give = min(max(highs[i] - widths[i], 0), spare // (len(wanting) - n))
        widths[i] += give
        spare -= give
    for column, width in zip(table.columns, widths):
        column.width = width


def _narrow(widths: list[int], room: int, floors: list[int]) -> None:
    """The widest columns above their floor narrowed one character at a time until the widths fit `room`."""
    while sum(widths) > room:
        above = [i for i, w in enumerate(widths) if w > floors[i]]
        if not above:
            return
        widths[max(above, key=lambda i: widths[i])] -= 1

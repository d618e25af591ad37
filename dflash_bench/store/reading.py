"""Reading a folder's files: any bytes end in a StoreError that names the file, never a traceback.

`read_text` turns bytes into text and `load_json` text into JSON values the rest of the harness can hold: JSON
that parses yet holds what no writer of the harness writes (an integer past 64 bits, NaN or
Infinity, a lone surrogate escape that no UTF-8 text can hold, nesting deeper than any schema) is refused here,
naming the file, once for every reader. Each refusal says how the file is repaired: a cell's files by
`sweep --resume`, which sets the cell aside and measures it again; any other file from a copy.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from dflash_bench.errors import UserError

MAX_DIGITS = 19  # 2**63 has 19 digits: no count, size or time the harness writes needs more
MAX_DEPTH = 32  # the deepest schema nests a handful of levels


class StoreError(UserError):
    """A sweep folder that cannot be read: missing, half-written, corrupt or of another schema version."""


def remedy(file: Path) -> str:
    """How a damaged file is repaired: a cell's by `sweep --resume`, anything else from a copy."""
    parts = Path(file).parts
    if len(parts) >= 3 and parts[-3] == "cells":
        return "`sweep --resume` sets the cell aside under damaged/ and measures it again (a cell of its plan)"
    return "restore it from a copy"


def read_text(file: Path) -> str:
    """A folder file's text; a StoreError naming the file when it cannot be read or is not UTF-8 (any bytes
    in any file of a folder end in one sentence, never a traceback)."""
    try:
        data = Path(file).read_bytes()
    except OSError as err:
        raise StoreError(f"cannot read {file}: {err.strerror or err}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise StoreError(f"{file} is not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start}): it is "
                         f"corrupt; {remedy(file)}") from None


class _Hostile(ValueError):
    """JSON that parses but that no writer of the harness writes (the reason, for the StoreError)."""


def holdable(value: int | float) -> bool:
    """Whether a number read from a folder file is one numpy and pandas hold: a finite float, an int64."""
    return -(2**63) <= value < 2**63 if isinstance(value, int) else math.isfinite(value)


def _int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_DIGITS or not holdable(int(text)):  # the length first: int() of 4300 digits raises
        raise _Hostile(f"an integer of {digits} digits, past 64 bits")
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if not holdable(value):
        raise _Hostile(f"the number {text[:20]}, too large for a float")
    return value


def _constant(text: str) -> float:
    raise _Hostile(f"{text}, which is not a JSON number")


def parse_json(text: str) -> Any:
    """`text` as JSON the harness can hold; a ValueError saying what is wrong otherwise."""
    try:
        data = json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except json.JSONDecodeError as err:
        raise ValueError(f"is not valid JSON (line {err.lineno})") from None
    except RecursionError:  # brackets nested past Python's stack
        raise ValueError("is not valid JSON (nested too deep)") from None
    except _Hostile as err:
        raise ValueError(f"holds {err}") from None
    check_value(data)
    return data


def check_value(data: Any) -> None:
    """A ValueError when a decoded JSON value nests deeper than MAX_DEPTH or holds a string (or key) that is
    not Unicode text (a lone surrogate: `"\\ud800"` decodes, but nothing can write or show it)."""
    stack = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ValueError(f"nests deeper than {MAX_DEPTH} levels")
        if isinstance(value, str):
            check_text(value)
        elif isinstance(value, dict):
            for k, v in value.items():
                check_text(k)
                stack.append((v, depth + 1))
        elif isinstance(value, list):
            stack += [(v, depth + 1) for v in value]


def check_text(text: str) -> None:
    """A ValueError when `text` holds a lone surrogate (text no UTF-8 file, terminal or page can hold)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"holds a lone surrogate (\\u{ord(text[err.start]):04x}), which is not Unicode text") from None


def load_json(file: Path) -> Any:
    """A folder file's JSON; a StoreError naming the file and its repair when it is not JSON the harness wrote."""
    text = read_text(file)
    try:
        return parse_json(text)
    except ValueError as err:
        raise StoreError(f"{file} {err}: it is half-written or corrupt; {remedy(file)}") from None

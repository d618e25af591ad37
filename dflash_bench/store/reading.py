"""Reading a folder's files: any bytes end in a StoreError that names the file, never a traceback.

`read_text` turns bytes into text and `load_json` text into JSON values the rest of the harness can hold: JSON
that parses yet holds what no writer of the harness writes (an integer past 64 bits, NaN or
Infinity, a lone surrogate escape that no UTF-8 text can hold, nesting deeper than any schema) is refused here,
naming the file, once for every reader. Each refusal says how the file is repaired: a cell's files by
`sweep --resume`, which sets the cell aside and measures it again; any other file from a copy. A folder's file is
never read through a symbolic link, nor anything but a regular file (a named pipe would never end).
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
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


def shown(value: str | os.PathLike[str]) -> str:
    """A path or name as a sentence can print it: bytes that are not UTF-8 (a file name can hold any) as escapes."""
    text = os.fspath(value)
    try:
        return os.fsencode(text).decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def read_bytes(file: Path, *, follow_links: bool = False) -> bytes:
    """A file's bytes; a StoreError naming the file when it cannot be read. A folder's file is read only when it is
    a regular file of its own: not a symbolic link (it could name any file on the machine; `follow_links` is for a
    file the user named, such as a baseline), not a named pipe or a device (which would block or never end)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(file, flags)
    except OSError as err:
        if err.errno == errno.ELOOP and not follow_links:
            raise StoreError(f"{shown(file)} is a symbolic link: a sweep folder's files are its own, never links to "
                             f"elsewhere; {remedy(file)}") from None
        raise StoreError(f"cannot read {shown(file)}: {err.strerror or err}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise StoreError(f"{shown(file)} is not a regular file; {remedy(file)}")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read()
    except OSError as err:
        raise StoreError(f"cannot read {shown(file)}: {err.strerror or err}") from None
    finally:
        os.close(fd)


def read_text(file: Path, *, follow_links: bool = False) -> str:
    """A folder file's text (read_bytes); a StoreError naming the file when it cannot be read or is not UTF-8
    (any bytes in any file of a folder end in one sentence, never a traceback)."""
    data = read_bytes(file, follow_links=follow_links)
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

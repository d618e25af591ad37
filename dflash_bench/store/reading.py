"""Reading a folder's files as text: any bytes end in a StoreError that names the file, never a traceback."""

from __future__ import annotations

from pathlib import Path

from dflash_bench.errors import UserError


class StoreError(UserError):
    """A sweep folder that cannot be read: missing, half-written, corrupt or of another schema version."""


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
                         "corrupt; restore it from a copy (`sweep --resume` measures a damaged cell again)") from None

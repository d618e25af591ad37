"""One writer per sweep folder: an exclusive lock that a sweep, its resume or `run --name` holds while it
writes, so that a second writer (two sweeps that land on one folder, two resumes) is refused in one sentence.

flock on `<folder>/.lock`, opened with O_CREAT: creating and locking the file are atomic, and the kernel
drops the lock when its process dies (kill -9 included), so a stale lock never needs cleaning up. The
file's text is the holder's pid, for the refusal's sentence. A writer that finishes removes the file (while
still holding its lock), so a finished folder holds no `.lock` naming a dead pid; a writer that locked a file
another had just removed (it opened the path before the removal) sees that the path no longer names what it
locked and locks the path again. Kept apart from store/folder.py (the folder's
schema and atomic writes) because only writers need it.
"""

from __future__ import annotations

import errno
import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from dflash_bench.store.folder import MANIFEST, DiskFull, StoreError, SweepDir, write_error
from dflash_bench.store.manifest import Manifest

LOCK = ".lock"


class WriterLock:
    """The exclusive writer's lock of one sweep folder. `acquire` raises StoreError when another holds it."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self._fd: int | None = None

    def acquire(self) -> "WriterLock":
        if self._fd is not None:
            return self
        path = self.folder / LOCK
        while True:
            try:  # never through a link: the pid would be written into whatever file it names
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            except OSError as err:
                if err.errno == errno.ELOOP:
                    raise StoreError(f"{path} is a symbolic link: a sweep folder's lock is a file of its own; remove "
                                     "it") from None
                raise
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "?"
                os.close(fd)
                raise StoreError(f"{self.folder} is being written by another dflash-bench (pid {holder}); wait for "
                                 "it to finish, or stop it, and run this command again") from None
            if _same_file(fd, path):
                break
            os.close(fd)  # a finished writer removed the file this one locked: lock the path's file now
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        except OSError:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def release(self) -> None:
        """Remove the lock file, then unlock: a finished writer leaves no `.lock` behind."""
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                if _same_file(fd, self.folder / LOCK):
                    os.unlink(self.folder / LOCK)
            except OSError:
                pass  # a folder gone or read-only: the lock is released all the same
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> "WriterLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _same_file(fd: int, path: Path) -> bool:
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (on_disk.st_dev, on_disk.st_ino) == (held.st_dev, held.st_ino)


def create_locked(path: Path, manifest: Manifest) -> tuple[SweepDir, WriterLock]:
    """A new sweep folder, locked before its manifest is written: of several processes that create the same
    folder at once, one gets it and the others a StoreError. A folder that cannot be made whole (a full disk)
    is a StoreError naming it, and the folders made here are removed again: nothing half-made is left."""
    path = Path(path)
    made = [p for p in (path, *path.parents) if not p.exists()]  # innermost first
    try:
        path.mkdir(parents=True, exist_ok=True)
        lock = WriterLock(path).acquire()
    except OSError as err:
        _remove(made)
        error = write_error(path / LOCK, err)
        raise _not_made(path) if isinstance(error, DiskFull) else error from None
    try:
        if (path / MANIFEST).exists():
            raise StoreError(f"{path} already holds a sweep; pass --resume {path} or choose another --out")
        return SweepDir.create(path, manifest), lock
    except BaseException as err:
        lock.release()
        if (path / MANIFEST).exists():
            raise
        _remove(made)
        if isinstance(err, DiskFull):
            raise _not_made(path) from None
        raise


def _not_made(path: Path) -> StoreError:
    disk = next((p for p in path.parents if p.exists()), path.parent)
    return StoreError(f"cannot make the sweep folder {path}: the disk holding {disk} is full; free space there and "
                      "run the command again (nothing was left on it)")


def _remove(made: list[Path]) -> None:
    """The folders a failed creation made (innermost first); an outer one only while nothing else is in it."""
    import shutil

    if made:
        shutil.rmtree(made[0], ignore_errors=True)
    for folder in made[1:]:
        try:
            folder.rmdir()
        except OSError:
            return


def open_locked(path: Path) -> tuple[SweepDir, WriterLock]:
    """An existing sweep folder, locked; the temporary files a killed writer left mid-write are removed."""
    sweep = SweepDir.open(path)
    lock = WriterLock(sweep.path).acquire()
    for folder, _, files in os.walk(sweep.path):  # links not followed: only this folder's own files
        for name in files:  # no other writer is alive: each is what a kill -9 cut short
            stale = Path(folder) / name
            if name.startswith(".") and name.endswith(".tmp") and stale.is_file() and not stale.is_symlink():
                stale.unlink(missing_ok=True)
    return sweep, lock


@contextmanager
def writing(path: Path) -> Iterator[SweepDir]:
    """An existing sweep folder opened for a command that writes into it (quality, migrate), under its lock for as
    long as the block runs: refused in one sentence while another writer holds it."""
    sweep, lock = open_locked(path)
    try:
        yield sweep
    finally:
        lock.release()

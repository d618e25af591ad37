"""A server over a sweep: started, and after a death relaunched once (launch/common.py's watchdog thread
notices the death; this decides what follows it). The caller records each launch and fails the cell the
server died under before asking for the relaunch; a second death finds no relaunch left.

    slot = Relaunching(lambda: launch_server(...), relaunches=1)
    server = slot.start()          # the first launch
    server = slot.relaunch()       # after a death: the dead one torn down, a new one up; None when none is left
    slot.close()                   # whatever runs is torn down
"""

from __future__ import annotations

import contextlib
from typing import Callable, ContextManager, Generic, TypeVar

T = TypeVar("T")

RELAUNCHES = 1  # a server that dies mid-sweep is relaunched once; the second death fails the rest


class Relaunching(Generic[T]):
    def __init__(self, start: Callable[[], ContextManager[T]], relaunches: int = RELAUNCHES) -> None:
        self._start = start
        self.left = relaunches
        self.launches = 0
        self._stack = contextlib.ExitStack()

    def start(self) -> T:
        """Tear down what runs (a dead server's leftovers), then launch; the launch's UserError propagates."""
        self.close()
        self._stack = contextlib.ExitStack()
        server = self._stack.enter_context(self._start())
        self.launches += 1
        return server

    def relaunch(self) -> T | None:
        """A new server after a death, while a relaunch is left (None after that)."""
        if self.left <= 0:
            return None
        self.left -= 1
        return self.start()

    def close(self) -> None:
        self._stack.close()

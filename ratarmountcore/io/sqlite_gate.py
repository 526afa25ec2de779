"""No fork while a thread is inside SQLite.

SQLite guards its memory allocator, page cache and file list with process-wide mutexes. A fork
while another thread of the parent holds one of them leaves it locked for good in the child,
where that thread does not exist: the child's first ``sqlite3.connect`` (a forked DataLoader
worker making its own index connections) waited forever. Found by fuzzing: 1-2 forks in 300
hung while two threads of the parent queried the index.

Every use of SQLite by a source (``ConnectionPool``'s queries, connections opened and closed, a
union's table in memory) passes this gate; a fork waits at it until no thread is inside, and
keeps others out until it is done (``os.register_at_fork``). Passing costs a lock taken twice
(~1 us against ~10-20 us a query). A fork waits at most ``FORK_WAIT`` seconds for a query (a
very large listing) and then goes ahead, as before.
"""

from __future__ import annotations

import logging
import os
import threading
from types import TracebackType
from typing import Optional, Type

logger = logging.getLogger(__name__)

#: The longest a fork waits for the threads inside SQLite to leave.
FORK_WAIT = 10.0


class SqliteGate:
    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._inside = 0
        self._forking = False

    def __enter__(self) -> "SqliteGate":
        with self._cond:
            while self._forking:
                self._cond.wait()
            self._inside += 1
        return self

    def __exit__(
        self, _kind: Optional[Type[BaseException]], _exc: Optional[BaseException], _tb: Optional[TracebackType]
    ) -> None:
        with self._cond:
            self._inside -= 1
            if not self._inside:
                self._cond.notify_all()

    def before_fork(self) -> None:
        """Wait until no thread is inside, then hold the gate (its lock) through the fork."""
        self._cond.acquire()
        self._forking = True
        if self._inside and not self._cond.wait_for(lambda: not self._inside, FORK_WAIT):
            logger.debug("forking while %d thread(s) are still inside SQLite", self._inside)

    def after_fork_in_parent(self) -> None:
        self._forking = False
        self._cond.notify_all()
        self._cond.release()


gate = SqliteGate()


def _before_fork() -> None:
    gate.before_fork()


def _after_fork_in_parent() -> None:
    gate.after_fork_in_parent()


def _after_fork_in_child() -> None:
    global gate
    gate = SqliteGate()  # (the parent's is held by the forking thread, waited on by others)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)

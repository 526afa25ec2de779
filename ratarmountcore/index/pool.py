"""A pool of read-only SQLite connections shared by all threads.

libfuse starts and retires worker threads as load changes, and opening an SQLite connection costs
about a millisecond, so connections are not tied to threads: a query borrows an idle connection
(or opens one when all are busy) and gives it back. The pool never holds more connections than
there were concurrent queries.

Connections are opened by path, so one opened later would read whatever file is at the path by
then: after another node rebuilt the index and renamed it into place (for an archive that was
replaced by a new version, while this mount keeps the old one open), a new connection would
answer with the new archive's offsets. So every connection checks that the file it opened is the
one the first connection opened (device and inode); when it is not, or when the file is gone, it
is closed, a warning says so once, and queries go on through the connections opened before,
waiting for an idle one.

A connection held ~150-250 KiB, most of it SQLite's page cache (16 KiB pages, up to 1 MiB per
connection): a union of 1,100 archives held 241 MiB after a ``find``, the PyPI release 211 MiB.
So the page cache is a budget of the process, ``PAGE_CACHE_BUDGET`` split among the pools alive
when a connection opens, and at most what the index needs (``PAGE_CACHE_FRACTION``: one archive
of 100,000 members gets 256 KiB per connection; a share below what SQLite keeps anyway is none:
a union of 1,000 archives reads its index pages from the kernel's page cache). As a backstop,
when more than ``MAX_IDLE`` connections are open in the process, opening another closes idle
ones of the least recently used pools, which open new ones (~0.3 ms: the schema is parsed again)
when they need them again. That is decided when a connection opens, so
a query pays only for a counter. Closing instead of shrinking was measured: with at most 64
connections for a union of 1,100 archives, 1,000 reads across 1,000 of them took 0.46 s instead
of 0.13 s.
"""

from __future__ import annotations

import itertools
import logging
import os
import sqlite3
import threading
import weakref
from typing import Any, List, NoReturn, Optional, Tuple

from ..errors import ClosedSourceError, CorruptIndexError, TooManyOpenFilesError
from ..io import forks, sqlite_gate
from ..io.descriptors import check_left, scarce
from .warm import IndexWarmer

logger = logging.getLogger(__name__)

#: Bytes a file URI carries as they are (RFC 3986's unreserved characters, and the slash).
_URI_PLAIN = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~/")


def percent_encoded(path: str) -> str:
    """``path`` for a file URI: what ``urllib.parse.quote(path, safe="/")`` makes of it, but of
    the file system's bytes (names that are not UTF-8 work too), and without importing urllib
    (and ipaddress with it) into every mount process."""
    return "".join(chr(byte) if byte in _URI_PLAIN else f"%{byte:02X}" for byte in os.fsencode(path))


def read_only_uri(path: str) -> str:
    """URI that opens ``path`` read-only and immutable: no locks, no journal, no writes."""
    return "file:" + percent_encoded(os.path.abspath(path)) + "?mode=ro&immutable=1"


#: Connections open across all pools of the process beyond which idle ones are closed (a
#: backstop for unions of thousands of archives; each then holds ~30 KiB).
MAX_IDLE = 4096
#: Descriptors kept free as archives and connections are opened (``RESERVE`` and a
#: ``RESERVE_SHARE``-th of the limit): fewer left, and half the connections open are closed
#: where idle, the least recently used pools' first. Each archive of a union or folder holds a
#: descriptor of its own; with an idle connection kept for each as well, a union of 150 tars
#: under a limit of 256 failed at the 124th.
RESERVE = 64
RESERVE_SHARE = 16
#: SQLite page cache of all connections together, split among the live pools, at most
#: ``PAGE_CACHE_MAX`` each; a share below ``PAGE_CACHE_FLOOR`` (SQLite keeps at least 10 pages
#: once it caches any: 160 KiB of 16 KiB pages) is none at all: such a connection reads its
#: pages from the kernel's page cache every time (a few microseconds per lookup).
PAGE_CACHE_BUDGET = 16 << 20
PAGE_CACHE_MAX = 1 << 20
PAGE_CACHE_FLOOR = 160 << 10
#: A connection caches at most 1/``PAGE_CACHE_FRACTION`` of its index (at least the floor): the
#: pages every lookup passes (the B-trees' interior pages, ~1/400 of them) with room to spare;
#: the leaves of random lookups are rarely hit again anyway. The 16 MiB index of 100,000 members
#: gets 256 KiB instead of 1 MiB (peak RSS of a mount after find, stat and 1,000 random reads
#: 23.2-23.5 -> 22.4-22.5 MiB, the reads as fast: 0.28-0.32 s either way, interleaved); indexes
#: of 64 MiB and more get the full 1 MiB.
PAGE_CACHE_FRACTION = 64
#: Prepared statements Python's sqlite3 keeps per connection (a pool uses about ten).
CACHED_STATEMENTS = 24

#: Ticks of queries: a pool's last one tells how recently it was used (``next`` is atomic).
_TICKS = itertools.count()


class _IdleConnections:
    """The number of connections open in the process; beyond ``MAX_IDLE``, or with few
    descriptors left, opening one closes idle connections of the least recently used pools.
    Its lock is never held together with a pool's lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    def opened(self, pool: "ConnectionPool") -> None:
        with self._lock:
            self._count += 1
            count = self._count
        excess = count - MAX_IDLE
        if excess <= 0 and _few_descriptors_left():
            excess = count // 2
        self._close(excess, pool)

    def make_room(self) -> None:
        if _few_descriptors_left():
            self._close(self._count // 2, None)

    def _close(self, excess: int, keep: Optional["ConnectionPool"]) -> None:
        """Close up to ``excess`` idle connections, least recently used pools first (not ``keep``'s)."""
        if excess <= 0:
            return
        for other in sorted(list(_LIVE), key=lambda p: p._last_used):
            if other is not keep:
                excess -= other._close_idle(excess)
                if excess <= 0:
                    return

    def closed(self, count: int) -> None:
        with self._lock:
            self._count -= count


_IDLE = _IdleConnections()
_LIVE: "weakref.WeakSet[ConnectionPool]" = weakref.WeakSet()


def _few_descriptors_left() -> bool:
    return scarce(RESERVE, RESERVE_SHARE)


def make_room() -> None:
    """Close idle connections when the process is about to run out of descriptors (called
    before an archive is opened, and by every new connection)."""
    _IDLE.make_room()


def cache_size_pragma(index_size: int) -> str:
    """The page cache a new connection to an index of ``index_size`` bytes gets: its share of
    the budget, at most what that index needs."""
    need = max(PAGE_CACHE_FLOOR, index_size // PAGE_CACHE_FRACTION)
    share = min(PAGE_CACHE_MAX, need, PAGE_CACHE_BUDGET // max(1, len(_LIVE)))
    return f"PRAGMA cache_size=-{share // 1024}" if share >= PAGE_CACHE_FLOOR else "PRAGMA cache_size=0"


def _new_registry_in_child() -> None:
    global _IDLE, _LIVE
    _IDLE = _IdleConnections()  # the parent's pools are parked in a child (io/forks.py)
    _LIVE = weakref.WeakSet()


forks.in_child(_new_registry_in_child)


class ConnectionPool:
    def __init__(self, path: str, identity: Optional[Tuple[int, int]] = None) -> None:
        """``identity``: the (device, inode) the file must have (a pool made anew in a forked
        child reads the file its parent's pool read, or nothing)."""
        self.path = path
        self._idle: List[sqlite3.Connection] = []
        self._all: List[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._returned = threading.Condition(self._lock)
        #: (device, inode) of the file the first connection opened.
        self._identity: Optional[Tuple[int, int]] = identity
        #: Set once the file at ``path`` is no longer the one first opened: no new connections.
        self._replaced = False
        #: Reads the file into the page cache when lookups would find it missing there (warm.py).
        self._warmer: Optional[IndexWarmer] = None
        #: ``_TICKS`` at the last query (see ``_IdleConnections``).
        self._last_used = 0
        #: Set by ``close``: connections in use then are closed when their query ends.
        self._closed = False
        #: Whether damage was logged (once per pool).
        self._reported = False
        _LIVE.add(self)

    def _connect(self) -> Optional[sqlite3.Connection]:
        """A new connection to the file first opened, or None when the path names another now."""
        try:
            conn = sqlite3.connect(
                read_only_uri(self.path), uri=True, check_same_thread=False, isolation_level=None,
                cached_statements=CACHED_STATEMENTS,
            )  # fmt: skip
        except sqlite3.Error:
            if self._identity is None:
                raise
            self._gone("cannot be opened again")
            return None
        try:
            conn.execute("PRAGMA query_only=1")
            conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()  # the file is open now
            st = os.stat(self.path)
            conn.execute(cache_size_pragma(st.st_size))
        except (sqlite3.Error, OSError):
            conn.close()
            if self._identity is None:
                raise
            self._gone("cannot be read again")
            return None
        identity = (st.st_dev, st.st_ino)
        with self._lock:
            if self._closed:
                conn.close()
                raise ClosedSourceError(f"I/O operation on a closed source (its index {self.path} was closed)")
            if self._identity is None:
                self._identity = identity
            elif identity != self._identity:
                conn.close()
                self._gone_locked("was replaced by another file")
                return None
            if self._warmer is None:
                self._warmer = IndexWarmer(self.path, identity, st.st_size)
            self._all.append(conn)
        _IDLE.opened(self)
        return conn

    def _gone(self, why: str) -> None:
        """(A new connection failed.) Out of descriptors, the file is fine: say that instead."""
        check_left(self.path)
        with self._lock:
            self._gone_locked(why)

    def _gone_locked(self, why: str) -> None:
        if not self._replaced:
            self._replaced = True
            logger.warning(
                "%s %s while in use; reads go on through the %d connection(s) opened before (mount again to use it)",
                self.path, why, len(self._all),
            )  # fmt: skip

    def _borrow(self) -> sqlite3.Connection:
        with self._lock:
            if self._closed:
                raise ClosedSourceError(f"I/O operation on a closed source (its index {self.path} was closed)")
            if self._idle:
                return self._idle.pop()
            replaced = self._replaced and bool(self._all)
        if not replaced:
            try:
                conn = self._connect()
            except TooManyOpenFilesError:
                # The process is out of descriptors for now: wait for a connection of this pool
                # (a query in flight gives one back), when it has one. (Until session 41 the
                # pool took this for its file gone, said so, and never opened another.)
                with self._lock:
                    if not self._all:
                        raise
                conn = None
            if conn is not None:
                return conn
        with self._lock:
            while not self._idle:
                if self._closed or not self._all:  # (closed meanwhile)
                    raise sqlite3.OperationalError(f"{self.path}: no connection to the index is left")
                self._returned.wait()
            return self._idle.pop()

    def query(self, sql: str, params: tuple = (), one: bool = False) -> Any:
        warmer = self._warmer
        if warmer is not None:
            warmer.poke()
        self._last_used = next(_TICKS)
        with sqlite_gate.gate:  # (no fork while inside SQLite: see io/sqlite_gate.py)
            conn = self._borrow()
            try:
                cursor = conn.execute(sql, params)
                return cursor.fetchone() if one else cursor.fetchall()
            except sqlite3.DatabaseError as exc:
                if type(exc) is not sqlite3.DatabaseError:  # (only damage: not a busy or closed file)
                    raise
                self._damaged(exc)
            finally:
                with self._lock:
                    left = self._closed  # (closed meanwhile: this one was left open for this query)
                    if left:
                        self._all.remove(conn)
                        self._returned.notify_all()
                    elif conn in self._all:
                        self._idle.append(conn)
                        self._returned.notify()
                if left:
                    conn.close()
                    _IDLE.closed(1)

    def _damaged(self, exc: sqlite3.DatabaseError) -> NoReturn:
        message = f"{self.path}: the index is damaged ({exc}); mount with --recreate-index to build it again"
        if not self._reported:
            self._reported = True
            logger.error("%s", message)
        raise CorruptIndexError(message) from None

    def _close_idle(self, most: int) -> int:
        """Close up to ``most`` idle connections (the process has too many open); how many. A
        pool whose file was replaced keeps what it has: it cannot open another."""
        with self._lock:
            if self._replaced:
                return 0
            closing = self._idle[:most]
            del self._idle[: len(closing)]
            for conn in closing:
                self._all.remove(conn)
        with sqlite_gate.gate:
            for conn in closing:
                conn.close()
        _IDLE.closed(len(closing))
        return len(closing)

    @property
    def identity(self) -> Optional[Tuple[int, int]]:
        """(device, inode) of the file this pool reads; None before the first connection."""
        return self._identity

    @property
    def connection_count(self) -> int:
        return len(self._all)

    def close(self) -> None:
        if self._warmer is not None:
            self._warmer.close()
        with sqlite_gate.gate, self._lock:
            # Only the idle ones: a connection closed under another thread's query crashed the
            # process in libsqlite3; those in use are closed when their query ends.
            self._closed = True
            connections = list(self._idle)
            for conn in connections:
                conn.close()
                self._all.remove(conn)
            self._idle.clear()
            self._returned.notify_all()
        _IDLE.closed(len(connections))
        _LIVE.discard(self)

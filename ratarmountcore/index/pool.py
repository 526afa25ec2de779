"""A pool of read-only SQLite connections shared by all threads.

libfuse starts and retires worker threads as load changes, and opening an SQLite connection costs
about a millisecond, so connections are not tied to threads: a query borrows an idle connection
(or opens one when all are busy) and gives it back. The pool never holds more connections than
there were concurrent queries.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from typing import Any, List

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


class ConnectionPool:
    def __init__(self, path: str) -> None:
        self.path = path
        self._idle: List[sqlite3.Connection] = []
        self._all: List[sqlite3.Connection] = []
        self._lock = threading.Lock()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(read_only_uri(self.path), uri=True, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA cache_size=-1000")
        conn.execute("PRAGMA query_only=1")
        with self._lock:
            self._all.append(conn)
        return conn

    def query(self, sql: str, params: tuple = (), one: bool = False) -> Any:
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = self._connect()
        try:
            cursor = conn.execute(sql, params)
            return cursor.fetchone() if one else cursor.fetchall()
        finally:
            with self._lock:
                self._idle.append(conn)

    @property
    def connection_count(self) -> int:
        return len(self._all)

    def close(self) -> None:
        with self._lock:
            for conn in self._all:
                conn.close()
            self._all.clear()
            self._idle.clear()

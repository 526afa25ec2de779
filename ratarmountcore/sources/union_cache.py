"""The folder of cached union tables: one table per set of sources, and removing the ones that
nothing can use any more.

A union table is named by a digest of its sources' identities (each source's index path, size and
mtime), so it is found again by the next mount of the same sources and never served for changed
ones. The flip side: whenever a source is re-indexed (a shard appended to, a dataset refreshed)
the next mount writes a new table and the old one stays, and a home folder on an HPC system has
a small quota (a table of 1,000,000 entries is ~150 MB). So each table records the identities it
was built from (``metadata``), its modification time is refreshed whenever a mount opens it, and
building a table sweeps the folder:

* a table whose recorded sources no longer match (an index gone, re-written or of another size;
  or a table without the record, written by an older version) is removed once it has not been
  opened for ``STALE_AFTER_S``: a mount opened in the last day keeps its table, and is the
  only reader that could still be using it;
* a table not opened for ``UNUSED_AFTER_S`` is removed whatever it holds (rebuilding it takes
  seconds: the sources' indexes hold everything it is made of);
* a build that was interrupted (``union-*.sqlite.tmp-*``) is removed after ``STALE_AFTER_S``.

Indexes of single archives are never removed here: they cost a full pass over the archive to
rebuild, and an archive that looks gone may only be on a file system that is not mounted.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sqlite3
import time
import uuid
from typing import List, Optional, Sequence

from ..digest import sha256
from ..index.pool import read_only_uri
from ..options import IndexOptions
from .base import MountSource

logger = logging.getLogger(__name__)

PREFIX = "union-"
SUFFIX = ".sqlite"
#: Names of tables and of interrupted builds (the cache folder holds archives' indexes too, which
#: may be named "union-..." after their archive as well).
_TABLE = re.compile(re.escape(PREFIX) + "[0-9a-f]{24}" + re.escape(SUFFIX))
_BUILD = re.compile(_TABLE.pattern + r"\.tmp-[0-9a-f]{12}")
#: How the identity of a source with an index begins (``index:PATH:SIZE:MTIME_NS``).
_INDEX = "index:"
#: A stale table (or an interrupted build) is removed once it was not opened for this long.
STALE_AFTER_S = 24 * 3600
#: Any table is removed once it was not opened for this long.
UNUSED_AFTER_S = 90 * 24 * 3600


def folder_for(options: IndexOptions) -> str:
    """The folder of union tables: the first index folder that is not "beside the archive" (so
    ``--index-folders /scratch/idx`` keeps tables out of a small home folder too), else the
    default's (``~/.cache/ratarmount``)."""
    named = [f for f in options.index_folders if f] or [f for f in IndexOptions().index_folders if f]
    return os.path.expanduser(named[0])


def identity(source: MountSource) -> str:
    """A string that changes whenever the source's content may have changed: its index's path,
    size and mtime (``index:PATH:SIZE:MTIME_NS``), or the object's (a table of sources without
    an index is kept in memory only)."""
    index_path = getattr(source, "index_path", None)
    return _index_identity(index_path) if index_path else f"object:{id(source)}"


def _index_identity(index_path: str) -> str:
    st = os.stat(index_path)
    return f"{_INDEX}{os.path.abspath(index_path)}:{st.st_size}:{st.st_mtime_ns}"


def is_persistent(source_identity: str) -> bool:
    """Whether a table of sources with this identity may be cached on disk."""
    return source_identity.startswith(_INDEX)


def _matches(source_identity: str) -> bool:
    """Whether a recorded source identity still holds (its index unchanged)."""
    if not is_persistent(source_identity):
        return False
    path = source_identity[len(_INDEX) :].rsplit(":", 2)[0]
    try:
        return _index_identity(path) == source_identity
    except OSError:
        return False


def table_path(folder: str, table_format: str, identities: Sequence[str]) -> str:
    """The cached table for sources with these identities."""
    digest = sha256(os.fsencode("\n".join([table_format, *identities]))).hexdigest()[:24]  # any file name
    return os.path.join(folder, f"{PREFIX}{digest}{SUFFIX}")


def build_path(table: str) -> str:
    """Where the table ``table`` is written before it is renamed into place (one per build)."""
    return f"{table}.tmp-{uuid.uuid4().hex[:12]}"


def record(conn: sqlite3.Connection, table_format: str, identities: Sequence[str]) -> None:
    """Write into the table being built what it was built from (read by ``sweep``)."""
    conn.execute("CREATE TABLE metadata (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.executemany(
        "INSERT INTO metadata VALUES (?, ?)",
        [("format", table_format), ("sources", json.dumps(list(identities)))],
    )


def mark_used(path: str) -> None:
    """A mount opened the table: it is in use (a hint; a table in a folder we may not write is
    left as it is)."""
    try:
        os.utime(path)
    except OSError as exc:
        logger.debug("Cannot mark %s as used: %s", path, exc)


def _is_stale(path: str, table_format: str) -> bool:
    try:
        conn = sqlite3.connect(read_only_uri(path), uri=True)
        try:
            rows = dict(conn.execute("SELECT key, value FROM metadata").fetchall())
        finally:
            conn.close()
        return rows.get("format") != table_format or not all(_matches(i) for i in json.loads(rows["sources"]))
    except (sqlite3.Error, KeyError, ValueError, TypeError, AttributeError):
        return True  # no (readable) record of its sources: an older version's, or not a table


def sweep(folder: str, keep: str, table_format: str, now: Optional[float] = None) -> List[str]:
    """Remove the tables of ``folder`` (other than ``keep``) that nothing can use any more; the
    names removed."""
    now = time.time() if now is None else now
    removed: List[str] = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return removed
    for name in names:
        table = _TABLE.fullmatch(name) is not None
        if not table and _BUILD.fullmatch(name) is None:
            continue
        path = os.path.join(folder, name)
        if path == keep:
            continue
        try:
            idle = now - os.stat(path).st_mtime
        except OSError:
            continue
        if table:
            remove = idle > UNUSED_AFTER_S or (idle > STALE_AFTER_S and _is_stale(path, table_format))
        else:
            remove = idle > STALE_AFTER_S
        if remove:
            try:
                os.unlink(path)
                removed.append(name)
            except OSError as exc:
                logger.debug("Cannot remove the unused union table %s: %s", path, exc)
    if removed:
        logger.info("Removed %d union table(s) from %s that no mount can use any more", len(removed), folder)
    return removed

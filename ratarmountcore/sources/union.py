"""Several sources at one mount point; later sources win on conflicts, folders merge.

A lookup must not ask every source in turn (200 archives mounted together would make each
``stat`` 200 queries). A union-wide SQLite table maps every (parent, name) to the last source
that has it, so a lookup is one indexed query plus one query in the winning source. The table is
built once from the sources' own indexes and cached on disk, keyed by the sources' identities, so
a second union mount opens it directly.

Sources that may change while mounted (folders) are not in the table: they are asked at every
lookup and listing, and win over the table's source where they come later. A snapshot of them
made at mount time answered listings with the folder as it was then, while lookups found files
added since (``_merged_rows``).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import threading
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Set, Tuple

from ..index.paths import join_path
from ..index.pool import ConnectionPool, read_only_uri
from ..index.sqlite_index import (
    _INT64_MAX,
    _INT64_MIN,
    BLOCKS_SQL,
    IMPLICIT,
    encode,
    encode_big_int,
    plain_rows,
    split_path,
)
from ..io import forks, sqlite_gate
from ..io.host_paths import missing_folders, remove_empty
from ..io.readers import MemberFile
from ..options import IndexOptions
from . import union_cache
from .base import VERSIONS_SUFFIX, FileInfo, MountSource, NameRow, StatRow
from .union_replay import FILE, FOLDER, IMPLIED, ROOT, Claim, Settled, settle

logger = logging.getLogger(__name__)

#: The file type bits of a mode.
_S_IFMT = 0o170000
#: A path component naming an entry's versions (``PATH.versions/``).
_VERSIONS_PART = VERSIONS_SUFFIX.decode() + "/"
UNION_FORMAT = "14"  # 5: a folder replaced by a file takes its entries with it; 6: ``implied``;
# 7: nothing below an earlier source's file that a later source only implies as a folder;
# 8: ``barriers``; 9: ``kinds`` (instead of barriers); 10: folders' link counts of the union;
# 11: a file over a folder that holds something is refused, as by tar -x; 12: files' link counts
# leave out the names of a hard link that a later source replaced; 13: ``blocks``; 14: ``file_sources``
#: A folder's rows from the union table (``StatRow`` fields) after a name, in name order.
_STAT_ROWS_SQL = (
    "SELECT name, mode, size, mtime_ns, uid, gid, nlink, ino, rdev, blocks FROM entries "
    "WHERE parent = ? AND name > ? ORDER BY name LIMIT ?"
)
#: ``_STAT_ROWS_SQL`` with name, mode and inode number only (listings without attributes).
_NAME_ROWS_SQL = "SELECT name, mode, ino FROM entries WHERE parent = ? AND name > ? ORDER BY name LIMIT ?"
#: ``_STAT_ROWS_SQL`` with each row's source (merged with the sources that may change).
_SOURCE_ROWS_SQL = (
    "SELECT name, mode, size, mtime_ns, uid, gid, nlink, ino, rdev, blocks, source, implied FROM entries "
    "WHERE parent = ? AND name > ? ORDER BY name LIMIT ?"
)
#: The link counts of a folder's folders in the union table.
_FOLDER_LINKS_SQL = f"SELECT name, nlink FROM entries WHERE parent = ? AND mode & {_S_IFMT} = {stat.S_IFDIR}"
#: The link counts of a folder's files in the union table (``_count_file_links``).
_FILE_LINKS_SQL = f"SELECT name, nlink FROM entries WHERE parent = ? AND mode & {_S_IFMT} != {stat.S_IFDIR}"
#: The archives' claims on a name (``union_replay``; unions with folder sources only).
_KINDS_SQL = "SELECT source, kind FROM kinds WHERE parent = ? AND name = ?"
#: The table's winner of a name no archive has as a folder.
_WINNER_SQL = "SELECT source, mode, implied FROM entries WHERE parent = ? AND name = ?"
#: The archives' claims on the names of a folder after a name (up to a name; NULL: all).
_CHILD_KINDS_SQL = "SELECT name, source, kind FROM kinds WHERE parent = ?1 AND name > ?2 AND (?3 IS NULL OR name <= ?3)"
#: An entry's inode number in the union: its source's number above its own (below 2**40).
INO_SHIFT = 40
_INNER_MASK = (1 << INO_SHIFT) - 1


def _kind(mode: int, implied: int) -> int:
    """The claim (``union_replay``) of a table row."""
    if mode & _S_IFMT != stat.S_IFDIR:
        return FILE
    return IMPLIED if implied else FOLDER


class UnionLocator(NamedTuple):
    source: int
    info: FileInfo


def _refused(
    conn: sqlite3.Connection, folders: Sequence[Tuple[bytes, bytes]]
) -> Tuple[List[Tuple[bytes, bytes]], List[Tuple[object, ...]]]:
    """``folders`` (parent, name) that a later archive has as a file, link or device, split: those
    it replaces, and the rows of those it cannot. ``tar -x`` cannot remove a folder that holds
    something ("File exists") and leaves it, with what is in it, where it replaces an empty one:
    the rows are put back over the later archive's entries, nothing below them is dropped."""
    replaced: List[Tuple[bytes, bytes]] = []
    kept: List[Tuple[object, ...]] = []
    for parent, name in folders:
        if not conn.execute("SELECT 1 FROM entries WHERE parent = ? LIMIT 1", (join_path(parent, name),)).fetchone():
            replaced.append((parent, name))
        else:
            kept.extend(
                conn.execute(
                    "SELECT parent, name, source, mode, size, mtime_ns, uid, gid, nlink, ino, rdev, blocks, implied "
                    "FROM entries WHERE parent = ? AND name = ?",
                    (parent, name),
                )
            )
    return replaced, kept


def _drop_below(conn: sqlite3.Connection, folders: Sequence[Tuple[bytes, bytes]]) -> None:
    """Remove the entries below each of ``folders`` (parent, name): a later source replaces
    those folders by files, links or devices, which take what was in them along (as a file
    replacing a folder would on disk); a folder of a still later source starts empty."""
    for parent, name in folders:
        path = join_path(parent, name)
        # (Every path below: the folder's own entries, and those whose parent starts with
        # "path/"; "0" follows "/" in byte order.)
        conn.execute(
            "DELETE FROM entries WHERE parent = ? OR (parent >= ? AND parent < ?)",
            (path, path + b"/", path + b"0"),
        )


class UnionSource(MountSource):
    def __init__(self, sources: Sequence[MountSource], cache_folder: Optional[str] = None) -> None:
        """``cache_folder``: where the union table is cached (None: ``union_cache.folder_for``
        the default options)."""
        self.sources = list(sources)
        #: Per source: whether it finds its entries by inode number (``by_ino``).
        self._numbered = [type(source).by_ino is not MountSource.by_ino for source in self.sources]
        self._immutable = all(source.is_immutable for source in self.sources)
        self._root_nlink: Optional[int] = None  # (``_root_links``)
        #: The sources that may change while mounted (folders), in order: not in the table.
        self._mutable = [number for number, source in enumerate(self.sources) if not source.is_immutable]
        self._all_numbered = all(self._numbered) and self._immutable
        self._lock = threading.Lock()
        identities = [union_cache.identity(s) for s in self.sources]
        self._identities = identities
        persistent = all(union_cache.is_persistent(i) for i in identities)
        folder = os.path.expanduser(cache_folder or union_cache.folder_for(IndexOptions()))
        self.table_path = union_cache.table_path(folder, UNION_FORMAT, identities) if persistent else ":memory:"
        if self.table_path != ":memory:":
            if os.path.exists(self.table_path):
                union_cache.mark_used(self.table_path)
            else:
                try:
                    self._build()
                except (OSError, sqlite3.Error) as exc:  # (sqlite3: "database or disk is full")
                    logger.warning("Cannot cache the union table in %s (%s); keeping it in memory", folder, exc)
                    self.table_path = ":memory:"
                else:
                    union_cache.sweep(folder, self.table_path, UNION_FORMAT)
        if self.table_path == ":memory:":
            self._build()
        self._pool = ConnectionPool(self.table_path) if self.table_path != ":memory:" else None
        self._generation = forks.generation
        # The archives whose files the union shows compete for the caches of decoded data from
        # now on; one whose every file a later source replaces is never read, and does not (a
        # union of three copies of a 68 MB .tar.xz of 24 MiB blocks, read from the last: not
        # kept whole, each read decoded its block up to its member, 330 ms a read).
        for (number,) in self._query("SELECT source FROM file_sources", ()):
            if 0 <= number < len(self.sources):
                self.sources[number].count_before_reads()

    def _renew(self) -> None:
        """In a forked child: connections and a lock of this process (the sources renew
        themselves when used; see ``io/forks.py``). An in-memory table (a union whose table
        could not be cached on disk) is kept: it holds no descriptor and no thread."""
        with forks.renewal_lock():
            if self._generation == forks.generation:
                return
            forks.park(self._pool)
            self._lock = threading.Lock()
            if self._pool is not None:
                self._pool = ConnectionPool(self.table_path, self._pool.identity)
            self._generation = forks.generation

    # --- the union-wide table -----------------------------------------------------------------
    def _build(self) -> None:
        if self.table_path == ":memory:":
            conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
            self._fill(conn)
            self._memory = conn
            return
        made = missing_folders(os.path.dirname(self.table_path))
        os.makedirs(os.path.dirname(self.table_path), exist_ok=True)
        temp = union_cache.build_path(self.table_path)
        try:
            conn = sqlite3.connect(temp, isolation_level=None)
        except BaseException:
            remove_empty(made)
            raise
        try:
            try:
                conn.executescript("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF;")
                self._fill(conn)  # one statement (and transaction) per source: DETACH needs none open
                union_cache.record(conn, UNION_FORMAT, self._identities)
            finally:
                conn.close()  # (a failed build kept the removed file open: its disk stayed full)
            os.replace(temp, self.table_path)
        except BaseException:
            if os.path.exists(temp):
                os.unlink(temp)
            remove_empty(made)  # (the folders made for it were left, found by fuzzing)
            raise

    def _fill(self, conn: sqlite3.Connection) -> None:
        # Each name's winner with the winner's attributes as a listing shows them (``StatRow``,
        # the inode number as ``_wrap`` gives it): a folder of the union is listed with one
        # query, as an archive's is (100,000 files in 1,000 archives: one query per archive).
        conn.execute(
            "CREATE TABLE entries (parent BLOB NOT NULL, name BLOB NOT NULL, source INTEGER NOT NULL, "
            "mode INTEGER NOT NULL, size INTEGER NOT NULL, mtime_ns NOT NULL, uid INTEGER NOT NULL, "
            "gid INTEGER NOT NULL, nlink INTEGER NOT NULL, ino INTEGER NOT NULL, rdev INTEGER NOT NULL, "
            "blocks NOT NULL, implied INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (parent, name)) WITHOUT ROWID"
        )  # (``blocks``: an index's ``BLOCKS_SQL``, a sparse member's map until ``plain_rows``)
        columns = "(parent, name, source, mode, size, mtime_ns, uid, gid, nlink, ino, rdev, blocks, implied)"
        insert_rows = f"INSERT OR REPLACE INTO entries {columns} VALUES ({', '.join('?' * 13)})"
        if self._mutable:
            # Each archive's kind of entry (union_replay: FILE, FOLDER, IMPLIED) at the names some
            # archive has as a folder: what tar -x left there before each source, which lookups
            # settle with the folder sources' entries as they are then (``_resolve``).
            conn.execute(
                "CREATE TABLE kinds (parent BLOB NOT NULL, name BLOB NOT NULL, source INTEGER NOT NULL, "
                "kind INTEGER NOT NULL, PRIMARY KEY (parent, name, source)) WITHOUT ROWID"
            )
        for number, source in enumerate(self.sources):
            if number in self._mutable:
                continue  # asked at every lookup and listing instead
            index_path = getattr(source, "index_path", None)
            if index_path:
                conn.execute("ATTACH DATABASE ? AS src", (read_only_uri(index_path),))
                # Members replace what earlier sources have; folders that are only implied by
                # member paths never replace anything.
                shifted = f"ino + 1 + {number << INO_SHIFT}"
                numbered = (
                    f"CASE WHEN ino + 1 > 1 AND ino + 1 < {1 << INO_SHIFT} THEN {shifted} ELSE 0 END"
                    if self._numbered[number]
                    else "0"
                )
                select = (
                    f"SELECT parent, name, {number}, mode, size, mtime_ns, uid, gid, nlink, {numbered}, rdev, "
                    f"{BLOCKS_SQL}, offset_header = ? FROM src.files WHERE latest = 1 AND name != x'' AND offset_header"
                )
                replaced, kept = _refused(
                    conn,
                    conn.execute(
                        "SELECT e.parent, e.name FROM entries e JOIN src.files f ON f.parent = e.parent AND "
                        f"f.name = e.name WHERE f.latest = 1 AND f.kind != 'd' AND e.mode & {_S_IFMT} = {stat.S_IFDIR}"
                    ).fetchall(),
                )
                _drop_below(conn, replaced)
                if self._mutable:
                    self._record_kinds(conn, number)
                # (``implied``: a folder source before this one that has the name wins it.)
                conn.execute(f"INSERT OR REPLACE INTO entries {columns} {select} != ?", (IMPLICIT, IMPLICIT))
                conn.executemany(insert_rows, kept)
                conn.execute(f"INSERT OR IGNORE INTO entries {columns} {select} = ?", (IMPLICIT, IMPLICIT))
                # A folder only implied where an earlier source has a file, link or device: its
                # members are not the union's (tar -x of one source after the other: "Not a
                # directory"). With folder sources, one between them may have that folder: lookups
                # settle the names from ``kinds`` instead (``_resolve``).
                if not self._mutable:
                    _drop_below(
                        conn,
                        conn.execute(
                            "SELECT e.parent, e.name FROM entries e JOIN src.files f ON f.parent = e.parent AND "
                            f"f.name = e.name WHERE f.latest = 1 AND f.offset_header = ? AND e.mode & {_S_IFMT} != "
                            f"{stat.S_IFDIR}",
                            (IMPLICIT,),
                        ).fetchall(),
                    )
                conn.execute("DETACH DATABASE src")
            else:
                rows: List[Tuple[object, ...]] = []
                folders = set(conn.execute(f"SELECT parent, name FROM entries WHERE mode & {_S_IFMT} = {stat.S_IFDIR}"))
                files_over_folders: List[Tuple[bytes, bytes]] = []
                for folder, _dirs, _files in source.walk("/"):
                    parent = encode(folder)
                    for row in source.list_stat_rows(folder) or []:
                        name, mode, size, mtime_ns, uid, gid, nlink, ino, rdev, blocks = self._shift(number, row)
                        mtime = mtime_ns if _INT64_MIN <= mtime_ns <= _INT64_MAX else encode_big_int(mtime_ns)
                        rows.append((parent, name, number, mode, size, mtime, uid, gid, nlink, ino, rdev, blocks, 0))
                        if not stat.S_ISDIR(mode) and (parent, name) in folders:
                            files_over_folders.append((parent, name))
                replaced, kept = _refused(conn, files_over_folders)
                _drop_below(conn, replaced)
                if self._mutable:
                    self._record_walked_kinds(conn, number, rows)
                conn.executemany(insert_rows, rows)
                conn.executemany(insert_rows, kept)
        if not self._mutable:  # (with folder sources, folders keep their winners' counts, as lookups give)
            self._count_folder_links(conn)
            self._count_file_links(conn)
        conn.execute("CREATE TABLE file_sources (source INTEGER PRIMARY KEY)")
        conn.execute(
            "INSERT INTO file_sources SELECT DISTINCT source FROM entries "
            f"WHERE mode & {_S_IFMT} = {stat.S_IFREG} AND implied = 0"
        )

    @staticmethod
    def _count_folder_links(conn: sqlite3.Connection) -> None:
        """Each folder's link count as tar -x of the sources in turn leaves it: 2 and one for
        each folder in it. A folder in several sources had the winner's count, of its own
        subfolders only (``ls -ld``, ``find``'s leaf optimization)."""
        is_dir = f"mode & {_S_IFMT} = {stat.S_IFDIR}"
        subfolders = dict(conn.execute(f"SELECT parent, COUNT(*) FROM entries WHERE {is_dir} GROUP BY parent"))
        updates = []
        for parent, name, nlink in conn.execute(f"SELECT parent, name, nlink FROM entries WHERE {is_dir}").fetchall():
            links = 2 + subfolders.get(join_path(parent, name), 0)
            if links != nlink:
                updates.append((links, parent, name))
        conn.executemany("UPDATE entries SET nlink = ? WHERE parent = ? AND name = ?", updates)

    @staticmethod
    def _count_file_links(conn: sqlite3.Connection) -> None:
        """A hard-linked file's link count as tar -x of the sources in turn leaves it: the names
        of its link group (one source, one inode number) that a later source replaced are gone
        (``tar -x`` of the later archive unlinks them first). Counts only ever go down here."""
        groups: Dict[Tuple[int, int], List[Tuple[bytes, bytes, int]]] = {}
        for parent, name, source, ino, nlink in conn.execute(
            "SELECT parent, name, source, ino, nlink FROM entries "
            f"WHERE nlink > 1 AND ino != 0 AND mode & {_S_IFMT} != {stat.S_IFDIR}"
        ):
            groups.setdefault((source, ino), []).append((parent, name, nlink))
        updates = [
            (len(names), parent, name)
            for names in groups.values()
            for parent, name, nlink in names
            if len(names) < nlink
        ]
        conn.executemany("UPDATE entries SET nlink = ? WHERE parent = ? AND name = ?", updates)

    @staticmethod
    def _record_kinds(conn: sqlite3.Connection, number: int) -> None:
        """``kinds`` of archive ``number`` (attached as ``src``), before its rows enter ``entries``:
        the earlier winner's file, link or device where it has a folder, its folders, and its
        other entries where an earlier archive has a folder."""
        conn.execute(
            "INSERT OR IGNORE INTO kinds (parent, name, source, kind) SELECT e.parent, e.name, e.source, ? "
            "FROM entries e JOIN src.files f ON f.parent = e.parent AND f.name = e.name "
            f"WHERE f.latest = 1 AND f.kind = 'd' AND e.mode & {_S_IFMT} != {stat.S_IFDIR}",
            (FILE,),
        )
        conn.execute(
            "INSERT OR IGNORE INTO kinds (parent, name, source, kind) SELECT f.parent, f.name, ?, "
            "CASE WHEN f.kind != 'd' THEN ? WHEN f.offset_header = ? THEN ? ELSE ? END FROM src.files f "
            "WHERE f.latest = 1 AND f.name != x'' AND (f.kind = 'd' OR EXISTS "
            "(SELECT 1 FROM kinds k WHERE k.parent = f.parent AND k.name = f.name))",
            (number, FILE, IMPLICIT, IMPLIED, FOLDER),
        )

    @staticmethod
    def _record_walked_kinds(conn: sqlite3.Connection, number: int, rows: List[Tuple[object, ...]]) -> None:
        """``_record_kinds`` for a source without an index (``rows``: its ``entries`` rows)."""
        kinds: List[Tuple[object, ...]] = []
        for row in rows:
            parent, name, mode = row[0], row[1], int(row[3])  # type: ignore[call-overload]
            if stat.S_ISDIR(mode):
                before = conn.execute("SELECT source, mode FROM entries WHERE parent = ? AND name = ?", (parent, name))
                kinds.extend((parent, name, s, FILE) for s, m in before if not stat.S_ISDIR(m))
                kinds.append((parent, name, number, FOLDER))
            elif conn.execute("SELECT 1 FROM kinds WHERE parent = ? AND name = ? LIMIT 1", (parent, name)).fetchone():
                kinds.append((parent, name, number, FILE))
        conn.executemany("INSERT OR IGNORE INTO kinds (parent, name, source, kind) VALUES (?, ?, ?, ?)", kinds)

    def _query(self, sql: str, params: tuple) -> list:  # type: ignore[type-arg]
        if self._generation != forks.generation:
            self._renew()
        if self._pool is not None:
            return self._pool.query(sql, params)  # type: ignore[no-any-return]
        with self._lock, sqlite_gate.gate:
            return self._memory.execute(sql, params).fetchall()

    def _winner(self, path: str) -> Tuple[Optional[int], bool, int]:
        """The source the table gives ``path`` to, whether its entry is a folder only implied by
        member paths, and its link count in the union."""
        rows = self._query("SELECT source, implied, nlink FROM entries WHERE parent = ? AND name = ?", split_path(path))
        return (int(rows[0][0]), bool(rows[0][1]), int(rows[0][2])) if rows else (None, False, 0)

    def _root_links(self) -> int:
        """The root's link count in the union (``_count_folder_links``)."""
        if self._root_nlink is None:
            self._root_nlink = 2 + len(self._query(_FOLDER_LINKS_SQL, (b"/",)))
        return self._root_nlink

    def _children(self, path: str, limit: int = -1) -> List[Tuple[bytes, int]]:
        return self._query("SELECT name, source FROM entries WHERE parent = ? LIMIT ?", (encode(path), limit))

    # --- MountSource --------------------------------------------------------------------------
    @property
    def is_immutable(self) -> bool:
        return self._immutable

    def is_immutable_entry(self, info: FileInfo) -> bool:
        locator = info.locator
        if not isinstance(locator, UnionLocator):
            return self.is_immutable  # (the root)
        return self.sources[locator.source].is_immutable_entry(locator.info)

    def host_identity(self, info: FileInfo) -> Optional[Tuple[int, ...]]:
        locator = info.locator
        if not isinstance(locator, UnionLocator):
            return None
        return self.sources[locator.source].host_identity(locator.info)

    def _ino(self, number: int, ino: int) -> int:
        """Source ``number``'s inode number ``ino`` in the union: the source's number above it. Left
        out (0: none, the front-end names the entry) when the source cannot find the entry by its
        number again (``by_ino``), or the number is too large to shift (a folder source's members)."""
        if not (self._numbered[number] and 0 < ino < 1 << INO_SHIFT):
            return 0
        return ino if ino <= 1 and number == 0 else (number << INO_SHIFT) | ino

    def _wrap(self, number: int, info: FileInfo) -> FileInfo:
        return info._replace(ino=self._ino(number, info.ino), locator=UnionLocator(number, info))

    def lookup(self, path: str) -> Optional[FileInfo]:
        if path == "/":
            info = self.sources[-1].lookup("/")
            if info is None:
                return None
            links = info.nlink if self._mutable else self._root_links()  # (with folders: theirs)
            return info._replace(ino=1, locator=None, nlink=links)
        if self._mutable:
            return self._lookup_live(path)
        number, _implied, links = self._winner(path)
        if number is not None:
            info = self.sources[number].lookup(path)
            if info is not None:
                return self._wrap(number, info._replace(nlink=links) if info.is_dir or links < info.nlink else info)
        # Not in the union table: a PATH.versions folder or version (no index lists them). In a
        # union of archives nothing else is missing from the table: a miss is one query, not
        # one per source.
        return self._lookup_versions(path) if _VERSIONS_PART in path + "/" else None

    def _lookup_versions(self, path: str) -> Optional[FileInfo]:
        """``PATH.versions`` or ``PATH.versions/N``: those of the source the union shows ``PATH``
        from (none for a name it does not show, or shows from a folder source: a folder keeps no
        versions), so that a listing and the lookups of its entries agree."""
        owner = self.lookup((path + "/").rpartition(_VERSIONS_PART)[0])
        if owner is None or owner.locator is None or owner.locator.source in self._mutable:
            return None
        info = self.sources[owner.locator.source].lookup(path)
        return None if info is None else self._wrap(owner.locator.source, info)

    def _lookup_live(self, path: str) -> Optional[FileInfo]:
        """``lookup`` in a union with sources that may change: what tar -x of the sources in
        order leaves at ``path`` (``_resolve``)."""
        return self._lookup_settled(path)[0]

    def _lookup_settled(self, path: str) -> Tuple[Optional[FileInfo], Optional[Settled]]:
        """``_lookup_live``, with how the path settled (None for a ``PATH.versions`` entry)."""
        settled = self._resolve(path)
        if settled is not None:
            info = self._owner_info(path, settled.owner)
            return (None if info is None else self._wrap(settled.owner.source, info)), settled
        if _VERSIONS_PART in path + "/":  # (below a folder only: not below a file of that name)
            above = self.lookup(path.rpartition("/")[0] or "/")
            if above is not None and above.is_dir:
                return self._lookup_versions(path), None
        return None, None

    def _folder(self, path: str) -> Tuple[Optional[FileInfo], Optional[Settled]]:
        """``lookup`` of a folder about to be listed, with how it settled when the union has
        sources that may change (``_merged_rows`` lists from there instead of settling it again)."""
        if self._mutable and path != "/":
            return self._lookup_settled(path)
        return self.lookup(path), ROOT

    def _owner_info(self, path: str, owner: Claim) -> Optional[FileInfo]:
        return owner.info if owner.info is not None else self.sources[owner.source].lookup(path)

    def _resolve(self, path: str) -> Optional[Settled]:
        """Each name of ``path`` settled from the top down (``union_replay``); None where a name
        is missing or a name above it is not a folder."""
        settled = ROOT
        above = ""
        for part in path.strip("/").split("/") if path != "/" else []:
            if not settled.is_dir:
                return None
            above += "/" + part
            found = settle(self._claims(above, settled), settled, self._holds_at(above))
            if found is None:
                return None
            settled = found
        return settled

    def _claims(self, path: str, above: Settled) -> List[Claim]:
        """The archives' claims on ``path`` (the table's) and those of the folder sources that
        ``above`` (its parent, settled) lets through, with their entries as they are now."""
        key = split_path(path)
        claims = [Claim(int(source), int(kind)) for source, kind in self._query(_KINDS_SQL, key)]
        if not claims:  # (no archive has it as a folder: the last that has it)
            winner = self._query(_WINNER_SQL, key)
            claims = [Claim(int(source), _kind(int(mode), implied)) for source, mode, implied in winner]
        for mutable in self._mutable:
            if mutable > above.floor and mutable not in above.excluded:
                info = self.sources[mutable].lookup(path)
                if info is not None:
                    claims.append(Claim(mutable, self._folder_kind(mutable, path, info), info))
        return claims

    def _folder_kind(self, number: int, path: str, info: FileInfo) -> int:
        if not info.is_dir:
            return FILE
        return IMPLIED if self.sources[number].is_implied(path, info) else FOLDER

    def _merged_rows(
        self, path: str, after: Optional[bytes], limit: int, above: Optional[Settled]
    ) -> List[Tuple[StatRow, int]]:
        """The rows of folder ``path`` after ``after`` in name order (``limit`` -1: all) with the
        source of each: every name settled from the table's claims and the folder sources' rows
        as they are now. Within the table's part (up to its last name when it filled ``limit``),
        so that the next part, after the last name returned, follows on without a gap. ``above``:
        how ``path`` settled (``_folder``)."""
        if above is None or not above.is_dir:
            return []
        # Sources let through only in part: the table's part is read whole (rare), as a part of it
        # may be all hidden.
        part = limit if above.floor < 0 and not above.excluded else -1
        encoded = encode(path)
        table = self._query(_SOURCE_ROWS_SQL, (encoded, after or b"", part))
        upper = table[-1][0] if 0 <= part <= len(table) else None
        rows: Dict[Tuple[bytes, int], StatRow] = {}
        winners: Dict[bytes, Tuple[int, int, int]] = {}  # name -> (source, mode, implied) of the table
        for row, full in zip(plain_rows([r[:10] for r in table]), table):
            rows[row[0], full[10]] = row
            winners[row[0]] = (full[10], row[1], full[11])
        # Names more than one source claims: every archive's claim (``kinds``), the folder sources'.
        contested: Dict[bytes, List[Claim]] = {}
        for name, source, kind in self._query(_CHILD_KINDS_SQL, (encoded, after or b"", upper)):
            contested.setdefault(name, []).append(Claim(int(source), int(kind)))
        for mutable in self._mutable:
            if mutable <= above.floor or mutable in above.excluded:
                continue
            for row in self.sources[mutable].list_stat_rows(path) or []:
                name = row[0]
                if (after is not None and name <= after) or (upper is not None and name > upper):
                    continue
                rows[name, mutable] = self._shift(mutable, row)
                if name not in contested:
                    winner = winners.get(name)
                    contested[name] = [] if winner is None else [Claim(winner[0], _kind(winner[1], winner[2]))]
                contested[name].append(Claim(mutable, FILE if not stat.S_ISDIR(row[1]) else FOLDER))
        merged: List[Tuple[StatRow, int]] = []
        for name in sorted(winners.keys() | contested.keys()) if contested else winners:
            named = contested.get(name)
            if named is None:  # (most names: only the table's winner has them)
                number = winners[name][0]
                if number <= above.floor or number in above.excluded:
                    continue
            else:
                if len(named) > 1 and any(c.source in self._mutable and c.kind == FOLDER for c in named):
                    named = self._checked_folders(path, name, named)  # (a folder source's folder may be implied)
                child = join_path(encoded, name).decode("utf-8", "surrogateescape")
                settled = settle(named, above, self._holds_at(child))
                if settled is None:
                    continue
                number = settled.owner.source
            found = rows.get((name, number))
            if found is None:  # an archive the table does not name (an earlier one than its winner)
                info = self.sources[number].lookup(join_path(encoded, name).decode("utf-8", "surrogateescape"))
                if info is None:
                    continue
                ino = self._ino(number, info.ino)
                found = (
                    name, info.mode, info.size, info.mtime_ns, info.uid, info.gid,
                    info.nlink, ino, info.rdev, info.st_blocks,
                )  # fmt: skip
            merged.append((found, number))
            if len(merged) == limit:
                break
        return merged

    def _holds_at(self, path: str) -> Callable[[Claim], bool]:
        """``settle``'s question for folder ``path``: whether a claim's source has anything below
        it (a folder only implied by member paths does)."""

        def holds(claim: Claim) -> bool:
            if claim.kind == IMPLIED:
                return True
            return bool(self.sources[claim.source].list_name_rows_after(path, None, 1))

        return holds

    def _checked_folders(self, folder: str, name: bytes, claims: List[Claim]) -> List[Claim]:
        """``claims`` with each folder source's folder looked up: implied, or a folder of its own."""
        path = join_path(encode(folder), name).decode("utf-8", "surrogateescape")
        checked = []
        for claim in claims:
            if claim.kind == FOLDER and claim.source in self._mutable:
                info = self.sources[claim.source].lookup(path)
                if info is None:
                    continue
                claim = Claim(claim.source, self._folder_kind(claim.source, path, info), info)
            checked.append(claim)
        return checked

    def _owner(self, path: str) -> Optional[int]:
        """The source the union shows ``path`` from (None: none)."""
        if not self._mutable:
            return self._winner(path)[0]
        settled = self._resolve(path)
        return None if settled is None else settled.owner.source

    def by_ino(self, ino: int) -> Optional[Tuple[str, FileInfo]]:
        # ``_wrap``'s numbering: the source above its own inode number. The entry must still be
        # the union's (the winner of its name; a folder in several sources has the winner's).
        number = ino >> INO_SHIFT
        if ino <= 1 or number >= len(self.sources):
            return None
        found = self.sources[number].by_ino(ino & _INNER_MASK)
        if found is None:
            return None
        if self._owner(found[0]) != number:
            # A hard link whose first name a later source replaced: one of its other names.
            # (No index on inode numbers: a scan of the table, for this rare case only.)
            rows = self._query("SELECT parent, name FROM entries WHERE ino = ? AND source = ? LIMIT 1", (ino, number))
            if not rows:
                return None
            parent, name = rows[0]
            path = join_path(parent, name).decode("utf-8", "surrogateescape")
            info = self.sources[number].lookup(path)
            if info is None or (self._mutable and self._owner(path) != number):
                return None
            return path, self._wrap(number, info)
        info = found[1]
        if (info.is_dir or info.nlink > 1) and not self._mutable:
            links = self._winner(found[0])[2]
            if info.is_dir or links < info.nlink:
                info = info._replace(nlink=links)
        return found[0], self._wrap(number, info)

    def lists_by_number(self, folder: FileInfo) -> bool:
        return self._all_numbered  # (a folder among the sources: its entries have no numbers)

    def list_stat_rows(self, path: str) -> Optional[List[StatRow]]:
        return self._stat_rows(path, None, -1)

    def list_stat_rows_after(self, path: str, after: Optional[bytes], limit: int) -> Optional[List[StatRow]]:
        return self._stat_rows(path, after, limit)

    def _stat_rows(self, path: str, after: Optional[bytes], limit: int) -> Optional[List[StatRow]]:
        """The folder's rows after ``after`` in name order (``limit`` -1: all), from the union
        table: each name's winner with its attributes."""
        info, above = self._folder(path)
        if info is None or not info.is_dir:
            return None
        if self._mutable:
            rows = [row for row, _number in self._merged_rows(path, after, limit, above)]
        else:
            rows = self._query(_STAT_ROWS_SQL, (encode(path), after or b"", limit))
        if not rows and isinstance(info.locator, UnionLocator) and not self._children(path, 1):
            number = info.locator.source  # a folder no index lists (PATH.versions): its source's
            source = self.sources[number]
            found = source.list_stat_rows(path) if limit < 0 else source.list_stat_rows_after(path, after, limit)
            return [self._shift(number, row) for row in found or []]
        return plain_rows(rows)  # type: ignore[return-value]

    def list_name_rows_after(self, path: str, after: Optional[bytes], limit: int) -> Optional[List[NameRow]]:
        info, above = self._folder(path)
        if info is None or not info.is_dir:
            return None
        if self._mutable:
            rows = [(r[0], r[1], r[7]) for r, _number in self._merged_rows(path, after, limit, above)]
        else:
            rows = self._query(_NAME_ROWS_SQL, (encode(path), after or b"", limit))
        if not rows and isinstance(info.locator, UnionLocator) and not self._children(path, 1):
            return super().list_name_rows_after(path, after, limit)  # (from its source's rows)
        return rows

    def _shift(self, number: int, row: StatRow) -> StatRow:
        """``row`` with its inode number as ``_wrap`` gives it."""
        return (row[0], row[1], row[2], row[3], row[4], row[5], row[6], self._ino(number, row[7]), row[8], row[9])

    def list_entries(self, path: str) -> Optional[Iterable[Tuple[str, FileInfo]]]:
        info, above = self._folder(path)
        if info is None or not info.is_dir:
            return None
        children = (
            [(row[0], number) for row, number in self._merged_rows(path, None, -1, above)]
            if self._mutable
            else self._children(path)
        )
        if not children and isinstance(info.locator, UnionLocator):
            entries = self.sources[info.locator.source].list_entries(path)  # e.g. a .versions folder
            return None if entries is None else [(n, self._wrap(info.locator.source, i)) for n, i in entries]
        return list(self._entries_of(path, children).items())

    def _entries_of(self, path: str, names: List[Tuple[bytes, int]]) -> Dict[str, FileInfo]:
        """name -> entry of the (raw name, winning source) ``names`` of folder ``path``, from each
        winner's listing of that folder."""
        wanted: Dict[int, Set[str]] = {}
        for raw_name, number in names:
            wanted.setdefault(number, set()).add(raw_name.decode("utf-8", "surrogateescape"))
        found: Dict[str, FileInfo] = {}
        links: Dict[str, int] = {}
        if not self._mutable:  # (with folder sources: their folders' own counts)
            rows = self._query(_FOLDER_LINKS_SQL, (encode(path),))
            links = {name.decode("utf-8", "surrogateescape"): count for name, count in rows}
        file_links: Optional[Dict[str, int]] = None  # (asked once, at the folder's first hard link)
        for number, of_source in wanted.items():
            for name, child in self.sources[number].list_entries(path) or []:
                if name in of_source:
                    if child.is_dir and name in links:
                        child = child._replace(nlink=links[name])
                    elif child.nlink > 1 and not self._mutable:  # a hard link
                        if file_links is None:
                            rows = self._query(_FILE_LINKS_SQL, (encode(path),))
                            file_links = {raw.decode("utf-8", "surrogateescape"): count for raw, count in rows}
                        links_here = file_links.get(name, 0)
                        if 0 < links_here < child.nlink:
                            child = child._replace(nlink=links_here)
                    found[name] = self._wrap(number, child)
                    of_source.discard(name)
            if of_source and self._mutable:
                # Gone from a folder source since its rows were read: whoever has them now.
                for name in of_source:
                    info = self.lookup(("/" if path == "/" else path + "/") + name)
                    if info is not None:
                        found[name] = info
        return found

    def list_entries_upto(self, path: str, limit: int) -> Optional[List[Tuple[str, FileInfo]]]:
        """The first ``limit`` names of the folder (name order) with their entries, from the
        sources that win them: enough to tell that a folder is large without listing it whole
        (a run of lookups in a union's folder of 100,000 files listed every archive's part of it
        as ``FileInfo`` objects for that: 1.7 s and 100 MiB for 1,000 random reads)."""
        if limit < 0:
            entries = self.list_entries(path)
            return None if entries is None else list(entries)
        info, above = self._folder(path)
        if info is None or not info.is_dir:
            return None
        part = (
            [(row[0], number) for row, number in self._merged_rows(path, None, limit, above)]
            if self._mutable
            else self._query(
                "SELECT name, source FROM entries WHERE parent = ? ORDER BY name LIMIT ?", (encode(path), limit)
            )
        )
        if not part:
            return super().list_entries_upto(path, limit)  # empty, or a .versions folder (its source's)
        found = self._entries_of(path, part)
        return [(n, found[n]) for n in (raw.decode("utf-8", "surrogateescape") for raw, _ in part) if n in found]

    def open_info(self, info: FileInfo) -> MemberFile:
        locator = info.locator
        if not isinstance(locator, UnionLocator):
            raise FileNotFoundError(2, "not a file of this union")
        return self.sources[locator.source].open_info(locator.info)

    def read_into(self, info: FileInfo, offset: int, view: memoryview) -> int:
        locator = info.locator
        if not isinstance(locator, UnionLocator):
            raise FileNotFoundError(2, "not a file of this union")
        return self.sources[locator.source].read_into(locator.info, offset, view)

    def seek_data(self, info: FileInfo, offset: int, whence: int) -> int:
        locator = info.locator
        if not isinstance(locator, UnionLocator):
            raise FileNotFoundError(2, "not a file of this union")
        return self.sources[locator.source].seek_data(locator.info, offset, whence)

    def expect_reads(self) -> None:
        for source in self.sources:
            source.expect_reads()  # (a compressed reader decodes ahead only when it is alone)

    def will_read(self, info: FileInfo) -> None:
        locator = info.locator
        if isinstance(locator, UnionLocator):
            self.sources[locator.source].will_read(locator.info)

    def statfs(self) -> dict:  # type: ignore[type-arg]
        result = dict(self.sources[0].statfs())
        for source in self.sources[1:]:
            for key in ("f_blocks", "f_files"):
                result[key] = result.get(key, 0) + source.statfs().get(key, 0)
        return result

    def close(self) -> None:
        if self._generation != forks.generation:
            forks.park(self._pool)  # the parent's connections: neither used nor closed here
        elif self._pool is not None:
            self._pool.close()
        for source in self.sources:
            source.close()

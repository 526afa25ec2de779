"""The persistent SQLite index: written once to a temporary file, renamed into place, then only
ever opened read-only (``mode=ro&immutable=1``: no locks, no journal, fine on shared file systems).

The writer knows nothing about tar parsing and the reader nothing about building; both speak
``MemberRecord`` rows and plain SQL.
"""

from __future__ import annotations

import bisect
import collections
import heapq
import itertools
import logging
import os
import posixpath
import sqlite3
import struct
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from ..errors import InvalidIndexError, OtherOptionsIndexError, StaleIndexError
from ..tar.scanner import KIND_DIR, KIND_HARDLINK, KIND_SYMLINK, KIND_WORDS, MemberRecord
from . import dirents, extraction_order, stale
from .fingerprint import ArchiveStats
from .locations import temporary_path
from .paths import join_path, parent_and_name
from .pool import ConnectionPool, read_only_uri

logger = logging.getLogger(__name__)

#: Bump when the schema or the meaning of a column changes, or when older indexes lack members
#: (7: hard links whose target path passes through a symbolic link to a folder; 8: members
#: stored after a "regular file" named with a trailing slash, owner ids tar cannot set, the
#: folders of an empty-target link in a replayed archive); older indexes are rebuilt.
FORMAT_VERSION = "8"
#: ``offset_header`` of folders that no member names, only member paths imply.
IMPLICIT = -1

ROW_COLUMNS = (
    "id, parent, name, kind, mode, size, mtime_ns, uid, gid, nlink, ino, linkname, offset_data, sparse, rdev, source"
)
#: Pages of new indexes. A lookup on a cold index reads a leaf page from disk; larger pages
#: hold more of the neighbouring entries (1,000 random reads from the 100,000-file tar after
#: ``drop_caches``, interleaved: 4 KiB 0.34 s, 16 KiB 0.30 s, 64 KiB 0.28 s), but a lookup
#: whose page is in the OS cache but not in SQLite's copies it whole (warm random lookups 10.0,
#: 10.5 and 14.5 us; 8 parallel readers 0.65 s with 4 and 16 KiB, 0.76 s with 64 KiB).
#: Indexes with other page sizes stay valid.
PAGE_SIZE = 16384
#: A listing row's ``st_blocks``: the size in 512-byte blocks, rounded up; a sparse member's map
#: instead, which ``plain_rows`` turns into the blocks of its extents (rare: no SQL function, which
#: every connection would have to register, and no Python call per row of other folders).
BLOCKS_SQL = "CASE WHEN sparse IS NULL THEN (size + 511) >> 9 ELSE sparse END"
_LIST_STATS = (
    f"SELECT name, mode, size, mtime_ns, uid, gid, nlink, ino + 1, rdev, {BLOCKS_SQL} "
    "FROM files WHERE parent = ? AND latest = 1"
)
#: ``IndexReader.list_stats``: a folder's entries as ``StatRow`` fields (the root row has no name).
LIST_STATS_SQL = _LIST_STATS + " AND name != x'' ORDER BY name, id"
#: ``LIST_STATS_SQL`` a part at a time: the rows after a name (names of the latest rows of one
#: folder are unique, so the name alone says where the last part ended).
_AFTER = " AND name > ? ORDER BY name, id LIMIT ?"
LIST_STATS_AFTER_SQL = _LIST_STATS + _AFTER
#: ``LIST_STATS_AFTER_SQL`` with name, mode and inode number only (half the time per row).
LIST_NAMES_AFTER_SQL = "SELECT name, mode, ino + 1 FROM files WHERE parent = ? AND latest = 1" + _AFTER

#: Build options that indexes written before they existed were built with.
#: How what an index shows of archives inside the archive (-r) is decided; an index with such
#: archives built by other rules is rebuilt (those without any serve as they are). 2: an
#: archive's members are the rows its scan recorded, its own name holds its file when its folder
#: has another, and a damaged one of which nothing could be read is a file (session 22). 3: a
#: compressed archive inside a compressed stream is a folder too, where it was a file (session
#: 45); an index of a compressed archive by older rules is rebuilt even without inner archives,
#: since those it showed as files were not counted.
INNER_ARCHIVE_RULES = "3"
#: The rules from which a compressed archive in a compressed stream is a folder.
COMPRESSED_IN_COMPRESSED_RULES = 3

OPTION_DEFAULTS = {"strip_tar_extension": "0", "inner_archive_rules": "1"}


def scan_options(format_value: str, recursive: bool, strip_tar_extension: bool) -> Dict[str, str]:
    """The build options an index of a tar records about how it was scanned, as opening the
    archive checks them (``check_options``): the converter writes the same, or the first mount
    of its output would rebuild the index it wrote (found by fuzzing: ``ratarmount-convert -r``
    recorded no inner-archive rules, read as those of before session 22)."""
    options = {
        "format": format_value,
        "recursive": str(int(recursive)),
        "strip_tar_extension": str(int(recursive and strip_tar_extension)),
    }
    if recursive:
        options["inner_archive_rules"] = INNER_ARCHIVE_RULES
    return options


#: Build options that are command-line flags, by the flag's name.
_FLAGS = {"recursive": "-r", "strip_tar_extension": "--strip-tar-extension"}


def option_difference(key: str, stored: Optional[str], wanted: str) -> str:
    """How an index's build option ``key`` differs from the one wanted, in the command line's
    terms: "without -r, now with -r"."""
    if key in _FLAGS:
        flag = _FLAGS[key]
        return f"{'with' if stored == '1' else 'without'} {flag}, now {'with' if wanted == '1' else 'without'} {flag}"
    if key == "seek_point_spacing":

        def spacing(value: Optional[str]) -> str:
            return "the default seek point spacing" if value is None else f"--seek-point-spacing {int(value) / 2**20:g}"

        return f"with {spacing(stored)}, now {spacing(wanted)}"
    if key == "compression_backend":
        return f"with the {stored} backend, now {wanted}"
    # (settings of the index format: an index of another version holds others)
    return f"by another version of ratarmount: {key} {stored!r}, now {wanted!r}"


Row = Tuple[int, bytes, bytes, str, int, int, int, int, int, int, int, bytes, int, Optional[bytes], int, int]


#: ``PRAGMA application_id`` of our indexes (set by ``schema.sql``): the bytes "RMix".
APPLICATION_ID = 0x524D6978


def written_by_us(path: str) -> bool:
    """Whether ``path`` is an index of ours (of any format version, valid or not): it carries our
    application id, or (indexes from before the id) our archive identity in its metadata. Files
    of other programs -- the PyPI ratarmount release uses the same ``.index.sqlite`` name -- and
    files that are not SQLite at all are not, and are never overwritten."""
    try:
        with open(path, "rb") as file:
            header = file.read(100)
    except OSError:
        return False
    if len(header) < 100 or not header.startswith(b"SQLite format 3\0"):
        return False
    if int.from_bytes(header[68:72], "big") == APPLICATION_ID:
        return True  # (read from the file's header: also when the rest of it is damaged or cut off)
    try:
        conn = sqlite3.connect(read_only_uri(path), uri=True)
    except sqlite3.Error:
        return False
    try:
        found = conn.execute("SELECT 1 FROM metadata WHERE key = 'archive_fingerprint'").fetchone()
        return found is not None
    except sqlite3.Error:
        return False
    finally:
        conn.close()


def foreign_file(path: str) -> bool:
    """Whether a file at ``path`` exists and is not an index of ours (so must not be replaced)."""
    return os.path.lexists(path) and not written_by_us(path)


def why_left_alone(path: str) -> str:
    """Why ``foreign_file(path)``: what the file at ``path`` is, as a warning says it."""
    if os.path.isdir(path):
        return "a folder"
    try:
        with open(path, "rb") as file:
            empty = not file.read(1)
    except OSError as exc:
        return f"it cannot be read: {(exc.strerror or str(exc)).lower()}"
    return "an empty file" if empty else "not a ratarmount index; another program's?"


def _sql(name: str) -> str:
    """The SQL file ``name`` of this package: read beside this module (the package is installed
    as files); through ``importlib.resources`` only where it is not (a zip). That module pulls in
    pathlib, tempfile, random, zipfile, ...: 7 ms of every index build, and ~0.5 MiB that the
    mount would carry in its memory."""
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), name), encoding="utf-8") as f:
            return f.read()
    except OSError:
        from importlib import resources

        return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def encode(path: str) -> bytes:
    return path.encode("utf-8", "surrogateescape")


def split_path(path: str) -> Tuple[bytes, bytes]:
    """ "/a/b/c" -> (b"/a/b", b"c"); "/" -> (b"", b"")."""
    if path == "/":
        return b"", b""
    parent, name = posixpath.split(path)
    return encode(parent), encode(name)


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def encode_big_int(value: int) -> bytes:
    """Integers beyond SQLite's int64 (e.g. nanosecond mtimes after the year 2262) are stored
    as decimal text in a BLOB, which no column affinity converts; ``decode_int`` reverses it."""
    return str(value).encode("ascii")


def decode_int(value: "int | bytes") -> int:
    return value if isinstance(value, int) else int(value)


def plain_rows(rows: List[Tuple[Any, ...]]) -> List[Tuple[Any, ...]]:
    """Listing rows (``StatRow`` fields) as queried, with mtimes beyond 64 bits decoded and
    sparse members' maps (``BLOCKS_SQL``) turned into their blocks."""
    if any(row[3].__class__ is not int or row[9].__class__ is not int for row in rows):
        rows = [
            row[:3] + (decode_int(row[3]),) + row[4:9] + (row[9] if row[9].__class__ is int else sparse_blocks(row[9]),)
            for row in rows
        ]
    return rows


def pack_sparse(extents: Optional[Sequence[Tuple[int, int]]]) -> Optional[bytes]:
    if extents is None:
        return None
    flat = [v for pair in extents for v in pair]
    return struct.pack(f"<{len(flat)}q", *flat)


def sparse_blocks(blob: bytes) -> int:
    """The 512-byte blocks of a sparse member's stored extents (``pack_sparse``'s form): its
    ``st_blocks``, as what ``tar -x`` writes of it takes (the holes take none)."""
    return (sum(length for _, length in unpack_sparse(blob) or ()) + 511) >> 9


def unpack_sparse(blob: Optional[bytes]) -> Optional[Tuple[Tuple[int, int], ...]]:
    if blob is None:
        return None
    flat = struct.unpack(f"<{len(blob) // 8}q", blob)
    return tuple(zip(flat[0::2], flat[1::2]))


def _remove_files(*paths: str) -> None:
    for path in paths:
        stale.unregister(path)
        try:
            os.unlink(path)
        except OSError:  # (gone, or never made: a name too long gave a traceback at exit)
            pass


class IndexWriter:
    """Builds an index in ``<final>.tmp-<uuid>`` and renames it into place on ``commit``.

    Used as a context manager: leaving the block with an exception removes the temporary file,
    so an interrupted build leaves nothing behind.
    """

    BATCH = 5_000

    def __init__(self, final_path: str, stats: ArchiveStats, archive_path: str, extra: Dict[str, str]) -> None:
        self.final_path = final_path
        stale.remove_abandoned(final_path)
        self.temp_path = temporary_path(final_path)
        stale.register(self.temp_path)
        # Removes the temporary file unless committed: on ``abort``, and also when the writer is
        # dropped or the program exits without either (an exception between creating the writer
        # and entering its block, e.g. a Ctrl-C or SIGTERM turned into one, left the file).
        self._remove_temporary = weakref.finalize(self, _remove_files, self.temp_path, self.temp_path + "-journal")
        #: Bytes free for the index's folder when the build was given up, its file still there
        #: (None: not given up, or unknown): tells a full disk there from one elsewhere.
        self.free_at_abort: Optional[int] = None
        self._stats = stats
        # For people reading the index; a name that is not UTF-8 is kept readable (SQLite text
        # must be UTF-8: a surrogate-escaped name failed the build).
        shown = os.fsencode(os.path.abspath(archive_path)).decode("utf-8", "backslashreplace")
        self._meta = {"archive_path": shown, **extra}
        self._conn = sqlite3.connect(self.temp_path, isolation_level=None)
        try:
            self._conn.executescript(
                "PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; PRAGMA locking_mode=EXCLUSIVE; "
                f"PRAGMA page_size={PAGE_SIZE}; PRAGMA cache_size=-4000;"
            )
            self._conn.executescript(_sql("schema.sql"))
            self._conn.execute("BEGIN")
        except BaseException:  # (out of descriptors, a full disk): no file left behind
            self.abort()
            raise
        self._batch: List[tuple] = []  # rows that need every column
        self._simple_batch: List[tuple] = []  # rows whose other columns keep their defaults
        self._next_id = 1
        self._explicit_dirs: Set[str] = set()
        self._ancestors: Set[str] = set()
        self._last_parent = ""
        self._last_parent_bytes = b""
        self._has_hardlinks = False
        #: (row id, parent) of members left out whose folders tar -x makes all the same (a
        #: symbolic link with an empty target): the extraction replay makes them in their turn.
        self._parents_only: List[Tuple[int, bytes]] = []
        #: Rows of folders that stand for archives inside the archive (``-r``).
        self._archive_folders: Dict[int, _ArchiveFolder] = {}
        #: The paths of those whose scan is done: a file to tar -x for the members after them.
        self._closed_archives: Set[str] = set()
        #: Whether a member not its own is below such a folder (before it, or after its rows).
        self._archive_conflict = False
        self._count = 0
        self._committed = False
        #: The (device, inode) of the index written, once committed.
        self.identity: Optional[Tuple[int, int]] = None

    def __enter__(self) -> "IndexWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:  # type: ignore[no-untyped-def]
        if not self._committed:
            self.abort()

    # --- rows ---------------------------------------------------------------------------------
    def add(self, record: MemberRecord, source: int = 0) -> int:
        """Add one member; returns its row id. (Hot loop of every index build: kept lean.)"""
        row_id = self._next_id
        self._next_id += 1
        path = record.path
        kind = record.kind
        if path == "/":
            if kind != KIND_DIR:
                # A file, link or device named ".", "/" or "./": GNU tar cannot put it in place
                # of the extraction folder ("File exists"), and the root must stay a directory.
                logger.warning(
                    'Ignoring a %s member named as the root folder ("/", "." or ".."), which it would replace',
                    KIND_WORDS.get(kind, kind),
                )
                return row_id
            parent, name = b"", b""
        else:
            parent_str, _, name_str = path.rpartition("/")
            parent_str = parent_str or "/"
            name = name_str.encode("utf-8", "surrogateescape")
            if parent_str == self._last_parent:  # members come grouped by folder: reuse its work
                parent = self._last_parent_bytes
            else:
                parent = parent_str.encode("utf-8", "surrogateescape")
                self._last_parent = parent_str
                self._last_parent_bytes = parent
                if self._closed_archives and not self._archive_conflict:
                    self._archive_conflict = _is_in(parent_str, self._closed_archives)
                while parent_str != "/" and parent_str not in self._ancestors:
                    self._ancestors.add(parent_str)
                    parent_str = parent_str.rpartition("/")[0] or "/"
        if kind == KIND_SYMLINK and not record.linkname:
            # symlink(2) refuses an empty target: tar -x reports it and leaves what was there
            # (having made the folders on the way).
            logger.warning("Ignoring the symbolic link %r: its target is empty", path)
            self._parents_only.append((row_id, parent))
            return row_id
        if kind == KIND_DIR:
            self._explicit_dirs.add(path)
        mtime_ns = record.mtime_ns
        if (
            not record.linkname
            and kind != KIND_HARDLINK
            and record.sparse is None
            and not record.rdev
            and not source
            and _INT64_MIN <= mtime_ns <= _INT64_MAX
        ):
            # The common row: the columns left out keep their defaults, and binding fewer
            # parameters makes the bulk insert about a third faster.
            simple = self._simple_batch
            simple.append(
                (
                    row_id,
                    parent,
                    name,
                    kind,
                    record.mode,
                    record.size,
                    mtime_ns,
                    record.uid,
                    record.gid,
                    row_id,
                    record.offset_header,
                    record.offset_data,
                )
            )
            if len(simple) >= self.BATCH:
                self._flush()
        else:
            is_hardlink = kind == KIND_HARDLINK
            if is_hardlink:
                self._has_hardlinks = True
            rows = self._batch
            rows.append(
                (
                    row_id,
                    parent,
                    name,
                    kind,
                    record.mode,
                    record.size,
                    mtime_ns if _INT64_MIN <= mtime_ns <= _INT64_MAX else encode_big_int(mtime_ns),
                    record.uid,
                    record.gid,
                    row_id,
                    record.linkname.encode("utf-8", "surrogateescape") if record.linkname else b"",
                    record.offset_header,
                    record.offset_data,
                    None if record.sparse is None else pack_sparse(record.sparse),
                    record.rdev,
                    int(is_hardlink),
                    source,
                )
            )
            if len(rows) >= self.BATCH:
                self._flush()
        self._count += 1
        return row_id

    def add_archive_folder(self, record: MemberRecord, source: int, file: MemberRecord) -> int:
        """``add`` for the folder that shows an archive inside the archive (``-r``); ``file``:
        the member as it is stored. The rows added until ``end_archive_folder`` are its members."""
        if record.path in self._ancestors:  # (tar made a folder there for earlier members)
            self._archive_conflict = True
        row_id = self.add(record, source)
        stored_name = None
        if file.path != record.path:  # (--strip-tar-extension)
            stored_name = posixpath.basename(file.path).encode("utf-8", "surrogateescape")
        self._archive_folders[row_id] = _ArchiveFolder(record.path, file.mode, file.size, stored_name)
        return row_id

    @property
    def next_id(self) -> int:
        """The row id the next ``add`` gives."""
        return self._next_id

    def end_archive_folder(self, row_id: int) -> None:
        """The scan of the archive ``add_archive_folder`` added as ``row_id`` is done."""
        folder = self._archive_folders.get(row_id)
        if folder is not None:  # (else discarded)
            folder.end = self._next_id
            self._closed_archives.add(folder.path)
            self._last_parent = ""  # (the next member's folder is looked at again, see ``add``)

    def discard_from(self, row_id: int) -> None:
        """Forget the rows from ``row_id`` on: the folder ``add_archive_folder`` added as
        ``row_id`` and what was found in it, with their nested archives and seek points
        (``<backend>@<row id>``)."""
        path = self._archive_folders[row_id].path
        self._flush()
        conn = self._conn
        conn.execute("DELETE FROM files WHERE id >= ?", (row_id,))
        conn.execute("DELETE FROM nested_archives WHERE id >= ?", (row_id,))
        for (backend,) in conn.execute("SELECT DISTINCT backend FROM seek_points WHERE backend LIKE '%@%'").fetchall():
            if int(backend.rpartition("@")[2]) >= row_id:
                conn.execute("DELETE FROM seek_points WHERE backend = ?", (backend,))
        self._archive_folders = {i: folder for i, folder in self._archive_folders.items() if i < row_id}
        self._closed_archives = {folder.path for folder in self._archive_folders.values() if folder.end}
        below = path + "/"
        self._explicit_dirs = {p for p in self._explicit_dirs if p != path and not p.startswith(below)}
        self._ancestors = {p for p in self._ancestors if p != path and not p.startswith(below)}
        self._parents_only = [(i, parent) for i, parent in self._parents_only if i < row_id]
        self._last_parent = ""

    def _flush(self) -> None:
        if self._simple_batch:
            self._conn.executemany(
                "INSERT INTO files (id, parent, name, kind, mode, size, mtime_ns, uid, gid, ino, "
                "offset_header, offset_data) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                self._simple_batch,
            )
            self._simple_batch.clear()
        if self._batch:
            self._conn.executemany(
                "INSERT INTO files (id, parent, name, kind, mode, size, mtime_ns, uid, gid, ino, linkname, "
                "offset_header, offset_data, sparse, rdev, is_hardlink, source) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                self._batch,
            )
            self._batch.clear()

    def set_metadata(self, key: str, value: str) -> None:
        """Recorded with the others on ``commit``."""
        self._meta[key] = value

    def add_nested_archive(self, row_id: int, offset: int, size: int, fmt: str) -> None:
        self._conn.execute(
            "INSERT OR REPLACE INTO nested_archives (id, offset, size, format) VALUES (?, ?, ?, ?)",
            (row_id, offset, size, fmt),
        )

    def put_seek_points(self, backend: str, parts: Iterable[bytes]) -> None:
        self._conn.execute("DELETE FROM seek_points WHERE backend = ?", (backend,))
        self._conn.executemany(
            "INSERT INTO seek_points (backend, part, data) VALUES (?, ?, ?)",
            ((backend, i, blob) for i, blob in enumerate(parts)),
        )

    # --- finishing ----------------------------------------------------------------------------
    def commit(self, implicit_dir_mtime_ns: int, implicit_uid: int, implicit_gid: int) -> None:
        self._flush()
        conn = self._conn
        script = "\n".join(line for line in _sql("finalize.sql").splitlines() if not line.lstrip().startswith("--"))
        for statement in script.split(";"):
            if statement.strip():
                conn.execute(statement)
        implicit = self._implicit_dirs()  # (None: one of them is a file, link or device)
        # Any path twice (members appended again)? Asked of the index rather than remembered
        # during the scan: a set of every path costs ~100 bytes a member of peak memory, the
        # query a few milliseconds per 100,000 rows. A path that is a folder in one member and
        # not in another, or a file where a folder is implied, needs the extraction replayed.
        duplicates = None
        if implicit is not None:  # (the implicit folders' names have no row: no duplicates)
            duplicates = conn.execute(
                "SELECT MIN(kind = 'd') = MAX(kind = 'd') FROM files GROUP BY parent, name HAVING COUNT(*) > 1 "
                "ORDER BY 1 LIMIT 1"
            ).fetchone()  # (sorted: a conflict first)
        conflicts = (
            implicit is None
            or (duplicates is not None and not duplicates[0])
            or self._inner_archive_conflicts(duplicates is not None)
        )
        if conflicts or (self._has_hardlinks and not self._resolve_hardlinks()):
            self._replay_extraction(conflicts, implicit_dir_mtime_ns, implicit_uid, implicit_gid)  # (hard links too)
        else:
            self._insert_implicit_dirs(implicit or [], implicit_dir_mtime_ns, implicit_uid, implicit_gid)
            if duplicates is not None:  # else every row is the latest one
                self._mark_overwritten()
        if self._has_hardlinks:
            self._count_hardlinks()
        self._count_dir_links()
        self._pack_listings()
        totals = "SELECT COALESCE(SUM(size), 0), COUNT(*) FROM files WHERE latest = 1"
        total_size, entries = conn.execute(totals).fetchone()
        meta = {
            **self._meta,
            "format_version": FORMAT_VERSION,
            "archive_size": str(self._stats.size),
            "archive_mtime_ns": str(self._stats.mtime_ns),
            "archive_fingerprint": self._stats.fingerprint,
            "members": str(self._count),
            "total_size": str(total_size),
            "entries": str(entries),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        conn.executemany("INSERT OR REPLACE INTO metadata (key, value) VALUES (?, ?)", meta.items())
        conn.execute("COMMIT")
        conn.execute("PRAGMA journal_mode=DELETE")
        conn.close()
        os.chmod(self.temp_path, 0o644)
        st = os.stat(self.temp_path)
        self.identity = (st.st_dev, st.st_ino)  # (renamed into place, it may be replaced at once)
        os.replace(self.temp_path, self.final_path)
        self._remove_temporary.detach()
        stale.unregister(self.temp_path)
        self._committed = True

    def abort(self) -> None:
        try:
            self._conn.close()
        except (sqlite3.Error, AttributeError):  # (AttributeError: interrupted before connecting)
            pass
        try:
            st = os.statvfs(os.path.dirname(self.temp_path))
            self.free_at_abort = st.f_bavail * st.f_frsize
        except OSError:
            pass
        self._remove_temporary()

    def _implicit_dirs(self) -> Optional[List[Tuple[bytes, bytes]]]:
        """(parent, name) of the folders implied by members below them that have no member of
        their own, or None when a file, link or device has one of their names."""
        query = "SELECT kind FROM files WHERE parent = ? AND name = ?"
        made = []
        for path in sorted(self._ancestors - self._explicit_dirs):
            parent, name = split_path(path)
            kinds = {row[0] for row in self._conn.execute(query, (parent, name))}
            if kinds - {KIND_DIR}:
                return None
            if not kinds:
                made.append((parent, name))
        return made

    def _insert_implicit_dirs(self, paths: Iterable[Tuple[bytes, bytes]], mtime_ns: int, uid: int, gid: int) -> None:
        rows = []
        for parent, name in paths:
            row_id = self._next_id
            self._next_id += 1
            rows.append((row_id, parent, name, "d", 0o40755, 0, mtime_ns, uid, gid, row_id, IMPLICIT, 0))
        self._conn.executemany(
            "INSERT INTO files (id, parent, name, kind, mode, size, mtime_ns, uid, gid, ino, offset_header, "
            "offset_data) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            rows,
        )

    def _inner_archive_conflicts(self, duplicates: bool) -> bool:
        """Whether an inner archive's folder shares its name with another member (a newer copy
        of the archive, a folder; only asked when some name is ``duplicates``), or its own name
        does when the folder has another, or a member not its own is below it: tar -x sees a
        file there, so only a replay tells what stays."""
        if not self._archive_folders:
            return False
        if duplicates:
            rows = self._conn.execute(
                "SELECT id FROM files WHERE (parent, name) IN "
                "(SELECT parent, name FROM files GROUP BY parent, name HAVING COUNT(*) > 1)"
            )
            if any(row_id in self._archive_folders for (row_id,) in rows):
                return True
        if self._archive_conflict:
            return True
        taken = "SELECT 1 FROM files WHERE parent = ? AND name = ? LIMIT 1"
        for folder in self._archive_folders.values():
            if folder.stored_name is not None:
                parent = encode(folder.path.rpartition("/")[0] or "/")
                stored = join_path(parent, folder.stored_name).decode("utf-8", "surrogateescape")
                if stored in self._ancestors or self._conn.execute(taken, (parent, folder.stored_name)).fetchone():
                    return True
        return False

    def _replay_extraction(self, conflicts: bool, mtime_ns: int, uid: int, gid: int) -> None:
        """Folders and other members share a name (``conflicts``), or a hard link is not simply
        a copy of an earlier member: mark what ``tar -x`` leaves in place as the latest rows, make
        the folders it would make, and give hard links their targets' data, or leave them out
        (``extraction_order.py``)."""
        conn = self._conn
        if conflicts:
            logger.warning(
                "%s: some names are folders in one member and files, links or devices in another; "
                "showing what tar -x leaves in place",
                self._meta.get("archive_path", "the archive"),
            )
        rows = conn.execute("SELECT id, parent, name, kind, is_hardlink, linkname FROM files ORDER BY id")
        archives = self._archive_folders
        members = (
            (
                i, parent, name, kind == KIND_DIR, archives[i].end if i in archives else 0,
                linkname if kind == KIND_SYMLINK else None, linkname if is_hardlink else None,
            )
            for i, parent, name, kind, is_hardlink, linkname in rows
        )  # fmt: skip
        parents_only = ((i, parent, None, False, 0, None, None) for i, parent in self._parents_only)
        replayed = extraction_order.replay(
            heapq.merge(members, parents_only, key=lambda row: row[0]),
            {i: folder.stored_name for i, folder in archives.items() if folder.stored_name is not None},
        )  # fmt: skip
        if self._has_hardlinks:
            failed = []
            for row_id, parent, name, linkname in conn.execute(
                "SELECT id, parent, name, linkname FROM files WHERE is_hardlink = 1"
            ).fetchall():
                if row_id not in replayed.links:
                    logger.warning(
                        "Hard link %s to %s cannot be made where tar -x makes it; leaving it out",
                        join_path(parent, name).decode("utf-8", "backslashreplace"),
                        linkname.decode("utf-8", "backslashreplace"),
                    )
                    failed.append((row_id,))
            conn.executemany("DELETE FROM files WHERE id = ?", failed)
            to_archives = {link: target for link, target in replayed.links.items() if target in self._archive_folders}
            self._copy_targets((link, target) for link, target in replayed.links.items() if link not in to_archives)
            # A link to an inner archive is another name of its file: shown as that file (its
            # own inode: the folder's is a folder's).
            conn.executemany(
                "UPDATE files SET (kind, mode, size, mtime_ns, uid, gid, offset_data, linkname, sparse, rdev) = "
                "(SELECT 'f', ?, ?, mtime_ns, uid, gid, offset_data, '', NULL, 0 FROM files WHERE id = ?) WHERE id = ?",
                ((archives[target].mode, archives[target].size, target, link) for link, target in to_archives.items()),
            )
        conn.execute("UPDATE files SET latest = 0")
        conn.executemany("UPDATE files SET latest = 1 WHERE id = ?", ((row_id,) for row_id in sorted(replayed.kept)))
        self._insert_implicit_dirs(map(parent_and_name, replayed.made), mtime_ns, uid, gid)

    def _mark_overwritten(self) -> None:
        self._conn.execute(
            "UPDATE files SET latest = 0 WHERE id IN ("
            " SELECT f.id FROM files f JOIN ("
            "  SELECT parent, name, MAX(id) AS newest FROM files GROUP BY parent, name HAVING COUNT(*) > 1"
            " ) d ON f.parent = d.parent AND f.name = d.name AND f.id < d.newest)"
        )

    def _copy_targets(self, links: Iterable[Tuple[int, int]]) -> None:
        """Give each hard link (link id, target id) its target's data, metadata and inode."""
        self._conn.executemany(
            "UPDATE files SET (kind, mode, size, mtime_ns, uid, gid, ino, linkname, offset_data, sparse, rdev) = "
            "(SELECT kind, mode, size, mtime_ns, uid, gid, ino, linkname, offset_data, sparse, rdev "
            "FROM files WHERE id = ?) WHERE id = ?",
            ((target, link) for link, target in links),
        )

    def _resolve_hardlinks(self) -> bool:
        """Give each hard link its target's data, metadata and inode, in an archive whose names
        keep one type: the target is the newest member of that name *before* the link, as GNU
        tar extracts it. False, with nothing changed, when a link's target is not such a member
        or is a folder: then only a replay of the extraction tells what tar makes of it."""
        conn = self._conn
        links = conn.execute("SELECT id, linkname FROM files WHERE is_hardlink = 1 ORDER BY id").fetchall()
        query = (
            "SELECT id, kind, mode, size, mtime_ns, uid, gid, ino, linkname, offset_data, sparse, rdev "
            "FROM files WHERE parent = ? AND name = ? AND id < ? ORDER BY id DESC LIMIT 1"
        )
        resolved: Dict[int, Tuple[Any, ...]] = {}
        archive_end = _archive_ends(self._archive_folders)
        for row_id, linkname in links:
            row = conn.execute(query, (*split_path(linkname.decode("utf-8", "surrogateescape")), row_id)).fetchone()
            if row is None:
                return False
            end = archive_end(row[0])
            if end is not None and end <= row_id:  # a member of an inner archive, a file by then
                return False
            target = resolved.get(row[0], row[1:])  # (a link to an earlier link: that link's target)
            if target[0] == KIND_DIR:
                return False
            resolved[row_id] = target
        conn.executemany(
            "UPDATE files SET kind=?, mode=?, size=?, mtime_ns=?, uid=?, gid=?, ino=?, linkname=?, "
            "offset_data=?, sparse=?, rdev=? WHERE id = ?",
            ((*target, row_id) for row_id, target in resolved.items()),
        )
        return True

    def _count_hardlinks(self) -> None:
        conn = self._conn
        conn.execute("CREATE INDEX files_by_ino ON files (ino)")
        conn.execute(
            "UPDATE files SET nlink = (SELECT COUNT(*) FROM files f2 WHERE f2.ino = files.ino AND f2.latest = 1) "
            "WHERE ino IN (SELECT ino FROM files WHERE is_hardlink = 1)"
        )
        conn.execute("DROP INDEX files_by_ino")

    def _pack_listings(self) -> None:
        """Each folder of files stored as its listing's records (``dirents.py``)."""
        conn = self._conn
        rows = conn.execute(
            "SELECT parent, name, mode, ino + 1 FROM files WHERE latest = 1 AND name != x'' ORDER BY parent, name, id"
        )
        packed = dirents.pack_all(rows)
        while True:
            batch = list(itertools.islice(packed, 1000))
            if not batch:
                return
            conn.executemany("INSERT INTO dirents (parent, entries, records) VALUES (?, ?, ?)", batch)

    def _count_dir_links(self) -> None:
        conn = self._conn
        folders = conn.execute("SELECT id, parent, name, latest FROM files WHERE kind = 'd'").fetchall()
        subdirs: Dict[bytes, int] = collections.Counter(parent for _, parent, _, latest in folders if latest)
        updates = []
        for row_id, parent, name, _ in folders:
            path = b"/" if not name else (parent.rstrip(b"/") + b"/" + name)
            updates.append((2 + subdirs.get(path, 0), row_id))
        conn.executemany("UPDATE files SET nlink = ? WHERE id = ?", updates)
        root_subdirs = subdirs.get(b"/", 0)
        conn.execute("INSERT OR REPLACE INTO metadata (key, value) VALUES ('root_nlink', ?)", (str(2 + root_subdirs),))


class IndexReader:
    """Read-only access to a built index through a ``ConnectionPool`` (safe from any thread)."""

    def __init__(self, path: str, identity: Optional[Tuple[int, int]] = None) -> None:
        self.path = path
        self._pool = ConnectionPool(path, identity)
        self._query = self._pool.query
        try:
            self.metadata: Dict[str, str] = dict(self._query("SELECT key, value FROM metadata"))
            self._query("SELECT id FROM files LIMIT 1")
        except sqlite3.DatabaseError as exc:
            self.close()
            raise InvalidIndexError(f"{path} is not a valid ratarmount index ({exc})") from None

    @property
    def connection_count(self) -> int:
        return self._pool.connection_count

    @property
    def identity(self) -> Optional[Tuple[int, int]]:
        """The (device, inode) of the file read."""
        return self._pool.identity

    def renewed(self) -> "IndexReader":
        """A reader of the same file with connections of its own (for a forked child)."""
        return IndexReader(self.path, self._pool.identity)

    def close(self) -> None:
        self._pool.close()

    def validate(self, stats: ArchiveStats) -> None:
        """Raise StaleIndexError if this index does not describe the archive as it is now."""
        meta = self.metadata
        if meta.get("format_version") != FORMAT_VERSION:
            raise StaleIndexError(
                f"index format version {meta.get('format_version')!r} differs from {FORMAT_VERSION!r}"
            )
        try:
            stored = ArchiveStats(
                size=int(meta["archive_size"]),
                mtime_ns=int(meta["archive_mtime_ns"]),
                fingerprint=meta["archive_fingerprint"],
            )
        except (KeyError, ValueError):
            raise StaleIndexError("index lacks the archive's identity") from None
        reason = stats.differences(stored)
        if reason:
            raise StaleIndexError(reason)

    def check_options(self, expected: Dict[str, str]) -> None:
        for key, value in expected.items():
            stored = self.metadata.get(key, OPTION_DEFAULTS.get(key))
            if stored == value:
                continue
            single = self.metadata.get("layout") == "single_file"
            no_inner = single or self.metadata.get("inner_archives") == "0"
            if key == "recursive" and (single or ((stored, value) == ("1", "0") and no_inner)):
                continue  # one compressed file, or no member was an archive: the same rows either way
            if key == "inner_archive_rules" and no_inner and self._compressed_rules_apply(stored):
                continue  # no archive shown as a folder, none left as a file: no rules applied
            if key == "strip_tar_extension" and no_inner:
                continue  # no archive shown as a folder: no name to strip
            raise OtherOptionsIndexError(option_difference(key, stored, value))

    def _compressed_rules_apply(self, stored: Optional[str]) -> bool:
        """Whether an index by inner-archive rules ``stored`` shows what the current rules show
        when it has no inner archive: always for an uncompressed archive; for a compressed one
        only from the rules on that look into compressed archives inside it."""
        if self.metadata.get("format", "tar") in ("tar", "", None) or self.metadata.get("layout") == "single_file":
            return True
        try:
            return int(stored or "1") >= COMPRESSED_IN_COMPRESSED_RULES
        except ValueError:
            return False

    # --- queries ------------------------------------------------------------------------------
    def lookup(self, parent: bytes, name: bytes) -> Optional[Row]:
        return self._query(  # type: ignore[no-any-return]
            f"SELECT {ROW_COLUMNS} FROM files WHERE parent = ? AND name = ? AND latest = 1 ORDER BY id DESC LIMIT 1",
            (parent, name),
            one=True,
        )

    def is_implicit(self, parent: bytes, name: bytes) -> bool:
        """Whether the folder ``parent``/``name`` is only implied by member paths."""
        row = self._query(
            "SELECT offset_header = ? FROM files WHERE parent = ? AND name = ? AND latest = 1 ORDER BY id DESC LIMIT 1",
            (IMPLICIT, parent, name),
            one=True,
        )
        return bool(row and row[0])

    def data_end(self) -> int:
        """Where the archive's own members end (the data of the last, or its header): what
        ``tar -r`` leaves as it was. A scan of the table, asked only once the archive changed."""
        row = self._query(
            "SELECT MAX(offset_header + 512), MAX(offset_data + CASE WHEN sparse IS NULL THEN size ELSE 0 END) "
            "FROM files WHERE source = 0 AND offset_header >= 0 AND is_hardlink = 0",
            (),
            one=True,
        )
        return max((value for value in row or () if value is not None), default=0)

    def row(self, row_id: int) -> Optional[Row]:
        return self._query(f"SELECT {ROW_COLUMNS} FROM files WHERE id = ?", (row_id,), one=True)  # type: ignore[no-any-return]

    def versions(self, parent: bytes, name: bytes) -> List[Row]:
        """The members named ``parent``/``name``, oldest first (not a folder tar made for the
        members below it: no member, and made before the members the replay numbers it after)."""
        return self._query(  # type: ignore[no-any-return]
            f"SELECT {ROW_COLUMNS} FROM files WHERE parent = ? AND name = ? AND offset_header != ? ORDER BY id",
            (parent, name, IMPLICIT),
        )

    def list(self, parent: bytes, limit: int = -1) -> List[Row]:
        """Rows of a folder's entries in (name, id) order; at most ``limit`` of them (-1: all)."""
        return self._query(  # type: ignore[no-any-return]
            f"SELECT {ROW_COLUMNS} FROM files WHERE parent = ? AND latest = 1 ORDER BY name, id LIMIT ?",
            (parent, limit),
        )

    def list_stats(self, parent: bytes) -> List[Tuple[Any, ...]]:
        """``list``'s rows cut to what a listing with attributes needs: name, mode, size,
        mtime_ns, uid, gid, nlink, ino (+1: the archive's numbering, 1 is the root), rdev,
        st_blocks (``BLOCKS_SQL``: ``plain_rows`` makes them ``StatRow``s).
        Half the time of ``list`` for a folder of 100 files (fewer columns to copy)."""
        return self._query(LIST_STATS_SQL, (parent,))  # type: ignore[no-any-return]

    def list_stats_after(self, parent: bytes, after: bytes, limit: int) -> List[Tuple[Any, ...]]:
        """``list_stats`` from the first name after ``after`` on (b"": from the first), at most
        ``limit`` rows."""
        return self._query(LIST_STATS_AFTER_SQL, (parent, after, limit))  # type: ignore[no-any-return]

    def dirents(self, parent: bytes) -> Optional[Tuple[int, bytes]]:
        """(entries, stored records) of the packed listing of folder ``parent``, if it has one."""
        row = self._query("SELECT entries, records FROM dirents WHERE parent = ?", (parent,), one=True)
        return None if row is None else (int(row[0]), bytes(row[1]))

    def list_names_after(self, parent: bytes, after: bytes, limit: int) -> List[Tuple[bytes, int, int]]:
        """``list_stats_after`` with (name, mode, ino) only."""
        return self._query(LIST_NAMES_AFTER_SQL, (parent, after, limit))  # type: ignore[no-any-return]

    def nested_archive(self, row_id: int) -> Tuple[int, int, str, int]:
        """(offset, size, format, source) of the compressed archive shown as folder ``row_id``:
        it lies at ``offset`` of the stream of ``source`` (0: the archive itself, else the row
        id of the compressed archive that holds it)."""
        row = self._query(
            "SELECT n.offset, n.size, n.format, f.source FROM nested_archives AS n JOIN files AS f ON f.id = n.id "
            "WHERE n.id = ?",
            (row_id,),
            one=True,
        )
        if row is None:
            raise InvalidIndexError(f"{self.path}: no nested archive with id {row_id}")
        return int(row[0]), int(row[1]), str(row[2]), int(row[3])

    def nested_bytes(self) -> int:
        """The compressed bytes of the compressed archives that lie in the archive's own stream
        (not inside an inner archive)."""
        row = self._query(
            "SELECT COALESCE(SUM(n.size), 0) FROM nested_archives AS n JOIN files AS f ON f.id = n.id "
            "WHERE f.source = 0",
            (),
            one=True,
        )
        return int(row[0]) if row else 0

    def seek_point_parts(self, backend: str) -> List[bytes]:
        rows = self._query("SELECT data FROM seek_points WHERE backend = ? ORDER BY part", (backend,))
        return [row[0] for row in rows]


def _archive_ends(folders: Dict[int, "_ArchiveFolder"]) -> Callable[[int], Optional[int]]:
    """For a row id, the end of the innermost inner archive that holds it (None: none)."""
    starts = sorted(folders)
    ends = [folders[start].end for start in starts]
    enclosing: List[int] = []  # (the inner archives nest: the one each is in, or -1)
    open_ones: List[int] = []
    for i, start in enumerate(starts):
        while open_ones and ends[open_ones[-1]] <= start:
            open_ones.pop()
        enclosing.append(open_ones[-1] if open_ones else -1)
        open_ones.append(i)

    def end_of(row_id: int) -> Optional[int]:
        i = bisect.bisect_left(starts, row_id) - 1  # the last archive that starts before the row
        while i >= 0 and ends[i] <= row_id:
            i = enclosing[i]
        return ends[i] if i >= 0 else None

    return end_of


@dataclass
class _ArchiveFolder:
    """A folder that stands for an archive inside the archive (``-r``)."""

    path: str
    #: The member's own mode and size (a hard link to it is a link to the file to tar -x).
    mode: int
    size: int
    #: The member's own name when the folder has another (``--strip-tar-extension``), else None.
    stored_name: Optional[bytes]
    #: The id after the rows of its members (set when its scan is done).
    end: int = 0


def _is_in(path: str, folders: Set[str]) -> bool:
    """Whether ``path`` is one of ``folders`` or below one."""
    while path not in folders:
        if path == "/":
            return False
        path = path.rpartition("/")[0] or "/"
    return True

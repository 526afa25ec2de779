"""A compressed file that is not a tar (``data.csv.gz``): mounted as one file, ``/data.csv``.

The index holds one row for that file (decompressed size, the archive's permissions, mtime and
owner) plus the decompressor's seek points, so a second mount knows the size without
decompressing anything.
"""

from __future__ import annotations

import logging
import os
import stat
from typing import Callable, Dict, Iterable, Mapping, Optional, Tuple

from ..compression.base import CompressedReader
from ..errors import InvalidIndexError, NotFoundError
from ..index.builder import open_or_build
from ..index.fingerprint import ArchiveStats
from ..index.sqlite_index import IndexReader, IndexWriter
from ..io import forks
from ..io.readers import MemberFile, RandomAccessReader
from ..options import OpenOptions
from ..tar.scanner import KIND_FILE, MemberRecord
from .base import FileInfo, MountSource
from .renewal import RenewedAfterFork, RenewReader
from .watch import ArchiveWatch

logger = logging.getLogger(__name__)

#: Extensions removed to name the decompressed file; tar-like short forms become ".tar".
_SUFFIXES: Dict[str, str] = {
    ".gz": "",
    ".gzip": "",
    ".z": "",
    ".bz2": "",
    ".bzip2": "",
    ".bz": "",
    ".zst": "",
    ".zstd": "",
    ".xz": "",
    ".tgz": ".tar",
    ".taz": ".tar",
    ".tbz": ".tar",
    ".tbz2": ".tar",
    ".tb2": ".tar",
    ".tzst": ".tar",
    ".txz": ".tar",
}


def decompressed_name(archive_path: str) -> str:
    """``/x/data.csv.gz`` -> ``data.csv``; a name without a known extension is kept as is."""
    base = os.path.basename(archive_path.rstrip("/")) or "data"
    stem, ext = os.path.splitext(base)
    replacement = _SUFFIXES.get(ext.lower())
    if replacement is None or not stem:
        return base
    return stem + replacement


def single_file_record(
    name: str, size: int, archive_mode: int, stats: ArchiveStats, owner: Tuple[int, int]
) -> MemberRecord:
    """The one index row of a single-file archive."""
    return MemberRecord(
        path="/" + name,
        kind=KIND_FILE,
        mode=stat.S_IFREG | (archive_mode & 0o7777),
        size=size,
        mtime_ns=stats.mtime_ns,
        uid=owner[0],
        gid=owner[1],
        linkname="",
        offset_header=0,
        offset_data=0,
    )


class SingleFileSource(RenewedAfterFork, MountSource):
    """A root folder holding one file: the decompressed content."""

    def __init__(
        self,
        path: str,
        reader: CompressedReader,
        index: IndexReader,
        info: FileInfo,
        name: str,
        watch: Optional[ArchiveWatch] = None,
        renew: Optional[RenewReader] = None,
    ) -> None:
        self.path = path
        self.name = name
        self._generation = forks.generation
        self._renew_reader = renew
        self._setup(reader, index, watch)
        self._info = info
        self._root = FileInfo(
            mode=stat.S_IFDIR | 0o755, size=0, mtime_ns=info.mtime_ns, uid=info.uid, gid=info.gid, nlink=2, ino=1
        )

    def _setup(self, reader: RandomAccessReader, index: IndexReader, watch: Optional[ArchiveWatch]) -> None:
        self._reader = reader
        self._index = index
        self._watch = watch
        self._guard: Optional[Callable[[], None]] = watch.check if watch is not None else None

    @property
    def index_path(self) -> str:
        return self._index.path

    def lookup(self, path: str) -> Optional[FileInfo]:
        if path == "/":
            return self._root
        if path == "/" + self.name:
            return self._info
        return None

    def list_entries(self, path: str) -> Optional[Iterable[Tuple[str, FileInfo]]]:
        return [(self.name, self._info)] if path == "/" else None

    def by_ino(self, ino: int) -> Optional[Tuple[str, FileInfo]]:
        return ("/" + self.name, self._info) if ino > 1 and ino == self._info.ino else None

    def open_info(self, info: FileInfo) -> MemberFile:
        if info is not self._info and info != self._info:
            raise NotFoundError(2, "not a file of this archive")
        if self._generation != forks.generation:
            self._renew()
        if self._guard is not None:
            self._guard()
        return MemberFile(
            self._reader, 0, self._info.size, name=self.name, guard=self._guard, renew=self._reader_after_fork
        )

    def _reader_after_fork(self) -> Tuple[RandomAccessReader, Optional[Callable[[], None]]]:
        if self._generation != forks.generation:
            self._renew()
        return self._reader, self._guard

    def statfs(self) -> Dict[str, int]:
        return {
            "f_bsize": 4096,
            "f_frsize": 4096,
            "f_blocks": (self._info.size + 4095) // 4096,
            "f_bfree": 0,
            "f_bavail": 0,
            "f_files": 1,
            "f_ffree": 0,
            "f_favail": 0,
            "f_namemax": 255,
        }


def open_single_file(
    path: str,
    reader: CompressedReader,
    stats: ArchiveStats,
    owner: Tuple[int, int],
    options: OpenOptions,
    build_options: Dict[str, str],
    archive_mode: int,
    watch: Optional[ArchiveWatch] = None,
    renew: Optional[RenewReader] = None,
    failed: Mapping[str, str] = {},
    found: Optional[Tuple[str, IndexReader]] = None,
) -> SingleFileSource:
    """Index (first time: decompress once to learn the size and seek points) and open."""
    from .archive import row_to_info

    name = decompressed_name(path)

    def build(writer: IndexWriter) -> None:
        with reader.explained_failures():
            reader.export_seek_points(writer)  # the first pass: verifies the stream, learns its size
            # The head that made this a single file was decoded without the checks at a frame's
            # end (zstd, xz), which skips frames that check themselves: a damaged first frame
            # may have turned a tar header into other bytes. Read it again, checked.
            reader.pread(0, 512)
        writer.add(single_file_record(name, reader.size, archive_mode, stats, owner))

    index = open_or_build(path, stats, options.index, build_options, build, owner, failed, found)
    try:
        reader.import_seek_points(index)
        rows = [row for row in index.list(b"/") if row[2]]
        if len(rows) != 1:
            raise InvalidIndexError(f"{index.path} does not describe {path} as a single file")
        info = row_to_info(rows[0])
    except BaseException:
        index.close()
        raise
    return SingleFileSource(path, reader, index, info, name, watch, renew)

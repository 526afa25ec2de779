"""A tar archive (plain or compressed) served through its persistent SQLite index."""

from __future__ import annotations

import functools
import logging
import os
import stat
import threading
from typing import Callable, Dict, Iterable, List, Mapping, NamedTuple, Optional, Tuple

from ..compression.base import CompressedReader
from ..compression.expected import METADATA_KEY, ExpectedStreams, parse_sizes
from ..errors import (
    ArchiveError,
    IndexLocationFailedError,
    InvalidIndexError,
    NotFoundError,
    RatarmountError,
    UnsupportedFormatError,
)
from ..formats import FormatId
from ..index import dirents
from ..index.builder import first_valid, open_or_build
from ..index.dirents import DirentBlock
from ..index.fingerprint import archive_stats
from ..index.folder_rows import FolderRows
from ..index.paths import join_path
from ..index.sqlite_index import (
    IndexReader,
    IndexWriter,
    Row,
    decode_int,
    encode,
    plain_rows,
    scan_options,
    sparse_blocks,
    split_path,
    unpack_sparse,
)
from ..io import forks
from ..io.holes import Extents
from ..io.readers import MemberFile, PlainFileReader, RandomAccessReader, StreamWindow, preadinto, will_need
from ..options import CompressionOptions, OpenOptions
from ..tar.indexing import NamespacedSeekPoints, index_tar, open_nested_compressed
from ..tar.sample import tell_member_size
from ..tar.scanner import KIND_DIR
from .base import VERSIONS_SUFFIX, FileInfo, MountSource, NameRow, StatRow
from .renewal import RenewedAfterFork, RenewReader
from .watch import ArchiveWatch

logger = logging.getLogger(__name__)

#: How much of a file ``will_read`` asks the kernel to fetch ahead (the start of a large one).
WILL_READ_BYTES = 512 * 1024


class ArchiveLocator(NamedTuple):
    offset: int
    sparse: Optional[bytes]
    #: 0, or the row id of the compressed inner archive whose decompressed stream holds the data
    source: int = 0


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


_new_tuple = tuple.__new__
# row_to_info builds both tuples positionally: their fields must stay in this order.
assert FileInfo._fields == (
    "mode", "size", "mtime_ns", "uid", "gid", "nlink", "ino", "linkname", "rdev", "locator", "blocks"
)  # fmt: skip
assert ArchiveLocator._fields == ("offset", "sparse", "source")


def row_to_info(row: Row) -> FileInfo:
    """The FileInfo of an index row. Listings make one per entry, so the tuples are built
    positionally (``tuple.__new__``: 0.4 instead of 1.1 us per row); the field order is
    FileInfo's and ArchiveLocator's."""
    (_id, _parent, _name, _kind, mode, size, mtime_ns, uid, gid, nlink, ino, linkname, offset, sparse, rdev, src) = row
    return _new_tuple(  # type: ignore[no-any-return]
        FileInfo,
        (
            mode,
            size,
            mtime_ns if mtime_ns.__class__ is int else decode_int(mtime_ns),
            uid,
            gid,
            nlink,
            ino + 1,  # inode 1 is the root
            _decode(linkname) if linkname else "",
            rdev,
            _new_tuple(ArchiveLocator, (offset, sparse, src)),
            None if sparse is None else sparse_blocks(sparse),
        ),
    )


def _version_info(row: Row) -> FileInfo:
    """``PATH.versions/N``: the member's own row. A folder version is shown empty (its members are
    the current folder's), so it has no inode number of its own (``by_ino`` of the row's number
    names the current folder)."""
    info = row_to_info(row)
    return info._replace(ino=0) if info.is_dir else info


#: The share of a compressed archive's stream that compressed archives in it hold from which
#: its reader is told that it serves them (``CompressedReader.serves_nested``).
TRANSIT_SHARE = 0.9


class ArchiveSource(RenewedAfterFork, MountSource):
    """Members of one archive. Lookups are indexed SQLite queries (one connection per thread);
    reads go through the shared, thread-safe ``RandomAccessReader``.

    Used after a fork (a DataLoader's workers), it first makes its reader, index connections and
    locks anew from the open archive (``_renew``); see ``io/forks.py``."""

    def __init__(
        self,
        path: str,
        reader: RandomAccessReader,
        index: IndexReader,
        owner: Tuple[int, int],
        compression: Optional[CompressionOptions] = None,
        watch: Optional[ArchiveWatch] = None,
        renew: Optional[RenewReader] = None,
    ) -> None:
        self.path = path
        self._generation = forks.generation
        self._renew_reader = renew
        self._setup(reader, index, watch)
        self._compression = compression or CompressionOptions()
        meta = index.metadata
        mtime_ns = int(meta.get("archive_mtime_ns", "0"))
        self._root = FileInfo(
            mode=stat.S_IFDIR | 0o755,
            size=0,
            mtime_ns=mtime_ns,
            uid=owner[0],
            gid=owner[1],
            nlink=int(meta.get("root_nlink", "2")),
            ino=1,
        )
        self._entries = int(meta.get("entries", "0"))
        self._total_size = int(meta.get("total_size", "0"))

    def _setup(self, reader: RandomAccessReader, index: IndexReader, watch: Optional[ArchiveWatch]) -> None:
        """What a forked child makes anew (everything that holds threads, locks or connections)."""
        self._reader = reader
        self._index = index
        self._watch = watch
        self._guard: Optional[Callable[[], None]] = watch.check if watch is not None else None
        self._nested: Dict[int, RandomAccessReader] = {}
        self._nested_lock = threading.Lock()
        #: The inner compressed archives' streams, counted by the caches before they are opened.
        self._expected = ExpectedStreams(parse_sizes(index.metadata.get(METADATA_KEY)))
        self._folder_rows = FolderRows(index.list, max_rows=4096)
        if isinstance(reader, CompressedReader) and index.metadata.get("inner_archives", "0") != "0":
            nested = index.nested_bytes()
            if nested and nested >= TRANSIT_SHARE * reader.size:
                reader.serves_nested()

    def _parent_objects(self) -> Tuple[object, ...]:
        return (self._reader, self._index, self._watch, self._nested, self._expected, self._folder_rows)

    @property
    def index_path(self) -> str:
        return self._index.path

    # --- primitives ---------------------------------------------------------------------------
    def lookup(self, path: str) -> Optional[FileInfo]:
        if self._generation != forks.generation:
            self._renew()
        parent, name = split_path(path)
        folder = self._folder_rows.rows(parent)
        row = folder.get(name) if folder is not None else self._index.lookup(parent, name)
        if row is not None:
            info = row_to_info(row)
            if path == "/":  # the archive's own "./" entry: keep its metadata, but it is the root
                return FileInfo(
                    mode=info.mode,
                    size=0,
                    mtime_ns=info.mtime_ns,
                    uid=info.uid,
                    gid=info.gid,
                    nlink=self._root.nlink,
                    ino=1,
                )
            return info
        if path == "/":
            return self._root
        return self._lookup_version(parent, name)

    def is_implied(self, path: str, info: FileInfo) -> bool:
        return info.is_dir and path != "/" and self._index.is_implicit(*split_path(path))

    def _lookup_version(self, parent: bytes, name: bytes) -> Optional[FileInfo]:
        """``PATH.versions`` (a folder) and ``PATH.versions/N`` (the N-th member named PATH),
        in a folder the tree shows (not below a file: the kernel never asks there)."""
        if name.endswith(VERSIONS_SUFFIX):
            if not self._is_folder(parent):
                return None
            versions = self._index.versions(parent, name[: -len(VERSIONS_SUFFIX)])
            if not versions:
                return None
            newest = row_to_info(versions[-1])
            return FileInfo(
                mode=stat.S_IFDIR | 0o555,
                size=0,
                mtime_ns=newest.mtime_ns,
                uid=newest.uid,
                gid=newest.gid,
                nlink=2,
                ino=0,
            )
        if name.isdigit() and parent.endswith(VERSIONS_SUFFIX):
            if self._index.lookup(*split_path(_decode(parent))) is not None:
                return None  # a member of that name (a file, or a folder without this entry)
            grand, base = split_path(_decode(parent[: -len(VERSIONS_SUFFIX)]))
            if not self._is_folder(grand):
                return None
            versions = self._index.versions(grand, base)
            number = int(name)
            if 1 <= number <= len(versions) and str(number).encode() == name:
                return _version_info(versions[number - 1])
        return None

    def _is_folder(self, path: bytes) -> bool:
        """Whether ``path`` is the root or a folder the tree shows (no lookup of versions)."""
        if path == b"/":
            return True
        row = self._index.lookup(*split_path(_decode(path)))
        return row is not None and row[3] == KIND_DIR

    def by_ino(self, ino: int) -> Optional[Tuple[str, FileInfo]]:
        if self._generation != forks.generation:
            self._renew()
        # Row ids are inode numbers minus one (a hard link carries its target's: same data).
        row = self._index.row(ino - 1) if ino > 1 else None
        if row is None:
            return None
        parent, name = row[1], row[2]
        if not parent:
            return None  # the archive's own "./" entry is the root (inode 1)
        path = _decode(join_path(parent, name))
        return path, row_to_info(row)

    def list_entries(self, path: str) -> Optional[Iterable[Tuple[str, FileInfo]]]:
        return self.list_entries_upto(path, -1)

    def list_entries_upto(self, path: str, limit: int) -> Optional[List[Tuple[str, FileInfo]]]:
        """``limit`` -1: all of them."""
        info = self.lookup(path)
        if info is None or not info.is_dir:
            return None
        parent, name = split_path(path)
        if info.ino == 0 and name.endswith(VERSIONS_SUFFIX):
            versions = self._index.versions(parent, name[: -len(VERSIONS_SUFFIX)])
            entries = [(str(i + 1), _version_info(row)) for i, row in enumerate(versions)]
        else:  # (one row more: the archive's own "./" row has no name)
            rows = self._index.list(encode(path), limit + 1 if limit >= 0 else -1)
            entries = [(_decode(row[2]), row_to_info(row)) for row in rows if row[2]]
        return entries if limit < 0 else entries[:limit]

    def _plain_folder(self, path: str) -> Optional[bool]:
        """Whether ``path`` is a folder listed from the index's rows (False: a ``PATH.versions``
        folder, listed as ``list_entries_upto`` does; None: no folder). The root needs no
        query (a union lists the root of each of its archives)."""
        if path == "/":
            return True
        info = self.lookup(path)
        if info is None or not info.is_dir:
            return None
        return info.ino != 0

    def list_stat_rows(self, path: str) -> Optional[List[StatRow]]:
        plain = self._plain_folder(path)
        if not plain:
            return None if plain is None else super().list_stat_rows(path)
        return plain_rows(self._index.list_stats(encode(path)))

    def list_stat_rows_after(self, path: str, after: Optional[bytes], limit: int) -> Optional[List[StatRow]]:
        plain = self._plain_folder(path)
        if not plain:
            return None if plain is None else super().list_stat_rows_after(path, after, limit)
        # (b"" sorts before every name; the archive's own "./" row, named b"", is not listed)
        return plain_rows(self._index.list_stats_after(encode(path), after or b"", limit))

    def list_name_rows_after(self, path: str, after: Optional[bytes], limit: int) -> Optional[List[NameRow]]:
        plain = self._plain_folder(path)
        if not plain:
            return None if plain is None else super().list_name_rows_after(path, after, limit)
        return self._index.list_names_after(encode(path), after or b"", limit)

    def list_dirents(self, path: str) -> Optional[DirentBlock]:
        if self._generation != forks.generation:  # (the only method here reading no lookup first)
            self._renew()
        found = self._index.dirents(encode(path))
        return None if found is None else dirents.unpack(*found)

    def open_info(self, info: FileInfo) -> MemberFile:
        locator = info.locator
        if not isinstance(locator, ArchiveLocator):
            raise NotFoundError(2, "not a file of this archive")
        if self._generation != forks.generation:
            self._renew()
        guard = self._guard
        if guard is not None:
            guard()
        reader = self._reader if locator.source == 0 else self._nested_reader(locator.source)
        return MemberFile(
            reader, locator.offset, info.size, unpack_sparse(locator.sparse), guard=guard,
            renew=functools.partial(self._reader_after_fork, locator.source),
        )  # fmt: skip

    def data_extents(self, info: FileInfo) -> Optional[Extents]:
        locator = info.locator
        if not isinstance(locator, ArchiveLocator) or locator.sparse is None:
            return None
        return unpack_sparse(locator.sparse)

    def read_into(self, info: FileInfo, offset: int, view: memoryview) -> int:
        # What ``MemberFile.preadinto`` does, without making (and closing) one for each read: a
        # random open through FUSE is one read of a file the kernel opened without a message.
        locator = info.locator
        if not isinstance(locator, ArchiveLocator) or locator.sparse is not None:
            return super().read_into(info, offset, view)
        if self._generation != forks.generation:
            self._renew()
        guard = self._guard
        if guard is not None:
            guard()
        size = min(len(view), info.size - offset)
        if size <= 0 or offset < 0:
            return 0
        reader = self._reader if locator.source == 0 else self._nested_reader(locator.source)
        count = preadinto(reader, locator.offset + offset, view[:size])
        if count != size:
            raise OSError(f"short read from archive at offset {locator.offset + offset}")
        return count

    def _reader_after_fork(self, source: int) -> Tuple[RandomAccessReader, Optional[Callable[[], None]]]:
        """For a member opened before a fork and read after it: this process's reader."""
        if self._generation != forks.generation:
            self._renew()
        return (self._reader if source == 0 else self._nested_reader(source)), self._guard

    def count_before_reads(self) -> None:
        """The archive's compressed stream competes for the caches of decoded data from now on
        (``CompressedReader.count_before_reads``)."""
        if isinstance(self._reader, CompressedReader):
            self._reader.count_before_reads()

    def will_read(self, info: FileInfo) -> None:
        locator = info.locator
        if self._generation != forks.generation:
            self._renew()
        if isinstance(locator, ArchiveLocator) and locator.source == 0 and locator.sparse is None and info.size:
            will_need(self._reader, locator.offset, min(info.size, WILL_READ_BYTES))

    def _nested_reader(self, row_id: int) -> RandomAccessReader:
        """The decompressor of a compressed archive inside this one, made on first use with its
        seek points from the index: over its bytes in the file, or, inside a compressed stream
        (this archive's or an inner one's), over that stream's decoded bytes."""
        reader = self._nested.get(row_id)
        if reader is not None:
            return reader
        offset, size, fmt, parent = self._index.nested_archive(row_id)
        if parent >= row_id:  # (an archive's rows follow the row of the archive holding it)
            raise InvalidIndexError(f"{self.path}: nested archive {row_id} inside {parent}; rebuild the index")
        outer = self._reader if parent == 0 else self._nested_reader(parent)  # (before the lock)
        with self._nested_lock:
            reader = self._nested.get(row_id)
            if reader is None:
                label = f"{self.path}:#{row_id}"
                seek_points = NamespacedSeekPoints(self._index, row_id)
                backend = None
                if fmt == FormatId.GZIP.value and not self._compression.gzip_backend:
                    # The backend its scan chose (indexed_gzip for one padded with zeros), told by
                    # the seek points it stored: not by the archive's tail again, which inside a
                    # compressed stream would be decoded at the first read of each.
                    padded = bool(seek_points.seek_point_parts("indexed_gzip"))
                    backend = _available("indexed_gzip" if padded else "rapidgzip")
                if isinstance(outer, PlainFileReader):
                    compressed = open_nested_compressed(
                        outer.fd, offset, size, FormatId(fmt), label, self._compression, backend
                    )
                else:
                    from ..compression.registry import open_compressed

                    window = StreamWindow(outer, offset, size, label)
                    compressed = open_compressed(label, window, FormatId(fmt), self._compression, backend)
                compressed.import_seek_points(seek_points)
                self._nested[row_id] = reader = compressed
                self._expected.opened(FormatId(fmt), size)
            return reader

    def statfs(self) -> dict:  # type: ignore[type-arg]
        blocks = (self._total_size + 4095) // 4096
        return {
            "f_bsize": 4096,
            "f_frsize": 4096,
            "f_blocks": blocks,
            "f_bfree": 0,
            "f_bavail": 0,
            "f_files": self._entries,
            "f_ffree": 0,
            "f_favail": 0,
            "f_namemax": 255,
        }

    def _close_inner(self) -> None:
        with self._nested_lock:
            # The innermost first: a decompressor inside a compressed inner archive reads (in
            # its own threads too) through the one that holds it, made and listed before it.
            for nested in reversed(list(self._nested.values())):
                nested.close()
            self._nested.clear()
            self._expected.withdraw()


def _renewal(
    plain: PlainFileReader, fmt: FormatId, compression: CompressionOptions, watch: ArchiveWatch
) -> RenewReader:
    """How a forked child makes a reader of its own: over a duplicate of the archive's descriptor
    (the file the parent indexed and checked, whatever is at its path by now)."""

    def renew(index: IndexReader) -> Tuple[RandomAccessReader, Optional[ArchiveWatch]]:
        from ..compression.registry import open_compressed
        from ..formats import COMPRESSIONS

        fresh = plain.duplicate()
        try:
            if fmt not in COMPRESSIONS:
                return fresh, watch.renewed(fresh.fd)
            compressed = open_compressed(plain.path, fresh, fmt, compression)
            compressed.import_seek_points(index)
        except BaseException:
            fresh.close()
            raise
        return compressed, watch.renewed(fresh.fd)

    return renew


def _available(backend: Optional[str]) -> Optional[str]:
    """``backend`` when it is a gzip backend that is installed, else None (the default)."""
    from ..compression.registry import BACKENDS

    info = BACKENDS.get(backend or "")
    return backend if info is not None and FormatId.GZIP in info.formats and info.is_available() else None


def open_archive(path: str, options: Optional[OpenOptions] = None) -> MountSource:
    """Open (and on first use, index) the archive at ``path``. When writing its index fails
    because of the place written to (a full disk, a quota), the index is built at the next
    location (``IndexOptions.index_folders``), from a fresh open of the archive."""
    options = options or OpenOptions()
    failed: Dict[str, str] = {}
    while True:
        try:
            return _open_archive(path, options, failed)
        except IndexLocationFailedError as exc:  # (said by the builder, once per folder)
            failed[exc.index] = exc.cause


def _open_archive(path: str, options: OpenOptions, failed: Mapping[str, str]) -> MountSource:
    from ..compression.registry import open_compressed
    from ..formats import COMPRESSIONS, has_tar_magic, is_tar_stream, other_format, sniff_bytes
    from ..index.pool import make_room
    from ..io.descriptors import check_left

    make_room()  # (a union or folder of many archives: idle index connections make way)
    try:
        plain = PlainFileReader(path)
    except FileNotFoundError:
        raise NotFoundError(2, f"{path}: no such file") from None
    except IsADirectoryError:
        raise ArchiveError(f"{path}: is a directory, not an archive") from None
    except PermissionError:
        raise RatarmountError(f"{path}: permission denied") from None
    except OSError as exc:
        check_left(path)
        raise RatarmountError(f"{path}: cannot open ({exc.strerror})") from None
    reader: RandomAccessReader = plain
    found: Optional[Tuple[str, IndexReader]] = None  # (an index opened to learn its backend and layout)
    try:
        file_mode = os.fstat(plain.fd).st_mode
        if stat.S_ISDIR(file_mode):
            raise ArchiveError(f"{path}: is a directory, not an archive")
        if not stat.S_ISREG(file_mode):
            raise ArchiveError(f"{path}: not a regular file")
        stats = archive_stats(plain.fd)
        owner = (os.fstat(plain.fd).st_uid, os.fstat(plain.fd).st_gid)
        if stats.size == 0:
            raise ArchiveError(f"{path}: file is empty")
        start = plain.pread(0, 512)
        fmt = sniff_bytes(start)
        other = other_format(start) if fmt is FormatId.UNKNOWN else None
        if other is not None:
            raise UnsupportedFormatError(f"{path}: not a tar archive: {other}")
        strip = options.recursive and options.strip_tar_extension
        build_options = scan_options(fmt.value, options.recursive, strip)
        if fmt in COMPRESSIONS:
            backend = None
            found = first_valid(path, stats, options.index)
            if found is not None and fmt is FormatId.GZIP and options.compression.gzip_backend is None:
                backend = _available(found[1].metadata.get("compression_backend"))  # (the one it was indexed with)
            compressed = open_compressed(path, plain, fmt, options.compression, backend)
            reader = compressed
            build_options.update(compressed.index_options())
            # Tar or single file: an index of the archive as it is says which (it was decided when
            # the index was built); else the decompressed head. (Decoding it on every mount cost
            # a .tar.bz2 a whole first block, 40 ms of a second mount's 0.15 s in-process.)
            layout = found[1].metadata.get("layout") if found is not None else None
            if layout in ("tar", "single_file"):
                is_tar = layout == "tar"
            else:
                head = compressed.head(512)
                is_tar = is_tar_stream(head, compressed.head)
                if not is_tar and has_tar_magic(head):
                    # A tar whose first header is damaged: in the compressed data (a read checked
                    # by the decoder says so), or in the tar itself. Not a single file named x.tar.
                    with compressed.explained_failures():
                        compressed.pread(0, len(head))
                    raise ArchiveError(
                        f"{path}: not a tar archive (no valid tar header at the start of the decompressed data)"
                    )
            if not is_tar:  # e.g. data.csv.gz
                from .single_file import open_single_file

                build_options["layout"] = "single_file"
                watch = ArchiveWatch(path, plain.fd, stats)
                renew = _renewal(plain, fmt, options.compression, watch)
                taken, found = found, None
                return open_single_file(
                    path, compressed, stats, owner, options, build_options, file_mode, watch, renew, failed, taken
                )  # fmt: skip
            build_options["layout"] = "tar"

        def build(writer: IndexWriter) -> None:
            if reader is plain:
                index_tar(
                    plain, stats.size, writer, path, options.index.progress, options.recursive,
                    options.compression, plain.fd, strip_tar_extension=strip,
                )  # fmt: skip
                return
            tell_member_size(compressed, options.recursive)
            with compressed.explained_failures():
                with compressed.first_pass() as scan:
                    index_tar(
                        scan, None, writer, path, options.index.progress, options.recursive,
                        options.compression, compressed=(compressed.compressed_size, compressed.compressed_progress),
                        strip_tar_extension=strip,
                    )  # fmt: skip
                compressed.export_seek_points(writer)

        taken, found = found, None  # (open_or_build takes it over, also when it fails)
        index = open_or_build(path, stats, options.index, build_options, build, owner, failed, taken)
        if reader is not plain:
            try:
                compressed.import_seek_points(index)
            except BaseException:
                index.close()
                raise
        watch = ArchiveWatch(path, plain.fd, stats, index.data_end if reader is plain else None)
        renew = _renewal(plain, fmt, options.compression, watch)
        return ArchiveSource(path, reader, index, owner, options.compression, watch, renew)
    except ArchiveError as exc:
        reader.close()  # a compressed reader closes its worker threads (and the plain file)
        plain.close()
        raise exc.naming(path) from None
    except BaseException:
        reader.close()
        plain.close()
        raise
    finally:
        if found is not None:  # (not taken over: the open failed before)
            found[1].close()


def open_archives(paths: List[str], options: Optional[OpenOptions] = None) -> List[MountSource]:
    return [open_archive(p, options) for p in paths]

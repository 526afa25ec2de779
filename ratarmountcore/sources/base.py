"""The one interface between file formats and consumers (FUSE, Python users).

A ``MountSource`` answers four primitives -- ``lookup``, ``list_entries``, ``open_info`` and
``close`` -- and gets the user-facing conveniences (``stat``, ``listdir``, ``open``, ``readlink``,
``exists``) from this base class.
"""

from __future__ import annotations

import errno
import io
import itertools
import os
import posixpath
import stat as stat_module
from abc import ABC, abstractmethod
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Tuple

from ..errors import (
    IsADirectoryRatarmountError,
    IsASymlinkError,
    NotADirectoryRatarmountError,
    NotASymlinkError,
    NotFoundError,
)
from ..index.dirents import DirentBlock
from ..io import holes
from ..io.holes import Extents
from ..io.readers import MemberFile

#: Names of pseudo folders ``PATH.versions`` (every version of a member), which listings leave out.
VERSIONS_SUFFIX = b".versions"


class FileInfo(NamedTuple):
    """Metadata of one entry. A NamedTuple: immutable and cheap to build, which matters when a
    listing of a large folder makes one per entry."""

    mode: int
    size: int
    mtime_ns: int
    uid: int
    gid: int
    nlink: int = 1
    ino: int = 0
    linkname: str = ""
    rdev: int = 0
    #: Source-specific locator of the data (typed by each source; opaque to everyone else).
    locator: Any = None
    #: 512-byte blocks the data takes, where it is not the size rounded up: a sparse member
    #: (its stored extents) or a file on disk (its own count). ``st_blocks`` is what is shown.
    blocks: Optional[int] = None

    @property
    def is_dir(self) -> bool:
        return stat_module.S_ISDIR(self.mode)

    @property
    def is_symlink(self) -> bool:
        return stat_module.S_ISLNK(self.mode)

    @property
    def is_file(self) -> bool:
        return stat_module.S_ISREG(self.mode)

    @property
    def st_blocks(self) -> int:
        """``st_blocks``: ``blocks`` where known, else the size in 512-byte blocks, rounded up."""
        blocks = self.blocks
        return (self.size + 511) >> 9 if blocks is None else blocks

    def to_stat_result(self) -> os.stat_result:
        mtime = self.mtime_ns / 1e9
        seconds = self.mtime_ns // 10**9  # (whole seconds, as os.stat's; the float rounds up near a second)
        return os.stat_result(
            (self.mode, self.ino, 0, self.nlink, self.uid, self.gid, self.size, seconds, seconds, seconds)
            + (mtime, mtime, mtime)
            + (self.mtime_ns, self.mtime_ns, self.mtime_ns)
            + (4096, self.st_blocks, self.rdev),
        )


def normalize(path: str) -> str:
    """Absolute, normalized lookup path; never climbs above "/"."""
    path = posixpath.normpath("/" + path.lstrip("/"))
    return "/" + path.lstrip("/")


#: An entry of a listing as plain fields: name (UTF-8 bytes, other bytes kept as they were),
#: mode, size, mtime_ns, uid, gid, nlink, ino, rdev, st_blocks -- ``FileInfo``'s meanings.
StatRow = Tuple[bytes, int, int, int, int, int, int, int, int, int]
#: name, mode, ino: a listing entry without its other attributes.
NameRow = Tuple[bytes, int, int]


class MountSource(ABC):
    """Read-only tree of files. Implementations must be safe to call from many threads.

    A source that ``ratarmountcore.open`` returned pickles as what it was opened from (absolute
    paths and options), not as its open files: a dataset holding one can be sent to workers
    started with ``spawn`` or ``forkserver``, each of which opens it again (the index exists, so
    that is instant). Forked workers use the source as it is (see ``io/forks.py``)."""

    #: (path or paths, OpenOptions) as given to ``ratarmountcore.open``, paths made absolute.
    reopen_args: Optional[Tuple[Any, Any]] = None

    def __reduce__(self) -> Tuple[Any, ...]:
        if self.reopen_args is None:
            raise TypeError(f"cannot pickle {type(self).__name__}: only sources from ratarmountcore.open pickle")
        import ratarmountcore

        return (ratarmountcore.open, self.reopen_args)

    # --- primitives ---------------------------------------------------------------------------
    @abstractmethod
    def lookup(self, path: str) -> Optional[FileInfo]:
        """Metadata of ``path`` (normalized, absolute), or None if it does not exist."""

    @abstractmethod
    def list_entries(self, path: str) -> Optional[Iterable[Tuple[str, FileInfo]]]:
        """(name, info) of the entries of directory ``path``, or None if it is not a directory."""

    def list_entries_upto(self, path: str, limit: int) -> Optional[List[Tuple[str, FileInfo]]]:
        """The first ``limit`` entries of ``list_entries(path)``: enough to tell whether a folder
        is small without loading a large one whole. Sources that can stop early override it."""
        entries = self.list_entries(path)
        return None if entries is None else list(itertools.islice(entries, limit))

    def list_stat_rows(self, path: str) -> Optional[List[StatRow]]:
        """The entries of ``list_entries(path)`` as plain ``StatRow`` tuples, in the same order:
        for front-ends that answer a listing with every entry's attributes at once, without an
        object per entry. Sources with an index override it with a narrower query."""
        entries = self.list_entries(path)
        if entries is None:
            return None
        return [
            (name.encode("utf-8", "surrogateescape"), i.mode, i.size, i.mtime_ns, i.uid, i.gid)
            + (i.nlink, i.ino, i.rdev, i.st_blocks)
            for name, i in entries
        ]

    def list_stat_rows_after(self, path: str, after: Optional[bytes], limit: int) -> Optional[List[StatRow]]:
        """At most ``limit`` rows of folder ``path`` whose names sort after ``after`` (as bytes;
        None: from the first), in name order: a large folder listed a part at a time, so that a
        front-end never holds all its entries at once. None when ``path`` is not a folder. This
        default sorts ``list_stat_rows``; sources with an index override it with a query that
        reads only the rows asked for."""
        rows = self.list_stat_rows(path)
        if rows is None:
            return None
        rows = sorted(rows, key=lambda row: row[0])
        if after is not None:
            rows = [row for row in rows if row[0] > after]
        return rows[:limit]

    def list_name_rows_after(self, path: str, after: Optional[bytes], limit: int) -> Optional[List[NameRow]]:
        """``list_stat_rows_after`` with only (name, mode, ino) of each entry: for listings
        that name the entries without their attributes. Sources with an index override it with
        a narrower query."""
        rows = self.list_stat_rows_after(path, after, limit)
        return None if rows is None else [(row[0], row[1], row[7]) for row in rows]

    def list_dirents(self, path: str) -> Optional[DirentBlock]:
        """Folder ``path``'s listing packed as directory records (``index/dirents.py``), for
        sources that keep them: None when it has none (then list it from its rows)."""
        return None

    @abstractmethod
    def open_info(self, info: FileInfo) -> MemberFile:
        """A seekable binary file for a regular file's ``info``."""

    def read_into(self, info: FileInfo, offset: int, view: memoryview) -> int:
        """Read regular file ``info`` from ``offset`` into ``view``; the bytes read (fewer only
        at its end). One read of a file nobody keeps open (FUSE reads of files the kernel opened
        without a message): sources may answer it without making a file object."""
        member = self.open_info(info)
        try:
            return member.preadinto(offset, view)
        finally:
            member.close()

    def data_extents(self, info: FileInfo) -> Optional[Extents]:
        """(offset, length) of the parts of regular file ``info`` that hold data, in order; the
        rest reads as zeros (``io/holes.py``). None: all of it (the default)."""
        return None

    def seek_data(self, info: FileInfo, offset: int, whence: int) -> int:
        """``lseek`` with ``SEEK_DATA`` or ``SEEK_HOLE`` in regular file ``info``: the offset it
        goes to, or ``OSError`` ENXIO (``io/holes.py``)."""
        return holes.seek_data(info.size, self.data_extents(info), offset, whence)

    def close(self) -> None:  # noqa: B027 - a default, not a primitive
        """Release files and connections."""

    # --- capabilities -------------------------------------------------------------------------
    @property
    def is_immutable(self) -> bool:
        """True when contents never change while mounted (lets FUSE cache everything)."""
        return True

    def is_immutable_entry(self, info: FileInfo) -> bool:
        """Whether this entry (its attributes, its data, a folder's listing) never changes while
        mounted, in a source that is not immutable as a whole: a member of an archive inside a
        folder source. Front-ends cache such entries as long as those of an immutable source."""
        return self.is_immutable

    def host_identity(self, info: FileInfo) -> Optional[Tuple[int, ...]]:
        """Which host file an entry is, as it was when ``info`` was made: the host's (device,
        inode number, change time) of a folder source's regular file, and (device, inode number,
        size, mtime, change time, a hash of its path) of an archive shown as a folder; None for
        anything else.
        Front-ends name such entries by it rather than by path: a file renamed over another is
        another file (a process still reading the old one reads its bytes, not the new file's
        through a shared kernel inode and page cache), all names of a hard-linked file are one
        (but not of an archive: a folder has one name), and a replaced or rewritten archive is a
        new folder, whose members the kernel looks up afresh."""
        return None

    def will_read(self, info: FileInfo) -> None:  # noqa: B027 - a hint, ignored by default
        """A hint: the data of regular file ``info`` is likely to be read soon (a front-end
        saw a lookup that looks like a random open). Sources that read from disk start
        fetching (the beginning of) it in the background; it must return at once."""

    def expect_reads(self) -> None:  # noqa: B027 - a hint, ignored by default
        """A hint: a front-end is up and its files will be read (a mount is ready). A source of
        a small compressed archive starts decoding it into its cache in the background; it
        must return at once. (Opening a source decodes nothing; this is asked for.)"""

    def count_before_reads(self) -> None:  # noqa: B027 - a hint, ignored by default
        """A hint: this source's files will be read (a folder's archives, a union's archives that
        show files). A compressed archive's stream then competes for the caches of decoded data
        from now on, not from its first read (``CompressedReader.count_before_reads``)."""

    def is_implied(self, path: str, info: FileInfo) -> bool:
        """Whether folder ``path`` (``info``: its ``lookup``) is only implied by member paths, an
        archive having no member of that name (tar makes such a folder only where nothing is: a
        union lets it replace nothing). False by default."""
        return False

    def by_ino(self, ino: int) -> Optional[Tuple[str, FileInfo]]:
        """(path, info) of the entry whose ``FileInfo.ino`` is ``ino`` (> 1), or None.

        Sources whose inode numbers are unique and stable (hard links share theirs, with the same
        data) answer this, so a front-end can name entries by inode number without a table of
        its own. The default (and sources that renumber, like unions) answer None for everything.
        Entries with ``ino`` 0 have no inode number.
        """
        return None

    def lists_by_number(self, folder: FileInfo) -> bool:
        """Asked of sources that answer ``by_ino``: whether ``list_stat_rows`` of the folder
        ``folder`` gives its entries inode numbers too. A front-end that names entries by number
        lists such a folder from those rows, others with ``list_entries`` at once (rather than
        learning it from the rows)."""
        return True

    def statfs(self) -> Dict[str, int]:
        return {"f_bsize": 4096, "f_frsize": 4096, "f_namemax": 255}

    # --- conveniences -------------------------------------------------------------------------
    def __enter__(self) -> "MountSource":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _os_path(self, text: str) -> str:
        """``normalize(text)``, with "." and ".." taken as the OS takes them: the name before
        them must be a folder (ENOTDIR, ENOENT), not dropped unseen (``a/../b`` is no ``b`` when
        ``a`` is a file)."""
        parts = text.split("/")
        if "." not in parts and ".." not in parts:
            return normalize(text)
        kept: List[str] = []
        for part in parts:
            if part in (".", ".."):
                if kept:
                    try:
                        info = self._require("/" + "/".join(kept))  # (ENOENT, or ENOTDIR below a file)
                    except NotFoundError:
                        raise NotFoundError(2, "No such file or directory", text) from None
                    except NotADirectoryRatarmountError:
                        raise NotADirectoryRatarmountError(20, "Not a directory", text) from None
                    if not info.is_dir:
                        raise NotADirectoryRatarmountError(20, "Not a directory", text)
                    if part == "..":
                        kept.pop()
            elif part:
                kept.append(part)
        return "/" + "/".join(kept)

    def _require(self, path: "str | os.PathLike[str]") -> FileInfo:
        """The entry at ``path``, or the error the OS would give: ENOENT, or ENOTDIR when the
        path goes on below (or ends in a slash after) something that is not a folder."""
        text = os.fspath(path)
        found = self._os_path(text)
        info = self.lookup(found)
        if info is not None:
            if text.endswith("/") and found != "/" and not info.is_dir:
                raise NotADirectoryRatarmountError(20, "Not a directory", text)
            return info
        above = found
        while above != "/":
            above = above.rsplit("/", 1)[0] or "/"
            parent = self.lookup(above)
            if parent is not None:
                if not parent.is_dir:
                    raise NotADirectoryRatarmountError(20, "Not a directory", text)
                break
        raise NotFoundError(2, "No such file or directory", text)

    def exists(self, path: "str | os.PathLike[str]") -> bool:
        text = os.fspath(path)
        try:
            found = self._os_path(text)
        except (NotFoundError, NotADirectoryRatarmountError):
            return False
        info = self.lookup(found)
        # (No walk up a missing path: which error it would be does not matter here.)
        return info is not None and (info.is_dir or not text.endswith("/") or found == "/")

    def stat(self, path: str) -> os.stat_result:
        return self._require(path).to_stat_result()

    def info(self, path: str) -> FileInfo:
        return self._require(path)

    def is_dir(self, path: str) -> bool:
        try:
            info = self.lookup(self._os_path(path))
        except (NotFoundError, NotADirectoryRatarmountError):
            return False
        return info is not None and info.is_dir

    def listdir(self, path: "str | os.PathLike[str]" = "/") -> List[str]:
        entries = self.list_entries(self._os_path(os.fspath(path)))
        if entries is None:
            self._require(path)
            raise NotADirectoryRatarmountError(20, "Not a directory", os.fspath(path))
        return sorted(name for name, _ in entries)

    def readlink(self, path: str) -> str:
        info = self._require(path)
        if not info.is_symlink:
            raise NotASymlinkError(22, "Not a symbolic link", path)
        return info.linkname

    def open(self, path: str, buffering: int = io.DEFAULT_BUFFER_SIZE) -> io.BufferedReader:
        """Open a regular file for binary reading. Symlinks are not followed (the core never
        resolves them); open their target path yourself."""
        info = self._require(path)
        if info.is_dir:
            raise IsADirectoryRatarmountError(21, "Is a directory", os.fspath(path))
        if info.is_symlink:
            raise IsASymlinkError(errno.ELOOP, "Is a symbolic link (links are not followed)", os.fspath(path))
        raw = self.open_info(info)
        return io.BufferedReader(raw, buffer_size=max(buffering, 1))  # type: ignore[arg-type]

    def read(self, path: str) -> bytes:
        with self.open(path) as f:
            return f.read()

    def walk(self, top: str = "/") -> Iterable[Tuple[str, List[str], List[str]]]:
        """Like ``os.walk`` (top-down, no symlink following)."""
        try:
            stack = [self._os_path(top)]
        except (NotFoundError, NotADirectoryRatarmountError):
            return  # (as os.walk: nothing)
        while stack:
            folder = stack.pop()
            entries = self.list_entries(folder) or []
            dirs = sorted(name for name, info in entries if info.is_dir)
            files = sorted(name for name, info in entries if not info.is_dir)
            yield folder, dirs, files
            stack.extend(posixpath.join(folder, d) for d in reversed(dirs))

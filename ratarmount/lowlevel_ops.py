"""FUSE requests by node id: a thin translation of ``MountSource`` into reply payloads.

This is the request logic of the low-level front-end (``lowlevel.py`` holds the ctypes glue):
every method takes what the kernel sent and returns the bytes to reply, or raises; exceptions
become errno values in the glue (``errnos.errno_of``). Nothing here touches libfuse, so the
logic is testable without a mount.

Threading model: libfuse's multi-threaded loop calls these methods from its worker threads at
once. ``MountSource`` implementations are thread-safe; the node table and the handle tables are
the only shared state here (a lock around the node table's counts, single-key dict operations
for handles).
"""

from __future__ import annotations

import bisect
import collections
import errno
import functools
import itertools
import logging
import os
import stat
import threading
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple, Union

from ratarmountcore.errors import RatarmountError
from ratarmountcore.index.dirents import DirentBlock
from ratarmountcore.index.folder_rows import RecentFolders
from ratarmountcore.sources.base import VERSIONS_SUFFIX, FileInfo, MountSource, StatRow

from . import kernel_abi as abi
from .folder_prefetch import FOLDER_MAX, FolderPrefetcher
from .folder_readahead import FolderReadAhead
from .inodes import ROOT_ID, InodeTable, ReplacedNodeError, StaleNodeError, same_file
from .open_files import OpenFiles
from .paged_listing import CHUNK as LISTING_CHUNK
from .paged_listing import PagedListing

logger = logging.getLogger(__name__)

#: Attributes, names and misses never change on an immutable tree: let the kernel keep them a day.
TIMEOUT = 86400
ENCODING = "utf-8"
#: The longest name a lookup that finds nothing may have; a longer one is ENAMETOOLONG.
NAME_MAX = 255
#: Node ids below this are a stable source's inode numbers; the table hands out the ones above.
STABLE_LIMIT = 1 << 56
LOOKED_UP_MAX = 1024
#: Entries remembered by path and by inode number. The kernel caches what we answer for a day, so
#: these only serve the requests that follow each other closely (LOOKUP, then READ or GETATTR).
ENTRY_CACHE = 1024
#: Nodes remembered as stored in the kernel's page cache (``data_for_open``): ~100 bytes each
#: resident; a file opened again after it was forgotten here is only stored again.
STORED_NODES = 8192
#: LOOKUP replies kept for whole folders, all folders together (see ``_load_replies``). They
#: answer a run's lookups until the prefetcher's listing reaches the kernel; more (1,024) kept
#: 1.2 MiB more resident after a stat of every file, for no measurable speed.
REPLY_CACHE_ENTRIES = 256
#: Folders with more entries than this are looked up entry by entry.
REPLY_FOLDER_MAX = 512
#: Folders (cached or marked as not cacheable) remembered at most.
REPLY_FOLDERS_MAX = 256
#: Listings of folders read without OPENDIR kept at once (each until its last page is served).
NODE_LISTINGS_MAX = 64
#: How long the lookup that hands a folder to the prefetcher waits for the listing (see
#: ``lookup``); a listing of a folder of 4,096 entries takes ~20 ms on a small VM.
LISTING_WAIT = 0.25
#: How long the listing of a folder read ahead may wait for the walk to get there (see
#: ``FolderReadAhead.hold``).
HOLD = 0.1
#: Rows kept for the listings of folders about to be listed (a run's, and those read ahead).
ROWS_READY_MAX = 8
#: Folders remembered from listings at most (``_listed_folders``), then forgotten all at once.
LISTED_FOLDERS_MAX = 16384
#: Inode number in listings of entries that have none (readdir must not report 0).
UNKNOWN_INO = 0xFFFFFFFF

Entry = Tuple[FileInfo, bytes]  # info, packed struct fuse_attr
#: name, path (when the node id comes from the table), info (None when the record was made from
#: a ``StatRow``), READDIRPLUS record (when known)
Listed = Tuple[bytes, str, Optional[FileInfo], bytes]
#: A folder's listing: all its entries, or a large folder's a part at a time.
Listing = Union[List[Listed], "PagedListing[Listed]"]
#: Marks a folder whose LOOKUP replies are not cached (too large, or entries without inodes).
_NOT_CACHED: Dict[bytes, StatRow] = {}


class _PackedPages:
    """A packed listing being read: "." and ".." and the folder's records, each behind an entry
    part naming no node (the kernel links nothing), cut into pages where the records end."""

    __slots__ = ("data", "count", "_heads", "_ends", "_cuts")

    def __init__(self, heads: List[bytes], block: DirentBlock) -> None:
        records, ends, none = block.records, block.ends, abi.NO_ENTRY
        body = none.join([records[start:end] for start, end in zip(itertools.chain((0,), ends), ends)])
        self.data = heads[0] + heads[1] + none + body
        self.count = len(ends) + 2
        self._heads = (len(heads[0]), len(heads[0]) + len(heads[1]))
        self._ends = ends
        self._cuts: Optional[List[int]] = None

    def page(self, offset: int, size: int) -> bytes:
        """The records from position ``offset`` on that fit into ``size`` bytes."""
        data = self.data
        if offset == 0 and len(data) <= size:  # (most folders: one page)
            return data
        cuts = self._cuts
        if cuts is None:
            first, second = self._heads
            step = abi.ENTRY_SIZE
            tails = (second + end + step * count for count, end in enumerate(self._ends, 1))
            cuts = self._cuts = [first, second, *tails]
        start = cuts[offset - 1] if offset else 0
        end = bisect.bisect_right(cuts, start + size)
        return data[start : cuts[end - 1]] if end > offset else b""


def _errno(code: int) -> OSError:
    return OSError(code, os.strerror(code))


def _kind(info: Optional[FileInfo]) -> int:
    """The file type bits a table node is told apart by besides its path (0 for folders)."""
    if info is None:
        return 0
    kind = stat.S_IFMT(info.mode)
    return 0 if kind == stat.S_IFDIR else kind


class LowLevelOperations:
    def __init__(
        self,
        source: MountSource,
        on_ready: Optional[Callable[[], None]] = None,
        prefetcher: Optional[FolderPrefetcher] = None,
    ) -> None:
        self.source = source
        self._on_ready = on_ready
        #: Lists folders in which lookups come in runs, so that the kernel learns all their entries.
        self.prefetcher = prefetcher
        #: Per worker thread, the file whose data a random open will read (``info``): the source
        #: is told once the LOOKUP is answered (``after_reply``).
        self._hints = threading.local()
        self._last_parent = 0
        self._handed_over = 0
        #: Sizes of the folders whose replies were made (by path), counted up to FOLDER_MAX + 1.
        self._folder_sizes: "collections.OrderedDict[str, int]" = collections.OrderedDict()
        #: The rows of folders read for a run of lookups or a read-ahead (complete), by node
        #: id, for their listings.
        self._rows_ready: Dict[int, List[StatRow]] = {}
        # Sources with stable, unique inode numbers name their entries themselves (node id =
        # inode number, nothing to remember); entries without one, and all entries of other
        # sources, get ids from the table.
        self._stable = type(source).by_ino is not MountSource.by_ino
        #: Whether the source lists a folder a part at a time by itself (large folders are then
        #: listed so, see paged_listing.py).
        self._paged = type(source).list_stat_rows_after is not MountSource.list_stat_rows_after
        self.nodes = InodeTable(first=STABLE_LIMIT if self._stable else ROOT_ID + 1)
        self.files = OpenFiles(source)
        self._listings: Dict[int, Listing] = {}
        self._next_handle = itertools.count(1)
        self.no_open = False
        self.no_opendir = False
        self._node_listings: "collections.OrderedDict[int, Listing]" = collections.OrderedDict()
        self._node_listings_lock = threading.Lock()
        #: Packed listings being read (``_packed_page``): all records, the end of each.
        self._packed: "collections.OrderedDict[int, _PackedPages]" = collections.OrderedDict()
        #: Whether the kernel lets lookups and listings of one folder run at the same time
        #: (``parallel_dirops.py``); only then may a lookup wait for a listing of its folder.
        self.parallel_dirops = False
        #: False with a single worker thread: nothing else would serve the listing waited for.
        self.lookups_may_wait = True
        #: Per folder being listed for a run of lookups: the name whose lookup waits for it.
        self._waiting: Dict[int, bytes] = {}
        self._waiting_lock = threading.Lock()
        #: Lookups waiting for the listing of a folder listed ahead (at most one, see above).
        self._ahead_waits = 0
        #: Worker threads answering a lookup or a read right now (set operations are atomic).
        self._busy: Set[int] = set()
        self._timeout = TIMEOUT if source.is_immutable else 1
        #: Whether every entry gets ``_timeout`` (else ``_timeout_of`` asks the source: a folder
        #: source's archive members are cached as long as an archive's).
        self._uniform = source.is_immutable
        #: The kernel keeps what it read of a file (or listing) for the next open: not for a folder
        #: source, whose files may change.
        self._keep_cache = abi.FOPEN_KEEP_CACHE if source.is_immutable else 0
        #: The nodes whose data was stored, oldest first (until the kernel forgets them).
        self._stored: "collections.OrderedDict[int, None]" = collections.OrderedDict()
        # LOOKUP, then GETATTR or READ of the same path: remember recent answers (misses too).
        self._entry: Callable[[str], Optional[Entry]] = (
            functools.lru_cache(maxsize=ENTRY_CACHE)(self._lookup_entry) if source.is_immutable else self._lookup_entry
        )
        self._by_ino: Callable[[int], Optional[Tuple[str, Entry]]] = functools.lru_cache(maxsize=ENTRY_CACHE)(
            self._lookup_ino
        )
        #: Nodes just handed out by LOOKUP: the READ or GETATTR that usually follows needs no query.
        self._looked_up: Dict[int, Tuple[str, Entry]] = {}
        #: The rows of whole folders by name (stable, immutable sources), read for runs of lookups.
        self._replies: "collections.OrderedDict[int, Dict[bytes, StatRow]]" = collections.OrderedDict()
        self._replies_lock = threading.Lock()
        self._reply_count = 0
        self._recent_parents = RecentFolders()
        #: Node id -> path of the folders named in listings (``find`` lists each one next: its
        #: path by name from the parent's cached rows instead of a query by inode number).
        self._listed_folders: Dict[int, str] = {}
        #: Folders last listed with names only for their files.
        self._names_only: Dict[int, None] = {}
        #: Set once files were looked up in a run where a listing had named them without
        #: attributes (``ls -l``, ``du``, a walk that stats): from then on every listing carries
        #: them, as the prefetcher's do.
        self.listings_in_full = False
        self._negative = abi.entry_out(0, abi.NEGATIVE_ATTR, self._timeout)
        #: Folders listed ahead of a walk (stable, immutable sources: node id = inode number).
        self._ahead: Optional[FolderReadAhead] = None
        if prefetcher is not None and self._stable and source.is_immutable:
            self._ahead = FolderReadAhead(source.list_name_rows_after)

    def _lookup_ino(self, ino: int) -> Optional[Tuple[str, Entry]]:
        found = self.source.by_ino(ino)
        if found is None:
            return None
        path, info = found
        return path, (info, abi.pack_attr(info))

    def _own_node(self, info: FileInfo) -> int:
        """The entry's inode number when it can be its node id (a stable source), else 0."""
        return info.ino if self._stable and 1 < info.ino < STABLE_LIMIT else 0

    def _node_of(self, path: str, info: FileInfo) -> int:
        """The node id to give the kernel for ``path`` (counted once more when from the table)."""
        return self._own_node(info) or self.nodes.remember(path, self.source.host_identity(info), _kind(info))

    def _resolve(self, node: int) -> Tuple[str, Entry]:
        """Path and entry of a node id the kernel holds."""
        found = self._looked_up.get(node)
        if found is not None:
            return found
        if node == ROOT_ID or node >= self.nodes.first:
            path = self.nodes.path(node)
            key = self.nodes.identity(node)
            if key is None:
                named = self._require(path)
                if not self._uniform and node != ROOT_ID and _kind(named[0]) != self.nodes.kind(node):
                    # A folder that became a link or a device (or the other way round) since: the
                    # kernel would take the other type for its inode's and refuse it (EIO).
                    raise ReplacedNodeError(node)
                return path, named
            current = self._entry(path)
            identity = None if current is None else self.source.host_identity(current[0])
            if current is None or identity is None or not same_file(key, identity):
                # The host file the kernel holds this node for was replaced or removed since:
                # stale (a GETATTR through an open handle gets the file's entry from there).
                raise ReplacedNodeError(node)
            return path, current
        listed = self._listed_folders.get(node)
        if listed is not None:  # a folder the kernel got from a listing: by path, mostly cached
            entry = self._entry(listed)
            if entry is not None and entry[0].ino == node:
                return listed, entry
        found = self._by_ino(node)
        if found is None:
            raise StaleNodeError(node)
        return found

    def _path(self, node: int) -> str:
        """The path of a node id the kernel holds (a table's without looking the entry up: the
        lookup of a name in it finds out whether it is still there)."""
        if node >= self.nodes.first or node == ROOT_ID:
            return self.nodes.path(node)
        if self._uniform:
            # A folder the kernel got from a listing, on a tree that cannot change: its path
            # needs no query for its entry (a random open in a folder listed by ``find`` or the
            # prefetcher: one index query instead of two).
            listed = self._listed_folders.get(node)
            if listed is not None:
                return listed
        return self._resolve(node)[0]

    def _lookup_entry(self, path: str) -> Optional[Entry]:
        info = self.source.lookup(path)
        return None if info is None else (info, abi.pack_attr(info))

    def _require(self, path: str) -> Entry:
        entry = self._entry(path)
        if entry is None:
            raise _errno(errno.ENOENT)
        return entry

    # --- session ------------------------------------------------------------------------------
    def init(self, no_open_supported: bool, no_opendir_supported: bool = False) -> None:
        # Zero-message opens: an ENOSYS answer to the first OPEN makes the kernel skip OPEN and
        # RELEASE for every later open (keeping the page cache); reads then carry no handle.
        # The same for folders: no OPENDIR/RELEASEDIR, listings cached by the kernel all the same.
        self.no_open = no_open_supported
        self.no_opendir = no_opendir_supported
        if self._on_ready is not None:
            self._on_ready()

    def destroy(self) -> None:
        if self.prefetcher is not None:
            self.prefetcher.close()
        self.files.clear()
        self._listings.clear()
        self._node_listings.clear()

    # --- names --------------------------------------------------------------------------------
    def after_reply(self) -> None:
        """What this thread's last LOOKUP left for after its reply: telling the source which
        file a random open will read (``MountSource.will_read``). Its ``posix_fadvise`` takes as
        long as the kernel needs to start the disk read; made before the reply, it held up every
        random open's LOOKUP (1,000 random reads after dropping the caches, alternated, mean of
        44 passes: 0.47 s with the hint before the reply, 0.42 s after it; 0.54 s without it,
        12 passes)."""
        hints = self._hints
        info = getattr(hints, "info", None)
        if info is None:
            return
        hints.info = None
        try:
            self.source.will_read(info)
        except Exception as exc:  # noqa: BLE001 - a hint; the read that follows reports errors
            logger.debug("hint to read ahead failed: %s", exc)

    def lookup(self, parent: int, name: bytes) -> bytes:
        me = threading.get_ident()
        self._busy.add(me)
        try:
            return self._answer_lookup(parent, name)
        finally:
            self._busy.discard(me)

    def _answer_lookup(self, parent: int, name: bytes) -> bytes:
        in_run = parent == self._last_parent
        self._last_parent = parent
        ahead = self._ahead
        joined = ahead is not None and bool(ahead.pending) and self._join_ahead(ahead, parent, name)
        if joined:
            in_run = True  # (the walk's: no hint to fetch data, no run to hand over)
        reply, info = self._lookup(parent, name, in_run)
        if reply is self._negative and len(name) > NAME_MAX:
            # (ENOENT said such a name could exist here; a file system says it cannot. A
            # member with a longer name is still found: tar may hold one, f_namemax aside.)
            raise OSError(errno.ENAMETOOLONG, "file name too long")
        if in_run:
            listed = None if joined else self._follow_run(parent, name, reply is not self._negative)
            if listed is not None:
                # Answered once the kernel knows the folder: lookups in it racing with the
                # listing made it drop attributes it had just been given (a GETATTR for each
                # later stat there) and sent ~25 more LOOKUPs per folder of 100; waiting here,
                # a stat of every file costs two lookups per folder.
                listed.wait(LISTING_WAIT)
                with self._waiting_lock:
                    del self._waiting[parent]
        elif info is not None and info.is_file and len(self._busy) == 1:
            # Not one of a run of lookups in one folder (a stat of every file): a random open,
            # whose READ follows at once. The source may start fetching the data now -- unless
            # another worker is answering a lookup or read as well: with several readers at
            # once the disk has reads in flight anyway, and the hint only cost time (8
            # processes reading 4,000 random files on 2 cores: 0.75 s with it, 0.66 s without).
            # Told after the reply (``after_reply``): the kernel sends the open's next request
            # meanwhile.
            self._hints.info = info
        return reply

    def _lookup(self, parent: int, name: bytes, in_run: bool = False) -> Tuple[bytes, Optional[FileInfo]]:
        """The LOOKUP reply, with the entry's metadata when it exists (or, in a run of lookups
        in one folder, None when the reply was made from the folder's rows)."""
        replies = self._replies.get(parent)
        if replies is not None:
            if replies is _NOT_CACHED:
                return self._lookup_slow(parent, name)
            row = replies.get(name)
            if row is not None:
                _name, mode, size, mtime_ns, uid, gid, nlink, ino, rdev, blocks = row
                if not in_run and stat.S_ISREG(mode):  # (a random open: its data is asked for next)
                    return self._lookup_slow(parent, name)
                # (The reply is made when asked: most never are, since the prefetcher's listing
                # answers the rest of a run in the kernel.)
                reply = abi.entry_out_of(ino, self._timeout, ino, mode, size, mtime_ns, uid, gid, nlink, rdev, blocks)
                return reply, None
            if not name.endswith(VERSIONS_SUFFIX):  # pseudo entries are not listed
                return self._negative, None
        elif self._stable and self.source.is_immutable:
            if self._recent_parents.again(parent):
                self._load_replies(parent)
                return self._lookup(parent, name, in_run)
        return self._lookup_slow(parent, name)

    def _follow_run(self, parent: int, name: bytes, found: bool) -> Optional[threading.Event]:
        """Two lookups in a row in one folder (a stat or open of every file; random opens
        alternate between a folder and its parent): hand the folder to the prefetcher, once per
        run, with its size from the replies made for the run. Returns what the lookup of
        ``name`` (``found`` when it exists) waits for, when it should wait for the listing."""
        if parent == self._handed_over or self.prefetcher is None:
            return None
        self._handed_over = parent
        path = self._path(parent)
        sizes = self._folder_sizes
        size = sizes.get(path)
        listed = None
        if size is not None:
            if self.parallel_dirops and self.lookups_may_wait:
                # The kernel holds ``name`` as "being looked up" until we answer: the listing
                # must not name it with a node id, or the kernel would wait for this lookup.
                # One waiting lookup at a time: with several processes in several folders (a
                # DataLoader's workers), lookups waiting behind each other's listings in the
                # one prefetcher thread cost more than they saved.
                with self._waiting_lock:
                    if not self._waiting and not self._ahead_waits:
                        listed = threading.Event()
                        self._waiting[parent] = name
            names_only = parent in self._names_only
            if names_only and not self.listings_in_full:
                logger.debug("files listed without attributes were looked up: listings carry them from now on")
                self.listings_in_full = True
            # A run of lookups of existing names in a folder the prefetcher listed before: the
            # kernel has dropped the entries that listing linked (memory pressure, drop_caches),
            # or it would answer these lookups itself. It is listed again, its cached listing
            # dropped first (the kernel would serve that without linking anything). Before, a
            # second pass over a tree after the kernel's caches were dropped cost a LOOKUP for
            # every file (the 1 GB .tar.gz read file by file: 3.62-4.02 s, 3.42-3.56 s on a
            # fresh mount). Misses are not linked by a listing: they never ask for one again.
            relist = not names_only and found and self.prefetcher.has_listed(path)
            stale = parent if names_only or relist else 0
            if not self.prefetcher.request(path, size, listed, stale) and listed is not None:
                with self._waiting_lock:
                    del self._waiting[parent]  # ours: set just above
                listed = None
            # Its parent too, when its lookups came in runs as well (a walk over every file of
            # the tree looks up each folder there between the runs in them).
            above = path.rsplit("/", 1)[0] or "/"
            size = sizes.get(above) if path != "/" else None
            if size is not None:
                self.prefetcher.request(above, size)
            if self._ahead is not None and self.parallel_dirops and self.lookups_may_wait:
                self._list_ahead(self._ahead.after_run(path))
        return listed

    def _join_ahead(self, ahead: FolderReadAhead, parent: int, name: bytes) -> bool:
        """A lookup in folder ``parent``: if it was handed to the prefetcher ahead of a walk,
        wait for its listing (when that may still leave ``name`` out), keep the window ahead
        of the walk, and say so."""
        pending = ahead.join(parent, name)
        if pending is None:
            return False
        self._handed_over = parent
        # (The next folders first: their rows are read while this one is listed, not after.)
        self._list_ahead(ahead.after_hit(pending.path))
        if not pending.built:
            # One waiting lookup at a time, as for runs: with two workers, a second one would
            # leave none to serve the listings waited for.
            with self._waiting_lock:
                wait = not self._waiting and not self._ahead_waits
                self._ahead_waits += wait
            if wait:
                pending.done.wait(LISTING_WAIT)
                with self._waiting_lock:
                    self._ahead_waits -= 1
        ahead.drop(parent)
        return True

    def _list_ahead(self, folders: List[Tuple[str, int]]) -> None:
        """Hand ``folders`` (path, node id) to the prefetcher, each with its rows for the
        listing; stop at the first too large or not numbered by its own inode numbers. (Read
        here, not in the prefetcher's threads: querying the index from three threads at once
        opened two more connections, 0.7 MiB more resident, for no measurable gain.)"""
        ahead = self._ahead
        assert ahead is not None and self.prefetcher is not None
        for path, node in folders:
            if self._paged:
                rows = self.source.list_stat_rows_after(path, None, FOLDER_MAX + 1)
            else:
                rows = self.source.list_stat_rows(path)
            if rows is None or len(rows) > FOLDER_MAX or not all(1 < row[7] < STABLE_LIMIT for row in rows):
                return
            pending = ahead.add(node, path)
            pending.end = len(rows) + 2
            self._keep_rows(node, rows)
            stale = node if node in self._names_only else 0
            self._names_only.pop(node, None)  # (listed in full from now on)
            hold = functools.partial(ahead.hold, pending, HOLD)
            if not self.prefetcher.request(path, len(rows), pending.done, stale, hold):
                ahead.drop(node)
                with self._replies_lock:
                    self._rows_ready.pop(node, None)

    def _keep_rows(self, node: int, rows: List[StatRow]) -> None:
        with self._replies_lock:
            self._store_rows(node, rows)

    def _store_rows(self, node: int, rows: List[StatRow]) -> None:
        """Keep folder ``node``'s rows for its next listing (``_replies_lock`` held)."""
        ready = self._rows_ready
        ready[node] = rows
        while len(ready) > ROWS_READY_MAX:
            del ready[next(iter(ready))]

    def _lookup_slow(self, parent: int, name: bytes) -> Tuple[bytes, Optional[FileInfo]]:
        base = self._path(parent)
        text = name.decode(ENCODING, "surrogateescape")
        path = ("/" + text) if base == "/" else (base + "/" + text)
        entry = self._entry(path)
        if entry is None:
            return self._negative, None
        node = self._node_of(path, entry[0])
        if node < self.nodes.first or (not self._uniform and self.source.is_immutable_entry(entry[0])):
            # (A table's node id is never given to another path, so an entry that cannot change
            # -- an archive member in a folder source -- serves the OPEN and GETATTR after the
            # LOOKUP: without it they resolved the path again, an index query and host stats.)
            self._remember(node, (path, entry))
        return abi.entry_out(node, self._attr(node, entry), self._timeout_of(entry[0])), entry[0]

    def _timeout_of(self, info: FileInfo) -> int:
        if self._uniform or not self.source.is_immutable_entry(info):
            return self._timeout
        return TIMEOUT

    def _remember(self, node: int, found: Tuple[str, Entry]) -> None:
        recent = self._looked_up
        if len(recent) >= LOOKED_UP_MAX:
            recent.clear()
        recent[node] = found

    def _load_replies(self, parent: int) -> None:
        """Read the rows of folder ``parent`` for a run of lookups there: its names answer the
        misses among them, its size tells the prefetcher what to list, and its rows make the
        prefetcher's listing; or mark it as not cached."""
        path, _own = self._resolve(parent)
        limit = REPLY_FOLDER_MAX if self.prefetcher is None else max(REPLY_FOLDER_MAX, FOLDER_MAX)
        # (In the order of the folder's other listings: a listing is continued by offset.)
        if self._paged:
            rows = self.source.list_stat_rows_after(path, None, limit + 1)
        else:
            rows = self.source.list_stat_rows(path)
            rows = None if rows is None else rows[: limit + 1]
        numbered = rows is not None and all(1 < row[7] < STABLE_LIMIT for row in rows)
        replies = {row[0]: row for row in rows} if rows is not None and numbered else None
        if replies is not None and len(replies) > REPLY_FOLDER_MAX:
            replies = None  # too large a folder: looked up entry by entry
        with self._replies_lock:
            if rows is not None and self.prefetcher is not None:
                self._folder_sizes[path] = len(rows)
                if len(self._folder_sizes) > REPLY_FOLDERS_MAX:
                    self._folder_sizes.popitem(last=False)
                if numbered and len(rows) <= limit:  # complete: the listing the prefetch asks for next
                    self._store_rows(parent, rows)
            self._reply_count -= len(self._replies.pop(parent, ()))  # made twice by two threads
            self._replies[parent] = _NOT_CACHED if replies is None else replies
            self._reply_count += len(replies or ())
            while self._reply_count > REPLY_CACHE_ENTRIES and len(self._replies) > 1:
                _, old = self._replies.popitem(last=False)
                self._reply_count -= len(old)
            while len(self._replies) > REPLY_FOLDERS_MAX:  # markers of folders not cached
                _, old = self._replies.popitem(last=False)
                self._reply_count -= len(old)

    def forget(self, node: int, count: int) -> None:
        self.nodes.forget(node, count)
        self._stored.pop(node, None)

    def forget_all(self, nodes: Sequence[int], counts: Sequence[int]) -> None:
        """A FORGET_MULTI batch (the kernel sends them when it drops its caches): handled as
        one list, without a call per node."""
        self.nodes.forget_all(nodes, counts)
        stored = self._stored
        if stored:
            for node in nodes:
                stored.pop(node, None)

    def _attr(self, node: int, entry: Entry) -> bytes:
        # Entries without an inode number of their own (e.g. PATH.versions) show their node id.
        return entry[1] if entry[0].ino else abi.pack_attr(entry[0]._replace(ino=self._shown_ino(node, entry[0])))

    def _shown_ino(self, node: int, info: FileInfo) -> int:
        """The inode number a table node shows: a host file's own (its node changes with its
        change time, see inodes.py, but ``tail -F``, ``find -samefile`` and ``rsync -H`` go by
        the number), else the node id. Host numbers below 2**40 meet none of the mount's other
        numbers (archive members' start there, table ids at ``STABLE_LIMIT``)."""
        identity = self.source.host_identity(info)
        if identity is not None and len(identity) == 3 and 1 < identity[1] < 1 << 40:
            return identity[1]
        return node

    def getattr(self, node: int) -> bytes:
        try:
            entry = self._resolve(node)[1]
        except ReplacedNodeError:
            # A file replaced or removed while a process reads it: as it was opened (``fstat``;
            # a reader of the old file reads it to its own end, which asks for the size again).
            info = self.files.opened_info(node)
            if info is None:
                raise
            entry = (info, abi.pack_attr(info))
        return abi.attr_out(self._attr(node, entry), self._timeout_of(entry[0]))

    def readlink(self, node: int) -> bytes:
        info = self._resolve(node)[1][0]
        if not info.is_symlink:
            raise _errno(errno.EINVAL)
        return info.linkname.encode(ENCODING, "surrogateescape")

    def statfs(self) -> bytes:
        return abi.statfs_out(self.source.statfs())

    # --- files --------------------------------------------------------------------------------
    def open(self, node: int, flags: int) -> bytes:
        if flags & os.O_ACCMODE != os.O_RDONLY:
            raise _errno(errno.EROFS)
        info = self._resolve(node)[1][0]
        if info.is_dir:
            raise _errno(errno.EISDIR)
        if self.no_open:
            raise _errno(errno.ENOSYS)  # see init; the open itself succeeds
        immutable = self.source.is_immutable_entry(info)
        keep = self._keep_cache or (abi.FOPEN_KEEP_CACHE if immutable else 0)
        # Only an entry that may be replaced needs its entry as opened (``getattr``): an
        # archive member's open takes no lock for it.
        return abi.open_out(self.files.open(info, 0 if immutable else node), keep)

    def data_for_open(self, node: int, view: memoryview) -> int:
        """The data of the file a process opens and asks whether it is a terminal (Python's
        ``open()`` does, for its buffering), read into ``view`` for the kernel's page cache
        before the answer: the READ that follows is then served by the kernel. 0: nothing to
        store (not a regular file that fits into ``view``, one that may change -- a folder
        source's own file --, or stored before)."""
        if node in self._stored:
            return 0
        info = self._resolve(node)[1][0]
        size = info.size
        if not info.is_file or size == 0 or size > len(view) or not self.source.is_immutable_entry(info):
            return 0
        if self.files.read_unopened(info, 0, view[:size]) != size:
            return 0  # (shorter than its size: the READ tells)
        stored = self._stored
        stored[node] = None
        if len(stored) > STORED_NODES:
            stored.popitem(last=False)
        return size

    def read(self, node: int, handle: int, offset: int, view: memoryview) -> int:
        me = threading.get_ident()
        self._busy.add(me)
        try:
            if handle == 0:  # an open the kernel did not tell us about
                return self.files.read_unopened(self._resolve(node)[1][0], offset, view)
            return self.files.read(handle, offset, view)
        finally:
            self._busy.discard(me)

    def release(self, handle: int) -> None:
        self.files.release(handle)

    def lseek(self, node: int, offset: int, whence: int) -> int:
        """Where ``SEEK_DATA`` or ``SEEK_HOLE`` from ``offset`` goes in a file (the only
        ``lseek``s the kernel asks about): a sparse member's holes are its own."""
        info = self._resolve(node)[1][0]
        if not info.is_file:
            raise _errno(errno.EINVAL)
        return self.source.seek_data(info, offset, whence)

    # --- folders ------------------------------------------------------------------------------
    def opendir(self, node: int, full: bool = True) -> bytes:
        """``full``: whether the listing is for our prefetcher (see ``_row_records``)."""
        if self.no_opendir:
            if not self._resolve(node)[1][0].is_dir:
                raise _errno(errno.ENOTDIR)
            raise _errno(errno.ENOSYS)  # see init; the kernel lists by node id from now on
        handle = next(self._next_handle)
        self._listings[handle] = self._make_listing(node, full or self.listings_in_full)
        return abi.open_out(handle, self._keep_cache | (abi.FOPEN_CACHE_DIR if self._keep_cache else 0))

    def _make_listing(self, node: int, full: bool = True) -> Listing:
        path, own = self._resolve(node)
        with self._replies_lock:
            run_rows = self._rows_ready.pop(node, None) if self._rows_ready else None
        prefix = "/" if path == "/" else path + "/"
        records: Optional[List[Listed]] = None
        chunked = False
        entries: Optional[Iterable[Tuple[str, FileInfo]]] = ()
        if run_rows is not None:  # listed for a run of lookups or ahead of a walk: its rows were just read
            records = self._records_of_rows(run_rows, 2, node, prefix, full)
        elif self._stable and self.source.lists_by_number(own[0]):
            # Every entry named by its own inode number: records straight from plain rows
            # (a folder of 100 files listed in 0.14 instead of 0.31 ms, most of a `find`); a
            # large folder a part at a time (see paged_listing.py).
            records = self._row_records(path, None, LISTING_CHUNK + 1, 2, node, prefix, full)
            chunked = self._paged and records is not None and len(records) > LISTING_CHUNK
            # (None: entries without an inode number of their own, named by the table)
            entries = () if records is not None else self.source.list_entries(path)
        else:
            entries = self.source.list_entries(path)
        if entries is None:
            raise _errno(errno.ENOTDIR)
        timeout = self._timeout
        plus = abi.direntplus
        # READDIRPLUS records are made here when the node id is the entry's own inode number
        # (and for "." and "..", which carry none); entries named by the table get theirs when
        # a page is served, since handing out an id counts a reference.
        listing = self._listing_head(path, own)
        if records is not None:
            if not full:
                self._mark_names_only(node)
            if chunked:

                def fetch(after: Optional[bytes], index: int) -> List[Listed]:
                    part = self._row_records(path, after, LISTING_CHUNK, index, node, prefix, full)
                    if part is None:
                        raise RatarmountError(f"{path}: the folder's entries changed while it was listed")
                    return part

                return PagedListing(listing, fetch, records[:LISTING_CHUNK], LISTING_CHUNK)
            listing += records
            return listing
        own_node = self._own_node
        offset = 2
        waiting = self._waiting.get(node)
        folders = self._listed_folders  # (see _resolve)
        if len(folders) > LISTED_FOLDERS_MAX:
            folders.clear()
        for name, info in entries:
            offset += 1
            raw = name.encode(ENCODING, "surrogateescape")
            entry_node = own_node(info)
            if entry_node:
                # (node id 0: the kernel links nothing for the entry a lookup waits on)
                given = 0 if raw == waiting else entry_node
                listing.append((raw, "", info, plus(given, info, timeout, offset, raw, entry_node)))
                if info.is_dir:
                    folders[entry_node] = prefix + name
            elif raw == waiting:  # not named by the table when served either
                shown = info.ino or self._shown_ino(0, info) or UNKNOWN_INO
                listing.append((raw, prefix + name, info, plus(0, info, timeout, offset, raw, shown)))
            else:
                listing.append((raw, prefix + name, info, b""))
        return listing

    def _mark_names_only(self, node: int) -> None:
        """Folder ``node`` was listed without its files' attributes (see ``_follow_run``)."""
        names_only = self._names_only
        names_only[node] = None
        if len(names_only) > LISTED_FOLDERS_MAX:
            names_only.clear()

    def _listing_head(self, path: str, own: Entry) -> List[Listed]:
        """The records of "." and ".." of folder ``path``."""
        parent = self._entry(path.rsplit("/", 1)[0] or "/") if path != "/" else own
        up = (parent or own)[0]
        plus = abi.direntplus
        return [
            (b".", "", own[0], plus(0, own[0], 0, 1, b".", own[0].ino or UNKNOWN_INO)),
            (b"..", "", up, plus(0, up, 0, 2, b"..", up.ino or UNKNOWN_INO)),
        ]

    def _packed_page(self, node: int, size: int, offset: int) -> Optional[bytes]:
        """A READDIRPLUS page without attributes from the folder's packed listing
        (``index/dirents.py``: a folder of files), or None when it has none. A folder of 100
        files costs one row and a decompression instead of a query and a record per entry."""
        packed = self._packed.get(node)
        if packed is None:
            if offset != 0:
                return None  # (a listing made from rows continues from rows)
            path, own = self._resolve(node)
            block = self.source.list_dirents(path)
            if block is None:
                return None
            packed = _PackedPages([item[3] for item in self._listing_head(path, own)], block)
            with self._node_listings_lock:
                self._packed[node] = packed
                while len(self._packed) > NODE_LISTINGS_MAX:
                    self._packed.popitem(last=False)
            self._mark_names_only(node)
        if offset >= packed.count:  # the page after the last one
            with self._node_listings_lock:
                self._packed.pop(node, None)
            return b""
        return packed.page(offset, size)

    def _row_records(
        self, path: str, after: Optional[bytes], limit: int, index: int, node: int, prefix: str, full: bool
    ) -> Optional[List[Listed]]:
        """The records of folder ``node`` (``path``) from its plain rows: at most ``limit``
        entries after the name ``after`` (a source listing a part at a time; others list all),
        the first at position ``index``. None when an entry has no inode number of its own.

        Not ``full`` (a listing for another process than our prefetcher): files get node id 0
        and no attributes, from a narrower query. A ``find`` then costs the kernel no inode per
        file and us half the work; a process that stats the files after listing them makes a
        run of lookups, for which the prefetcher lists the folder again in full (see
        ``_follow_run``), and after which every listing is made in full (``listings_in_full``)."""
        if not self._paged:
            rows = self.source.list_stat_rows(path)
        else:
            if not full:
                names = self.source.list_name_rows_after(path, after, limit)
                if names is None:
                    raise _errno(errno.ENOTDIR)
                if all(1 < ino < STABLE_LIMIT and not stat.S_ISDIR(mode) for _name, mode, ino in names):
                    only = abi.direntplus_name_only
                    numbered = enumerate(names, index + 1)
                    return [(name, "", None, only(i, name, ino, mode)) for i, (name, mode, ino) in numbered]
            rows = self.source.list_stat_rows_after(path, after, limit)
        if rows is None:
            raise _errno(errno.ENOTDIR)
        if not all(1 < row[7] < STABLE_LIMIT for row in rows):
            return None
        return self._records_of_rows(rows, index, node, prefix, full)

    def _records_of_rows(self, rows: Sequence[StatRow], index: int, node: int, prefix: str, full: bool) -> List[Listed]:
        """The READDIRPLUS records of ``rows`` of folder ``node`` (path ``prefix`` + name), the
        first at position ``index`` of the listing."""
        waiting = self._waiting.get(node)
        ahead = self._ahead
        left_out = ahead.claim(node) if full and ahead is not None and ahead.pending else ()
        folders = self._listed_folders
        if len(folders) > LISTED_FOLDERS_MAX:  # (a large folder's parts: checked for each)
            folders.clear()
        timeout = self._timeout
        plus_of = abi.direntplus_of
        records: List[Listed] = []
        offset = index
        for raw, mode, size, mtime_ns, uid, gid, nlink, ino, rdev, blocks in rows:
            offset += 1
            # (node id 0: the kernel links nothing for it)
            given = 0 if raw == waiting or raw in left_out or not (full or stat.S_ISDIR(mode)) else ino
            record = plus_of(given, timeout, offset, raw, ino, mode, size, mtime_ns, uid, gid, nlink, rdev, blocks)
            records.append((raw, "", None, record))
            if stat.S_ISDIR(mode):
                folders[ino] = prefix + raw.decode(ENCODING, "surrogateescape")
        return records

    def _listing_of(self, node: int, offset: int, full: bool = True) -> Listing:
        """The listing of a folder the kernel reads without having opened it (no OPENDIR): made
        for the first page and kept until the page after the last (the kernel reads until it
        gets an empty one), a few folders at a time."""
        listings = self._node_listings
        listing = None if offset == 0 else listings.get(node)
        if listing is None:
            listing = self._make_listing(node, full)
            with self._node_listings_lock:
                listings[node] = listing
                while len(listings) > NODE_LISTINGS_MAX:
                    listings.popitem(last=False)
        if not isinstance(listing, PagedListing) and offset >= len(listing):
            with self._node_listings_lock:
                listings.pop(node, None)
        return listing

    def readdir(self, node: int, handle: int, size: int, offset: int, plus: bool, full: bool = True) -> bytes:
        """One page of the listing from entry ``offset`` on, at most ``size`` bytes. With
        ``plus``, entries carry their attributes and a node id the kernel now holds."""
        full = full or self.listings_in_full
        ahead = self._ahead
        if ahead is not None and ahead.pending and offset > 2 and full:
            ahead.linked(node, offset)
        if plus and not full and handle == 0 and self._stable:
            packed = self._packed_page(node, size, offset)
            if packed is not None:
                return packed
        found = self._listing_of(node, offset, full) if handle == 0 else self._listings.get(handle)
        if found is None:
            raise _errno(errno.EBADF)
        if isinstance(found, PagedListing):  # the part from ``offset`` on, as if from position 0
            listing: Sequence[Listed] = found.entries_from(offset)
            start = 0
            if not listing and handle == 0:  # the page after the last one
                with self._node_listings_lock:
                    self._node_listings.pop(node, None)
        else:
            listing, start = found, offset
        end = start + self._page_length(listing, start, size, plus)
        page = listing[start:end]
        if not plus:
            # A READDIRPLUS record ends with the plain record (its node id and attributes cut).
            return b"".join(
                record[abi.ENTRY_SIZE :]
                if record
                else abi.dirent(info.ino or self._shown_ino(0, info) or UNKNOWN_INO, index, name, info.mode)  # type: ignore[union-attr,arg-type]
                for index, (name, _path, info, record) in enumerate(page, start=offset + 1)
            )
        identity = self.source.host_identity
        missing = [(path, info and identity(info), _kind(info)) for _name, path, info, record in page if not record]
        if not missing:
            return b"".join(item[3] for item in page)
        nodes = iter(self.nodes.remember_all(missing))
        timeout_of = self._timeout_of
        records = []
        for index, (name, _path, info, record) in enumerate(page, start=offset + 1):
            if not record:
                assert info is not None  # (only entries named by the table lack a record)
                node = next(nodes)
                record = abi.direntplus(
                    node, info, timeout_of(info), index, name, info.ino or self._shown_ino(node, info)
                )
            records.append(record)
        return b"".join(records)

    @staticmethod
    def _page_length(listing: Sequence[Listed], start: int, size: int, plus: bool) -> int:
        """How many entries from ``start`` on fit into a page of ``size`` bytes."""
        lengths = [len(item[3]) for item in listing[start:]]
        if all(lengths):  # every record made (a listing from plain rows): their sizes, added up
            if not plus:  # (a READDIR record is the tail of its READDIRPLUS record)
                lengths = [length - abi.ENTRY_SIZE for length in lengths]
            return bisect.bisect_right(list(itertools.accumulate(lengths)), size)
        used = 0
        end = start
        count = len(listing)
        while end < count:
            name, _path, _info, record = listing[end]
            need = (abi.DIRENT_HEAD_SIZE + len(name) + 7) & ~7
            if plus:
                need = len(record) if record else need + abi.ENTRY_SIZE
            if used + need > size:
                break
            used += need
            end += 1
        return end - start

    def releasedir(self, handle: int) -> None:
        self._listings.pop(handle, None)


__all__ = ["LowLevelOperations", "ROOT_ID", "TIMEOUT"]

"""libfuse 3's low-level API through ctypes.

Why not only mfusepy (libfuse's high-level API): the high-level library names files by path, so
it keeps a node per name the kernel knows (built again for every READDIRPLUS entry), resolves a
path for every request, and hands listings to us one entry per C callback. Here the kernel's node
ids map straight to our paths (``inodes.py``), replies are packed in Python in the kernel's own
layout (``kernel_abi.py``) and a whole listing page is one reply. mfusepy stays the fallback for
libfuse 2, for libfuse options only its high-level library knows, and when this module cannot
bind the library (``--fuse-api high`` selects it).

Every callback runs on a libfuse worker thread; Python code is entered through ctypes callbacks
whose thread state is pinned for the life of the worker (see ``fuse_compat.FUSE._wrapper``).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Set

from ratarmountcore.errors import RatarmountError

from . import kernel_abi as abi
from . import parallel_dirops
from .capabilities import (
    FUSE_CAP_NO_OPEN_SUPPORT,
    FUSE_CAP_NO_OPENDIR_SUPPORT,
    FUSE_CAP_PARALLEL_DIROPS,
    wanted_capabilities,
)
from .errnos import errno_of
from .lowlevel_ops import LowLevelOperations
from .read_handoff import ReadHandOff
from .session_loop import run_loop, signals_deferred, stop_signals
from .workers import LOOP_OPTIONS

logger = logging.getLogger(__name__)

#: READ replies at least this large are written with the GIL released (see ``_load_library``).
RELEASED_REPLY = 64 * 1024
#: Read buffer per worker thread (the kernel asks for at most 1 MiB with libfuse 3's defaults).
READ_BUFFER = 1024 * 1024 + 4096
#: Largest file whose data is put into the kernel's page cache when Python opens it (``ioctl``):
#: what the first READ of a file asks for at most (the mount's read-ahead is 1 MiB, too).
STORE_MAX = 1024 * 1024

#: Options of libfuse's high-level library (``fuse_new``) that ``fuse_session_new`` rejects. The
#: ones we implement ourselves are dropped; any other one makes us use the high-level API.
IMPLEMENTED_HIGH_LEVEL_OPTIONS = frozenset(
    {"kernel_cache", "attr_timeout", "entry_timeout", "negative_timeout", "use_ino", "readdir_ino", "nonempty"}
)
OTHER_HIGH_LEVEL_OPTIONS = frozenset(
    {
        "auto_cache",
        "noauto_cache",
        "ac_attr_timeout",
        "umask",
        "uid",
        "gid",
        "direct_io",
        "hard_remove",
        "nopath",
        "intr",
        "intr_signal",
        "modules",
        "remember",
        "noforget",
    }
)

fuse_req_t = ctypes.c_void_p
fuse_ino_t = ctypes.c_uint64


class FileInfo(ctypes.Structure):
    """The leading fields of ``struct fuse_file_info`` (flags, bit fields, fh)."""

    _fields_ = [
        ("flags", ctypes.c_int),
        ("bits", ctypes.c_uint),
        ("padding2", ctypes.c_uint),
        ("fh", ctypes.c_uint64),
        ("lock_owner", ctypes.c_uint64),
        ("poll_events", ctypes.c_uint32),
    ]


class ConnInfo(ctypes.Structure):
    """The leading fields of ``struct fuse_conn_info``."""

    _fields_ = [
        ("proto_major", ctypes.c_uint),
        ("proto_minor", ctypes.c_uint),
        ("max_write", ctypes.c_uint),
        ("max_read", ctypes.c_uint),
        ("max_readahead", ctypes.c_uint),
        ("capable", ctypes.c_uint),
        ("want", ctypes.c_uint),
    ]


class Context(ctypes.Structure):
    """``struct fuse_ctx``: who made a request."""

    _fields_ = [("uid", ctypes.c_uint32), ("gid", ctypes.c_uint32), ("pid", ctypes.c_int32), ("umask", ctypes.c_uint32)]


class ForgetData(ctypes.Structure):
    _fields_ = [("ino", ctypes.c_uint64), ("nlookup", ctypes.c_uint64)]


class Args(ctypes.Structure):
    _fields_ = [("argc", ctypes.c_int), ("argv", ctypes.POINTER(ctypes.c_char_p)), ("allocated", ctypes.c_int)]


FI = ctypes.POINTER(FileInfo)
INIT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ConnInfo))
DESTROY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
LOOKUP = ctypes.CFUNCTYPE(None, fuse_req_t, fuse_ino_t, ctypes.c_char_p)
FORGET = ctypes.CFUNCTYPE(None, fuse_req_t, fuse_ino_t, ctypes.c_uint64)
NODE_FI = ctypes.CFUNCTYPE(None, fuse_req_t, fuse_ino_t, FI)  # getattr, open, release, opendir, releasedir
NODE = ctypes.CFUNCTYPE(None, fuse_req_t, fuse_ino_t)  # readlink, statfs
READ = ctypes.CFUNCTYPE(None, fuse_req_t, fuse_ino_t, ctypes.c_size_t, ctypes.c_int64, FI)  # read, readdir(plus)
FORGET_MULTI = ctypes.CFUNCTYPE(None, fuse_req_t, ctypes.c_size_t, ctypes.POINTER(ForgetData))
IOCTL = ctypes.CFUNCTYPE(
    None, fuse_req_t, fuse_ino_t, ctypes.c_uint, ctypes.c_void_p, FI, ctypes.c_uint,
    ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t,
)  # fmt: skip
LSEEK = ctypes.CFUNCTYPE(None, fuse_req_t, fuse_ino_t, ctypes.c_int64, ctypes.c_int, FI)
#: The ioctl of ``isatty``
TCGETS = 0x5401

#: ``struct fuse_lowlevel_ops`` in libfuse 3 order (all function pointers).
OPERATION_NAMES = (
    "init destroy lookup forget getattr setattr readlink mknod mkdir unlink rmdir symlink rename link "
    "open read write flush release fsync opendir readdir releasedir fsyncdir statfs setxattr getxattr "
    "listxattr removexattr access create getlk setlk bmap ioctl poll write_buf retrieve_reply "
    "forget_multi flock fallocate readdirplus copy_file_range lseek"
).split()


class Operations(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p) for name in OPERATION_NAMES]


def _load_library() -> Any:
    name = os.environ.get("FUSE_LIBRARY_PATH")
    try:
        # The usual soname first: ctypes.util.find_library runs ldconfig and pulls in subprocess
        # (about 1 MiB more resident in the daemon).
        lib = ctypes.CDLL(name or "libfuse3.so.3")
    except OSError:
        if name:
            raise
        from ctypes.util import find_library

        found = find_library("fuse3")
        if not found:
            raise OSError("libfuse 3 not found") from None
        lib = ctypes.CDLL(found)
    lib.fuse_session_new.restype = ctypes.c_void_p
    lib.fuse_session_new.argtypes = [ctypes.POINTER(Args), ctypes.POINTER(Operations), ctypes.c_size_t, ctypes.c_void_p]
    lib.fuse_session_mount.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.fuse_session_unmount.argtypes = [ctypes.c_void_p]
    lib.fuse_session_destroy.argtypes = [ctypes.c_void_p]
    lib.fuse_session_exit.argtypes = [ctypes.c_void_p]
    # Replies keep the GIL (``PyDLL``): a reply is one short write to /dev/fuse, and releasing
    # and taking the GIL back around it made busy workers hand it to each other twice more per
    # request (see ``docs/design.md``, "Threading model").
    replies = ctypes.PyDLL(lib._name, handle=lib._handle)
    replies.fuse_reply_buf.argtypes = [fuse_req_t, ctypes.c_void_p, ctypes.c_size_t]
    replies.fuse_reply_err.argtypes = [fuse_req_t, ctypes.c_int]
    replies.fuse_reply_none.argtypes = [fuse_req_t]
    replies.fuse_reply_none.restype = None
    replies.fuse_reply_lseek.argtypes = [fuse_req_t, ctypes.c_int64]
    # ``lib``'s own binding (``CDLL``) releases the GIL: for large READ replies, whose copy
    # into the reader's pages takes long enough for another worker to run meanwhile.
    lib.fuse_reply_buf_released = lib.fuse_reply_buf  # type: ignore[attr-defined]
    lib.fuse_reply_buf_released.argtypes = [fuse_req_t, ctypes.c_void_p, ctypes.c_size_t]
    replies.fuse_req_ctx.argtypes = [fuse_req_t]
    replies.fuse_req_ctx.restype = ctypes.POINTER(Context)
    lib.fuse_lowlevel_notify_inval_inode.argtypes = [ctypes.c_void_p, fuse_ino_t, ctypes.c_int64, ctypes.c_int64]
    for function in ("fuse_reply_buf", "fuse_reply_err", "fuse_reply_none", "fuse_reply_lseek", "fuse_req_ctx"):
        setattr(lib, function, getattr(replies, function))
    lib.fuse_loop_cfg_create.restype = ctypes.c_void_p
    lib.fuse_loop_cfg_destroy.argtypes = [ctypes.c_void_p]
    lib.fuse_loop_cfg_set_max_threads.argtypes = [ctypes.c_void_p, ctypes.c_uint]
    lib.fuse_loop_cfg_set_idle_threads.argtypes = [ctypes.c_void_p, ctypes.c_uint]
    lib.fuse_session_loop_mt_312.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.fuse_session_fd.argtypes = [ctypes.c_void_p]
    lib.fuse_session_fd.restype = ctypes.c_int
    lib.fuse_session_process_buf.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.fuse_session_process_buf.restype = None
    return lib


_LIBRARY: Optional[Any] = None
_LOAD_ERROR: Optional[BaseException] = None


def library() -> Optional[Any]:
    """libfuse 3 with the functions we use (3.12 or later), or None."""
    global _LIBRARY, _LOAD_ERROR
    if _LIBRARY is None and _LOAD_ERROR is None:
        try:
            _LIBRARY = _load_library()
        except (OSError, AttributeError) as exc:
            _LOAD_ERROR = exc
            logger.debug("libfuse low-level API unavailable: %s", exc)
    return _LIBRARY


def library_version() -> Optional[str]:
    """libfuse's own version string (e.g. "3.14.0") when the low-level API can be used."""
    lib = library()
    if lib is None:
        return None
    lib.fuse_pkgversion.restype = ctypes.c_char_p
    return str(lib.fuse_pkgversion().decode())


def usable(fuse_options: Dict[str, Any]) -> bool:
    """Whether the low-level front-end can serve a mount with these ``-o`` options."""
    unknown = sorted(set(fuse_options) & OTHER_HIGH_LEVEL_OPTIONS)
    if unknown:
        logger.debug("using libfuse's high-level API for the options %s", ", ".join(unknown))
        return False
    return library() is not None


def session_arguments(fuse_options: Dict[str, Any], fsname: str, debug: bool) -> List[bytes]:
    options = {"ro": True, "fsname": fsname, "subtype": "ratarmount", "default_permissions": True}
    for key, value in fuse_options.items():
        if key in IMPLEMENTED_HIGH_LEVEL_OPTIONS:
            logger.debug("-o %s: implied by the low-level front-end", key)
            continue
        if key in LOOP_OPTIONS:
            continue  # see loop_threads
        options[key] = value
    text = ",".join(key if value is True else f"{key}={value}" for key, value in options.items() if value is not False)
    arguments = [b"ratarmount", b"-o", os.fsencode(text)]  # values may hold names that are not UTF-8
    if debug:
        arguments.append(b"-d")
    return arguments


class LowLevelFuse:
    """Mount ``operations`` at ``mountpoint`` and serve until unmounted or signalled."""

    def __init__(self, operations: LowLevelOperations, max_threads: int = 2, idle_threads: int = 2) -> None:
        lib = library()
        if lib is None:
            raise RatarmountError(f"libfuse 3 cannot be used: {_LOAD_ERROR}")
        self.lib = lib
        self.ops = operations
        self.max_threads = max_threads
        # A lookup that waits for a listing needs another worker to serve it (lowlevel_ops).
        operations.lookups_may_wait = max_threads >= 2
        #: Whether libfuse asks for parallel folder operations itself (else ``serve`` patches
        #: its answer to FUSE_INIT, see ``parallel_dirops.py``).
        self._libfuse_asks_parallel_dirops = parallel_dirops.libfuse_passes_it(library_version() or "")
        self.idle_threads = idle_threads
        #: READs answered off the workers once they would all be reading (``read_handoff.py``).
        self.reads = ReadHandOff(max_threads, max(2, max_threads))
        self._pinned: Set[int] = set()
        #: The FUSE device, for data stored in the kernel's page cache unasked (-1: none).
        self._device = -1
        #: Stores at once (None: none): all workers but one, so that one is always free for the
        #: READ a store may wait for (a loader's reader processes, each storing its files).
        self._stores: Optional[threading.BoundedSemaphore] = None
        self._local = threading.local()
        self._callbacks: List[Any] = []
        self._table = self._build_table()

    # --- helpers ------------------------------------------------------------------------------
    def _pin(self) -> None:
        # ctypes would create and destroy a Python thread state around every callback from a
        # libfuse worker: keep one alive per worker instead.
        ident = threading.get_ident()
        if ident not in self._pinned:
            ctypes.pythonapi.PyGILState_Ensure()
            self._pinned.add(ident)

    def _invalidate(self, session: int, node: int) -> None:
        # Offset 0, length 0: all of the folder's cached listing.
        result = self.lib.fuse_lowlevel_notify_inval_inode(session, node, 0, 0)
        if result != 0:
            logger.debug("invalidating node %d: %s", node, os.strerror(-result))

    def _reply(self, req: int, payload: bytes) -> None:
        self.lib.fuse_reply_buf(req, payload, len(payload))

    def _fail(self, req: int, exc: BaseException, what: str) -> None:
        code = errno_of(exc)
        if code == errno.EIO and not getattr(exc, "logged", False):  # (some are logged once, where found)
            logger.error("%s failed: %s", what, exc, exc_info=logger.isEnabledFor(logging.DEBUG))
        self.lib.fuse_reply_err(req, code)

    def _buffer(self, size: int) -> Any:
        """This worker's read buffer: an anonymous mapping, so only the pages reads have used
        are resident (a zeroed bytearray would make the whole buffer resident per worker)."""
        local = self._local
        holder = getattr(local, "buffer", None)
        if holder is None or len(holder[0]) < size:
            data = mmap.mmap(-1, max(size, READ_BUFFER))
            holder = local.buffer = (data, ctypes.addressof(ctypes.c_char.from_buffer(data)))
        return holder

    # --- the operations table -----------------------------------------------------------------
    def _build_table(self) -> Operations:  # noqa: C901 - one closure per operation, kept together
        ops = self.ops
        lib = self.lib
        pin = self._pin
        reply = self._reply
        fail = self._fail

        def init(_userdata: Any, conn: Any) -> None:
            pin()
            try:
                info = conn.contents
                capable = info.capable
                info.want = wanted_capabilities(info.want, capable, ops.source.is_immutable)
                if self._libfuse_asks_parallel_dirops:
                    ops.parallel_dirops = bool(capable & info.want & FUSE_CAP_PARALLEL_DIROPS)
                    parallel_dirops.log_outcome(ops.parallel_dirops)
                # Opens without messages keep the kernel's caches of the files and listings:
                # only for an immutable source (a folder may change).
                immutable = ops.source.is_immutable
                ops.init(
                    immutable and bool(capable & FUSE_CAP_NO_OPEN_SUPPORT),
                    immutable and bool(capable & FUSE_CAP_NO_OPENDIR_SUPPORT),
                )
            except BaseException as exc:  # noqa: BLE001 - never let an exception cross into C
                logger.error("init failed: %s", exc)

        def destroy(_userdata: Any) -> None:
            pin()
            ops.destroy()

        def lookup(req: int, parent: int, name: bytes) -> None:
            pin()
            try:
                reply(req, ops.lookup(parent, name))
            except BaseException as exc:  # noqa: BLE001
                fail(req, exc, f"lookup of {name!r}")
            ops.after_reply()

        def forget(req: int, node: int, count: int) -> None:
            pin()
            try:
                ops.forget(node, count)
            finally:
                lib.fuse_reply_none(req)

        def forget_multi(req: int, count: int, items: Any) -> None:
            pin()
            try:
                # The array of (node, count) pairs copied as one bytes object and seen as u64s: no
                # ctypes object per item, and no ctypes type per count (`c_uint64 * n` and its
                # POINTER are cached by ctypes for good: a type per distinct batch size leaked).
                flat = memoryview(ctypes.string_at(items, 16 * count)).cast("Q")
                ops.forget_all(flat[0::2].tolist(), flat[1::2].tolist())
            finally:
                lib.fuse_reply_none(req)

        def getattr_(req: int, node: int, _fi: Any) -> None:
            pin()
            try:
                reply(req, ops.getattr(node))
            except BaseException as exc:  # noqa: BLE001
                fail(req, exc, f"getattr of node {node}")

        def readlink(req: int, node: int) -> None:
            pin()
            try:
                reply(req, ops.readlink(node))
            except BaseException as exc:  # noqa: BLE001
                fail(req, exc, f"readlink of node {node}")

        def statfs(req: int, _node: int) -> None:
            pin()
            try:
                reply(req, ops.statfs())
            except BaseException as exc:  # noqa: BLE001
                fail(req, exc, "statfs")

        def open_(req: int, node: int, fi: Any) -> None:
            pin()
            try:
                reply(req, ops.open(node, fi.contents.flags))
            except BaseException as exc:  # noqa: BLE001
                fail(req, exc, f"open of node {node}")

        reads = self.reads

        def answer_read(req: int, node: int, size: int, offset: int, handle: int) -> None:
            try:
                data, address = self._buffer(size)
                count = ops.read(node, handle, offset, memoryview(data)[:size])
                (lib.fuse_reply_buf_released if count >= RELEASED_REPLY else lib.fuse_reply_buf)(req, address, count)
            except BaseException as exc:  # noqa: BLE001
                fail(req, exc, f"read of node {node}")

        def read(req: int, node: int, size: int, offset: int, fi: Any) -> None:
            pin()
            # (the handle is read here: ``fi`` is gone once this callback returns)
            reads.run(answer_read, req, node, size, offset, fi.contents.fh)

        def ioctl(req: int, node: int, cmd: int, *_rest: Any) -> None:
            """No ioctl is supported (ENOTTY, as the kernel makes of ENOSYS). The one that
            Python's ``open()`` sends (``isatty``) first puts a small file's data into the
            kernel's page cache: the READ that follows is then answered by the kernel."""
            pin()
            try:
                fd, stores = self._device, self._stores
                if cmd == TCGETS and stores is not None and stores.acquire(blocking=False):
                    # (A store waits for any READ of the same pages in flight, which another
                    # worker must be free to answer; a store that would exceed the limit is
                    # left out, its READ comes as before.)
                    try:
                        data, _address = self._buffer(STORE_MAX)
                        view = memoryview(data)
                        count = ops.data_for_open(node, view[:STORE_MAX])
                        if count:
                            os.writev(fd, (abi.notify_store(node, 0, count), view[:count]))
                    finally:
                        stores.release()
            except BaseException as exc:  # noqa: BLE001 - the READ that follows reports errors
                # (By its type only: the READ logs the message, once, as it does for any read.)
                logger.debug("storing the data of node %d failed (%s); its READ tells", node, type(exc).__name__)
            lib.fuse_reply_err(req, errno.ENOTTY)

        def lseek(req: int, node: int, offset: int, whence: int, _fi: Any) -> None:
            pin()
            try:
                lib.fuse_reply_lseek(req, ops.lseek(node, offset, whence))
            except BaseException as exc:  # noqa: BLE001
                fail(req, exc, f"lseek of node {node}")

        def release(req: int, _node: int, fi: Any) -> None:
            pin()
            try:
                ops.release(fi.contents.fh)
            finally:
                lib.fuse_reply_err(req, 0)

        prefetcher = ops.prefetcher
        request_context = lib.fuse_req_ctx

        def for_prefetcher(req: int) -> bool:
            """Whether a listing is for our prefetcher (made in full), or without one."""
            return prefetcher is None or request_context(req).contents.pid in prefetcher.thread_ids

        def opendir(req: int, node: int, _fi: Any) -> None:
            pin()
            try:
                reply(req, ops.opendir(node, for_prefetcher(req)))
            except BaseException as exc:  # noqa: BLE001
                fail(req, exc, f"opendir of node {node}")

        def listing(plus: bool) -> Callable[[int, int, int, int, Any], None]:
            def readdir(req: int, node: int, size: int, offset: int, fi: Any) -> None:
                pin()
                try:
                    ours = for_prefetcher(req)
                    page = ops.readdir(node, fi.contents.fh, size, offset, plus, ours)
                    if ours and prefetcher is not None:
                        # (The GIL released: the reply wakes our prefetcher's thread, which then
                        # links the page's entries in the kernel, ~0.5 ms for 100; woken on this
                        # CPU, it kept the worker from running, GIL held, for all that time.)
                        lib.fuse_reply_buf_released(req, page, len(page))
                    else:
                        reply(req, page)
                except BaseException as exc:  # noqa: BLE001
                    fail(req, exc, "readdir")

            return readdir

        def releasedir(req: int, _node: int, fi: Any) -> None:
            pin()
            try:
                ops.releasedir(fi.contents.fh)
            finally:
                lib.fuse_reply_err(req, 0)

        table = Operations()
        for name, prototype, function in (
            ("init", INIT, init),
            ("destroy", DESTROY, destroy),
            ("lookup", LOOKUP, lookup),
            ("forget", FORGET, forget),
            ("forget_multi", FORGET_MULTI, forget_multi),
            ("getattr", NODE_FI, getattr_),
            ("readlink", NODE, readlink),
            ("statfs", NODE, statfs),
            ("open", NODE_FI, open_),
            ("read", READ, read),
            ("release", NODE_FI, release),
            ("opendir", NODE_FI, opendir),
            ("readdir", READ, listing(False)),
            ("readdirplus", READ, listing(True)),
            ("releasedir", NODE_FI, releasedir),
            ("ioctl", IOCTL, ioctl),
            ("lseek", LSEEK, lseek),
        ):
            callback = prototype(function)
            self._callbacks.append(callback)
            setattr(table, name, ctypes.cast(callback, ctypes.c_void_p))
        return table

    # --- session ------------------------------------------------------------------------------
    def serve(self, mountpoint: str, arguments: Sequence[bytes]) -> None:
        """Mount, run the multi-threaded loop until unmounted or SIGINT/SIGTERM/SIGHUP, unmount. A
        signal is raised once the mount is gone (``KeyboardInterrupt``; ``Terminated`` for SIGTERM
        and SIGHUP): the caller tells a mount ended after it was ready from an interrupted one."""
        lib = self.lib
        argv = (ctypes.c_char_p * (len(arguments) + 1))(*arguments, None)
        args = Args(len(arguments), argv, 0)
        session = lib.fuse_session_new(ctypes.byref(args), ctypes.byref(self._table), ctypes.sizeof(Operations), None)
        if not session:
            raise RatarmountError(f"cannot mount at {mountpoint}: libfuse rejected the options (see the message above)")
        with stop_signals():
            try:
                self._mounted_loop(session, mountpoint)
            finally:
                self.reads.close()
                with signals_deferred():  # (libfuse calls ``destroy`` from here)
                    lib.fuse_session_destroy(session)

    def _mounted_loop(self, session: int, mountpoint: str) -> None:
        lib = self.lib
        try:  # (libfuse's unmount does nothing when the mount failed)
            if lib.fuse_session_mount(session, os.fsencode(mountpoint)) != 0:
                raise RatarmountError(f"cannot mount at {mountpoint} (see the message above)")
            if self.max_threads >= 2:  # (only entries that cannot change are stored: data_for_open)
                self._device = lib.fuse_session_fd(session)
                self._stores = threading.BoundedSemaphore(self.max_threads - 1)
            if self.ops.prefetcher is not None:
                self.ops.prefetcher.invalidate = lambda node: self._invalidate(session, node)
            if not self._libfuse_asks_parallel_dirops:
                with signals_deferred():  # (libfuse calls ``init`` from here)
                    self.ops.parallel_dirops = parallel_dirops.negotiate(lib, session)
            config = lib.fuse_loop_cfg_create()
            try:
                lib.fuse_loop_cfg_set_max_threads(config, self.max_threads)
                lib.fuse_loop_cfg_set_idle_threads(config, self.idle_threads)
                # SIGINT/SIGTERM/SIGHUP end the loop from Python (see session_loop.py),
                # not through libfuse's signal handlers.
                run_loop(
                    lambda: lib.fuse_session_loop_mt_312(session, config),
                    lambda: lib.fuse_session_exit(session),
                )
            finally:
                lib.fuse_loop_cfg_destroy(config)
        finally:
            lib.fuse_session_unmount(session)

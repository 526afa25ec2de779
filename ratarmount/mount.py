"""Mounting: open the sources, start FUSE, daemonize once the mount is ready.

Daemon protocol: the parent forks before opening anything (no SQLite connection or decompressor
thread crosses a fork). The child opens the sources -- building the index with a progress bar on
the inherited stderr -- and mounts. libfuse calls ``init`` once the kernel has the mount; the
child then writes one NUL byte into a pipe and detaches its stdio. Anything else on the pipe is an
error message for the parent to print; EOF without the NUL byte means the child died.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import signal
import stat
import sys
import threading
from typing import Callable, Dict, Optional, Sequence, Union

from ratarmountcore.errors import RatarmountError
from ratarmountcore.index.locations import check_named_folders
from ratarmountcore.io.descriptors import check_left, raise_soft_limit
from ratarmountcore.sources.factory import open_source

from .cli import MountOptions, check_mountpoint
from .daemon_log import SYSLOG_SOCKET, route_background_logs
from .mountpoint_lock import MountpointLock
from .termination import STOPPED_STATUSES, default_signal_handlers, ended_by, exit_status
from .workers import default_max_threads

logger = logging.getLogger(__name__)

READY = b"\0"


#: Descriptors a session needs beyond what its sources hold.
SESSION_DESCRIPTORS = 32


def describe_sources(sources: Sequence[str]) -> str:
    """``a.tar`` or ``a.tar and 199 more``, for messages."""
    more = len(sources) - 1
    return sources[0] + (f" and {more} more" if more else "")


def fsname_for(source_label: str) -> str:
    """The file system name ``mount``/``df`` show (commas would split libfuse's option string).
    Bytes of a file name that are not UTF-8 become U+FFFD: the name is for people to read."""
    label = os.fsencode(source_label).decode("utf-8", "replace")
    return f"ratarmount:{label}"[:200].replace(",", "_")


def fuse_kwargs(options: MountOptions, source_label: str, immutable: bool = True) -> Dict[str, Union[str, bool]]:
    """``immutable``: False for a mount that shows a folder, whose files may change: the kernel
    keeps what it learned for a second, and no pages across opens."""
    timeout = "86400" if immutable else "1"
    kwargs: Dict[str, Union[str, bool]] = {
        "ro": True,
        "fsname": fsname_for(source_label),
        "subtype": "ratarmount",
        "use_ino": True,
        "default_permissions": True,
        # The tree never changes while mounted: let the kernel cache pages, attributes, entries
        # and misses for a day.
        "kernel_cache": immutable,
        "attr_timeout": timeout,
        "entry_timeout": timeout,
        "negative_timeout": timeout,
    }
    from .fuse_compat import fuse

    version = (getattr(fuse, "fuse_version_major", 2), getattr(fuse, "fuse_version_minor", 0))
    if fuse is not None and version >= (3, 12):
        # As for the low-level front-end (see workers.py): 8 readers on 2 cores took 0.58 s with
        # 2 threads, 0.96 s with 32 (libfuse 3.14 warns when these are left at their defaults;
        # before 3.12 there is no max_threads option, and an unknown option fails the mount).
        threads = str(default_max_threads(options.sources))
        kwargs["max_threads"] = threads
        kwargs["max_idle_threads"] = threads
    kwargs.update(options.fuse_options)
    kwargs.pop("nonempty", None)  # checked by us; libfuse 3 rejects it
    return kwargs


#: Blocks at least this large get their own mapping and go back to the OS when freed. Decoded
#: spans and frames (1-4 MiB) stay below it and reuse heap memory: mapping each afresh costs a
#: page fault per 4 KiB, which took a quarter of the daemon's CPU when reading a large tar.gz
#: sequentially (256 KiB threshold) and doubled the cost of a random read from a .tar.zst of
#: 4 MiB frames (1,000 reads 4.4 -> 6.9 s with a 4 MiB threshold). Fixed, so glibc does not
#: move it on its own. Until session 5 it was 64 MiB: every 24 MiB xz block then came from
#: per-thread heaps that never shrink (136 MiB resident after reading a 100 MB .tar.xz once;
#: 72 MiB with this threshold).
MMAP_THRESHOLD = 8 * 1024 * 1024


def set_read_ahead(mountpoint: str, kib: int) -> None:
    """Raise the kernel's read-ahead for the mount (FUSE starts at 128 KiB, and libfuse can only
    lower it): sequential reads of large members then arrive as 1 MiB requests instead of
    128 KiB ones. Only root may write sysfs; anyone else keeps the default (logged)."""
    try:
        device = os.stat(mountpoint).st_dev
        path = f"/sys/class/bdi/{os.major(device)}:{os.minor(device)}/read_ahead_kb"
        with open(path, "w") as f:
            f.write(str(kib))
        logger.debug("read-ahead of %s set to %d KiB", mountpoint, kib)
    except OSError as exc:
        logger.debug("read-ahead of %s left at the kernel's default: %s", mountpoint, exc)


def _tame_malloc() -> None:
    """Give freed decompression buffers back to the OS.

    glibc raises its mmap threshold each time a large block is freed, after which multi-MiB
    buffers (decoded frames, chunks) come from per-thread heaps that never shrink: a daemon that
    served a few concurrent reads keeps hundreds of MiB. A fixed threshold (which also turns the
    dynamic adjustment off) and two arenas keep the resident size close to what is in use.
    """
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, MMAP_THRESHOLD)  # M_MMAP_THRESHOLD
        libc.mallopt(-8, 2)  # M_ARENA_MAX
    except (OSError, AttributeError):  # not glibc
        pass


def _use_low_level(options: MountOptions) -> bool:
    if options.fuse_api == "high":
        return False
    from . import lowlevel

    if options.fuse_api == "low":
        if lowlevel.library() is None:
            raise RatarmountError("--fuse-api low needs libfuse 3.12 or later")
        return True
    return lowlevel.usable(options.fuse_options)


def run_fuse(
    options: MountOptions,
    on_ready: Optional[Callable[[], None]],
    before_mount: Optional[Callable[[], None]] = None,
) -> None:
    _tame_malloc()
    raise_soft_limit()  # a union of a thousand archives needs two thousand descriptors
    source = open_source(options.sources, options.open_options)
    label = os.path.basename(options.sources[0]) + ("" if len(options.sources) == 1 else ",...")
    point = MountpointLock(options.mountpoint)
    try:
        # What was opened may leave too few descriptors for the session itself (/dev/fuse, its
        # negotiation, the folder prefetcher, a thread's index connection): said now, in one line.
        check_left(f"mounting {describe_sources(options.sources)}", SESSION_DESCRIPTORS)
        # Again, once the index is built (seconds may have passed): another mount made at the same
        # point meanwhile would be stacked over, or under, this one. Under the point's lock until
        # the session serves (``mountpoint_lock.py``): a mount checking meanwhile waits.
        point.acquire()
        check_mountpoint(options.mountpoint, options.fuse_options)
        if before_mount is not None:
            before_mount()
        mounted = []

        def tune_then_report() -> None:
            # Its stat of the mount point is answered only once the session serves requests,
            # hence a thread of its own (init must return first).
            set_read_ahead(options.mountpoint, options.read_ahead_kib)
            if on_ready is not None:
                on_ready()

        def ready() -> None:
            mounted.append(True)
            point.release()
            try:
                source.expect_reads()  # (returns at once)
            except Exception as exc:  # noqa: BLE001 - a hint; the reads will say what is wrong
                logger.debug("No decoding ahead: %s", exc)
            if options.read_ahead_kib > 0:
                threading.Thread(target=tune_then_report, name="ratarmount-tune", daemon=True).start()
            elif on_ready is not None:
                on_ready()

        if _use_low_level(options):
            from .folder_prefetch import FolderPrefetcher
            from .lowlevel import LowLevelFuse, session_arguments
            from .lowlevel_ops import LowLevelOperations
            from .workers import loop_threads

            prefetcher = FolderPrefetcher(os.path.abspath(options.mountpoint))
            max_threads, idle_threads = loop_threads(options.fuse_options, options.sources)
            try:
                LowLevelFuse(LowLevelOperations(source, ready, prefetcher), max_threads, idle_threads).serve(
                    options.mountpoint, session_arguments(options.fuse_options, fsname_for(label), options.debug >= 2)
                )
            except KeyboardInterrupt:  # (SIGINT, SIGTERM, SIGHUP: unmounted by now)
                if not mounted:
                    raise  # interrupted before it was ready
                return  # the usual end of a mount in the foreground
            if not mounted:
                raise RatarmountError(f"cannot mount at {options.mountpoint} (see the message above)")
            return
        # libfuse 2, high-level-only options, --fuse-api high: mfusepy (imported only here; the
        # low-level path runs without it).
        from .fuse_compat import FUSE, IMPORT_ERROR
        from .fuse_ops import FuseOperations

        if FUSE is None:
            raise RatarmountError(f"the FUSE binding mfusepy cannot be loaded: {IMPORT_ERROR}")
        operations = FuseOperations(source, ready)
        try:
            with default_signal_handlers():  # (libfuse's own handlers need them)
                FUSE(
                    operations,
                    options.mountpoint,
                    foreground=True,
                    debug=options.debug >= 2,
                    **fuse_kwargs(options, label, source.is_immutable),
                )
        except RuntimeError:
            # libfuse 3 reports a loop ended by SIGINT/SIGTERM as an error, after it has
            # unmounted cleanly: that is a normal end, not a failure.
            if not mounted or os.path.ismount(options.mountpoint):
                raise RatarmountError(f"cannot mount at {options.mountpoint} (see the message above)") from None
    finally:
        point.release()
        source.close()


#: The FUSE device libfuse opens before it mounts.
FUSE_DEVICE = "/dev/fuse"

#: What a user without FUSE can do instead (HPC nodes often have none).
_WITHOUT_FUSE = "without FUSE, the Python API reads the same archives: ratarmountcore.open(ARCHIVE)"


def check_fuse_device(fuse_options: Dict[str, Union[str, bool]], device: str = FUSE_DEVICE) -> None:
    """Fail with the cause when this process cannot open the FUSE device, before an index is
    built for a mount that cannot happen (a first mount of a large archive can take minutes).

    libfuse opens the device itself and fails when it cannot: it asks the set-user-ID
    ``fusermount3`` to mount only after the open succeeded and the kernel then refused the mount
    (checked against libfuse 3.14 as a user with /dev/fuse at mode 0600: "fuse: failed to open
    /dev/fuse: Permission denied"). With ``auto_unmount`` libfuse leaves the open to
    ``fusermount3``, which runs as root, so the check is left out then."""
    if "auto_unmount" in fuse_options:
        return
    try:
        fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENODEV, errno.ENXIO):
            raise RatarmountError(
                f"cannot mount: this machine has no FUSE device ({device}: {exc.strerror}); load the fuse "
                f"module (modprobe fuse) or, in a container, pass the device in; {_WITHOUT_FUSE}"
            ) from None
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise RatarmountError(
                f"cannot mount: {device}: permission denied (this machine lets only some users use FUSE; "
                f"ask its administrators); {_WITHOUT_FUSE}"
            ) from None
        raise RatarmountError(f"cannot mount: {device}: {exc.strerror}") from None
    os.close(fd)


def check_binding(options: MountOptions) -> None:
    """Fail before any index is built when no FUSE library can serve this mount, or when this
    process may not use FUSE."""
    check_fuse_device(options.fuse_options)
    if _use_low_level(options):
        return
    from .fuse_compat import IMPORT_ERROR, fuse

    if fuse is None:
        raise RatarmountError(
            f"cannot mount: libfuse not found ({IMPORT_ERROR}); install it (Debian: apt-get install fuse3)"
        )


def mount(options: MountOptions) -> int:
    for path in options.sources:
        try:
            os.stat(path)
        except OSError as exc:  # (a dangling link or a loop of links names its own cause)
            raise RatarmountError(f"{path}: {(exc.strerror or 'cannot be opened').lower()}") from None
        if not os.path.isdir(path) and not os.access(path, os.R_OK):  # (named before FUSE's own checks)
            raise RatarmountError(f"{path}: permission denied")
    check_named_folders(options.open_options.index)  # (before a mount point is made)
    created = options.create_mountpoint and not os.path.lexists(options.mountpoint)
    if created:
        try:
            os.mkdir(options.mountpoint)
        except OSError as exc:
            raise RatarmountError(f"cannot create the mount point {options.mountpoint}: {exc.strerror}") from None
        logger.warning("created the mount point %s", options.mountpoint)
    status = 1
    try:
        check_mountpoint(options.mountpoint, options.fuse_options)
        check_binding(options)
        if options.foreground:
            run_fuse(options, None)
            status = 0
        else:
            status = _daemonize(options, remove_mountpoint=created)
    finally:
        # A mount point we made goes when the mount does (foreground) or when it failed.
        if created and (options.foreground or status != 0):
            _remove_empty(options.mountpoint)
    return status


def _stop_child(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _remove_empty(folder: str) -> None:
    try:
        os.rmdir(folder)
    except OSError as exc:
        logger.debug("left %s in place: %s", folder, exc)


def _detach_stdio(keep_stderr: bool = False) -> None:
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1) if keep_stderr else (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


def _stderr_kept_for_debug() -> bool:
    """With ``-d`` in the background, whether the daemon goes on writing its debug messages to
    the caller's stderr: a terminal or a file, yes. A pipe or socket, no: whoever reads it
    (``ratarmount -d ... 2>&1 | tee log``, a program capturing the output) waited for its end,
    i.e. for the unmount, and the command never seemed to return."""
    try:
        mode = os.fstat(2).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISREG(mode)


def _daemonize(options: MountOptions, remove_mountpoint: bool = False) -> int:
    """Fork; the child mounts and reports through one pipe: its libfuse/log output during the
    mount, then a NUL byte once ready (or an error line and EOF). With ``remove_mountpoint`` the
    child removes the (empty) mount point once it is unmounted."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_end)
        os.setsid()
        status = 0

        def before_mount() -> None:
            # Index building (with its progress bar) is done: route libfuse's messages through
            # the parent, which prints them and exits once the mount is ready.
            if options.debug == 0:
                os.dup2(write_end, 2)

        def confirm_and_detach() -> None:
            # libfuse calls init before it has checked the negotiated settings; it may still
            # give up. A stat of our own mount point is answered only once the session really
            # serves requests, so readiness is reported after it.
            try:
                os.stat(options.mountpoint)
                if not os.path.ismount(options.mountpoint):
                    logger.debug("%s is not a mount point after init", options.mountpoint)
                    return
                os.write(write_end, READY)
            except OSError as exc:
                logger.debug("Checking the new mount failed: %s", exc)
                return
            keep_stderr = options.debug > 0 and _stderr_kept_for_debug()
            if options.debug and not keep_stderr:
                where = options.log_file or ("the system log" if os.path.exists(SYSLOG_SOCKET) else "nowhere")
                logger.debug("stderr is a pipe: debug messages go to %s from now on (-f keeps them here)", where)
            _detach_stdio(keep_stderr)  # (stdin and stdout always: a pipe kept open is a reader waiting)
            if not keep_stderr:
                route_background_logs(to_file=options.log_file is not None)
            os.close(write_end)

        def on_ready() -> None:
            threading.Thread(target=confirm_and_detach, name="ratarmount-ready", daemon=True).start()

        try:
            run_fuse(options, on_ready, before_mount)
            if remove_mountpoint:
                _remove_empty(options.mountpoint)
        except BaseException as exc:  # report to the parent, never a traceback in the daemon
            if options.debug:
                logger.exception("mount failed")
            from .cli import describe

            if isinstance(exc, KeyboardInterrupt):  # (SIGTERM, SIGHUP or SIGINT sent to it alone)
                line, status = f"ratarmount: {ended_by(exc)}", exit_status(exc)
            else:
                line, status = f"ratarmount: error: {describe(exc)}", 1
            try:
                os.write(write_end, f"{line}\n".encode("utf-8", "replace"))
            except OSError:
                pass
        os._exit(status)

    os.close(write_end)
    data = b""
    try:
        while READY not in data:
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            data += chunk
    except KeyboardInterrupt:
        # Ctrl-C (or SIGTERM) before the mount was ready: the child, in a session of its own, got
        # no signal, and would have mounted a second later with no one to unmount it. It ends
        # the way it would on SIGTERM (no index left half-written, nothing mounted).
        _stop_child(pid)
        raise
    finally:
        os.close(read_end)
    text, ready, _ = data.partition(READY)
    lines = text.decode("utf-8", "replace").splitlines()
    if lines:
        sys.stderr.write("\n".join(lines) + "\n")
    if ready:
        return 0
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if not lines:
        sys.stderr.write("ratarmount: error: the mount process exited before the mount was ready\n")
    return code if code in STOPPED_STATUSES else 1  # (interrupted, terminated, hung up: its own status)

"""``ratarmount [OPTIONS] ARCHIVE [ARCHIVE...] MOUNTPOINT`` and ``ratarmount -u MOUNTPOINT``."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple, Union

from ratarmountcore import __version__
from ratarmountcore.errors import RatarmountError
from ratarmountcore.io.host_paths import absolute
from ratarmountcore.options import CompressionOptions, IndexOptions, OpenOptions

from .arg_types import mib, positive_mib, threads
from .termination import ended_by, exit_status, sigterm_raises
from .workers import loop_threads

logger = logging.getLogger("ratarmount")


@dataclass(frozen=True)
class MountOptions:
    sources: List[str]
    mountpoint: str
    open_options: OpenOptions
    foreground: bool = False
    debug: int = 0
    fuse_options: Dict[str, Union[str, bool]] = field(default_factory=dict)
    #: Kernel read-ahead of the mount in KiB (set through sysfs when permitted); 0: kernel default.
    read_ahead_kib: int = 1024
    #: "auto" (libfuse 3's low-level API when it can serve the options), "low" or "high".
    fuse_api: str = "auto"
    #: Create the mount point if it does not exist (it was derived from the archive's name).
    create_mountpoint: bool = False
    #: Append the log here (else, once in the background, to the system log; see daemon_log.py).
    log_file: Optional[str] = None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ratarmount",
        description="Mount tar archives (plain, .gz, .bz2, .zst, .xz) read-only. The first mount writes an "
        "SQLite index next to the archive (or in ~/.cache/ratarmount); later mounts open instantly.",
        epilog="Unmount with: ratarmount -u MOUNTPOINT [MOUNTPOINT...]",
    )
    parser.add_argument(
        "paths",
        nargs="*",
        metavar="ARCHIVE... MOUNTPOINT",
        help="archives (or folders), then the mount point; later ones win where names clash; a single "
        "ARCHIVE alone is mounted at its name without the archive extension (data.tar.gz at data/, created "
        "if missing)",
    )
    parser.add_argument("-f", "--foreground", action="store_true", help="stay in the foreground (Ctrl+C unmounts)")
    parser.add_argument(
        "-u",
        "--unmount",
        nargs="+",
        metavar="MOUNTPOINT",
        help="unmount each MOUNTPOINT given and exit (non-zero when any could not be unmounted)",
    )
    parser.add_argument(
        "-o",
        "--fuse",
        action="append",
        default=[],
        metavar="OPTIONS",
        help="comma-separated FUSE options, e.g. -o allow_other,uid=1000; max_threads=N sets the "
        "worker threads (default: one per core, 2 to 16, at least 8 for archives on network file systems)",
    )
    parser.add_argument("--index-file", help="read/write the index at this path")
    parser.add_argument(
        "--index-folders",
        help="comma-separated folders to look for and write indexes in; an empty entry means 'beside the "
        "archive' (default: ',~/.cache/ratarmount'); union mounts cache their table in the first folder "
        "named",
    )
    parser.add_argument("--recreate-index", action="store_true", help="rebuild the index even if a valid one exists")
    parser.add_argument(
        "-r",
        "--recursive",
        action="store_true",
        help="mount archives inside archives (and in folders given as sources) as folders",
    )
    parser.add_argument(
        "--strip-tar-extension",
        action="store_true",
        help="with -r, show an archive NAME.tar as the folder NAME (ImageNet's class tars as folders named by "
        "class alone)",
    )
    parser.add_argument(
        "--lazy",
        action="store_true",
        help="with -r, open (and index) the archives in folders given as sources when first used, not before mounting",
    )
    parser.add_argument(
        "-P",
        "--parallelization",
        type=threads,
        default=0,
        metavar="N",
        help="threads for parallel decompression (default 0: the cores this process may use, by its CPU affinity and "
        "cgroup CPU quota, at most 16, since each thread holds decoded data; gzip through rapidgzip: two per core)",
    )
    parser.add_argument("--gzip-backend", choices=["rapidgzip", "indexed_gzip"], help="force a gzip backend")
    parser.add_argument(
        "--seek-point-spacing",
        "--gzip-seek-point-spacing",
        type=positive_mib,
        default=None,
        metavar="MiB",
        help="distance between gzip seek points stored in the index, in MiB (default: 0.375 of compressed "
        "data with rapidgzip, 1 when the first members are 128-512 KiB, 2 when larger; 1 of decompressed data with "
        "indexed_gzip; an existing index is then used whatever its spacing); small random reads inside "
        "large members (record files) are faster with 0.375 or less",
    )
    parser.add_argument(
        "--cache-size",
        type=mib,
        default=32.0,
        metavar="MiB",
        help="decoded data kept, all compressed archives together, for reads near earlier ones (default 32; 0: off); "
        "archives whose decoded data is at most 3 times this (all together) are kept whole",
    )
    parser.add_argument(
        "--read-ahead",
        type=int,
        default=1024,
        metavar="KiB",
        help="kernel read-ahead of the mount (default 1024; the kernel's FUSE default is 128); needs write "
        "access to /sys/class/bdi (root), else the kernel's default stays; 0 leaves it alone",
    )
    parser.add_argument(
        "--fuse-api",
        choices=["auto", "low", "high"],
        default="auto",
        help="libfuse API: low-level (libfuse 3, the default when available) or high-level (mfusepy)",
    )
    parser.add_argument(
        "--log-file",
        metavar="PATH",
        help="append warnings and errors (with -d: debug messages) to PATH; without it a mount in the "
        "background logs them to the system log (journalctl -t ratarmount)",
    )
    parser.add_argument("--version", action="store_true", help="print versions of ratarmount and its backends")
    parser.add_argument(
        "-d",
        "--debug",
        action="count",
        default=0,
        help="log debug messages and show tracebacks; twice also enables libfuse's debug output",
    )
    return parser


def parse_index_folders(value: Optional[str]) -> Tuple[str, ...]:
    """``--index-folders A,,B`` -> ("A", "", "B"); None -> the default search order."""
    if value is None:
        return IndexOptions().index_folders
    return tuple(folder.strip() for folder in value.split(","))


def parse_fuse_options(values: Sequence[str]) -> Dict[str, Union[str, bool]]:
    options: Dict[str, Union[str, bool]] = {}
    for value in values:
        for item in value.split(","):
            item = item.strip()
            if not item:
                continue
            key, eq, val = item.partition("=")
            options[key] = val if eq else True
    return options


#: Seconds ``-u`` keeps trying while the mount point is busy.
UNMOUNT_BUSY_WAIT = 2.0
#: The file system type of our mounts (libfuse's ``subtype=ratarmount``): ``-u`` unmounts no other.
MOUNT_TYPE = "fuse.ratarmount"

#: Stripped from a lone ARCHIVE's name to name its mount point (longest first).
ARCHIVE_SUFFIXES = (
    ".tar.gz", ".tar.bz2", ".tar.zst", ".tar.xz", ".tgz", ".tbz2", ".tbz", ".tzst", ".txz",
    ".tar", ".gz", ".bz2", ".zst", ".xz",
)  # fmt: skip


def default_mountpoint(archive: str) -> Optional[str]:
    """``data.tar.gz`` -> ``data`` (beside the archive); None when the name has no such suffix."""
    name = os.path.basename(archive)
    for suffix in ARCHIVE_SUFFIXES:
        if name.lower().endswith(suffix) and len(name) > len(suffix):
            return os.path.join(os.path.dirname(absolute(archive)), name[: -len(suffix)])
    return None


def to_mount_options(args: argparse.Namespace, parser: argparse.ArgumentParser) -> MountOptions:
    create = False
    if len(args.paths) == 1 and os.path.isfile(args.paths[0]):
        derived = default_mountpoint(args.paths[0])
        if derived is None:
            parser.error(f"name a MOUNTPOINT for {args.paths[0]} (its name has no archive extension to strip)")
        args.paths.append(derived)
        create = True
    if len(args.paths) < 2:
        parser.error("need at least one ARCHIVE and a MOUNTPOINT")
    folders = parse_index_folders(args.index_folders)
    index = IndexOptions(index_file=args.index_file, index_folders=folders, recreate=args.recreate_index)
    if args.index_file and len(args.paths) > 2:
        parser.error("--index-file works with a single archive only")
    compression = CompressionOptions(
        parallelization=args.parallelization,
        gzip_backend=args.gzip_backend,
        seek_point_spacing=None if args.seek_point_spacing is None else max(1, int(args.seek_point_spacing * 2**20)),
        cache_size=max(0, int(args.cache_size * 1024 * 1024)),
    )
    if args.lazy and not args.recursive:
        parser.error("--lazy works with -r (only then are the archives in a folder shown as folders)")
    if args.strip_tar_extension and not args.recursive:
        parser.error("--strip-tar-extension works with -r (only then are archives shown as folders)")
    if args.read_ahead < 0:
        parser.error("--read-ahead must be 0 or more KiB")
    fuse_options = parse_fuse_options(args.fuse)
    if "rw" in fuse_options:
        # (it mounted read-write, and writes failed with ENOSYS instead of EROFS)
        raise RatarmountError("-o rw: the mount is read-only (writes fail with EROFS); leave rw out")
    loop_threads(fuse_options)  # a bad -o max_threads= fails before the archive is opened
    mountpoint = os.path.realpath(args.paths[-1])
    for path in args.paths[:-1]:
        folder = os.path.realpath(path)
        if os.path.isdir(folder) and (mountpoint == folder or mountpoint.startswith(folder.rstrip("/") + "/")):
            # (the mount would list itself, and a lookup in it would wait for itself)
            parser.error(f"the mount point {args.paths[-1]} lies inside the folder {path} it would show")
    return MountOptions(
        # Absolute: libfuse changes the working directory to "/" once it runs.
        sources=[absolute(p) for p in args.paths[:-1]],
        # (Resolved whole: the kernel mounts on a symbolic link's target, and a mount point
        # named by a link never looked mounted: a background mount waited forever; found by
        # fuzzing.)
        mountpoint=os.path.realpath(args.paths[-1]),
        open_options=OpenOptions(
            index=index,
            compression=compression,
            recursive=args.recursive,
            lazy=args.lazy,
            strip_tar_extension=args.strip_tar_extension,
        ),
        foreground=args.foreground,
        debug=args.debug,
        fuse_options=fuse_options,
        read_ahead_kib=args.read_ahead,
        fuse_api=args.fuse_api,
        create_mountpoint=create,
        log_file=absolute(args.log_file) if args.log_file else None,
    )


def front_end() -> str:
    from .lowlevel import library_version

    version = library_version()
    if version is None:
        from .fuse_compat import fuse

        if fuse is None:
            return "none: libfuse not found (install Debian's fuse3 package to mount)"
        return "libfuse high-level API through mfusepy (libfuse 3.12+ not found for the low-level API)"
    return f"libfuse {version} low-level API (ctypes; --fuse-api high for mfusepy)"


def version_text() -> str:
    from importlib import metadata

    from .fuse_compat import libfuse_version

    def dist_version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    import sqlite3

    lines = [
        f"ratarmount {__version__}",
        f"python {sys.version.split()[0]}",
        f"fuse front-end: {front_end()}",
        f"mfusepy {dist_version('mfusepy')} (libfuse {libfuse_version()}; the fallback front-end)",
        f"sqlite {sqlite3.sqlite_version}",
    ]
    from ratarmountcore.compression import backend_versions

    lines.extend(f"{name} {version}" for name, version in backend_versions().items())
    from ratarmountcore import cores

    lines.append(cores.describe())
    return "\n".join(lines)


def check_mountpoint(path: str, fuse_options: Dict[str, Union[str, bool]]) -> None:
    if not os.path.exists(path):
        raise RatarmountError(f"mount point {path} does not exist")
    if not os.path.isdir(path):
        raise RatarmountError(f"mount point {path} is not a directory")
    if os.path.ismount(path):
        try:
            os.listdir(path)
        except OSError as exc:
            if exc.errno == errno.ENOTCONN:  # its daemon died (killed, out of memory)
                raise RatarmountError(
                    f"mount point {path} still holds a mount whose process has ended (transport endpoint "
                    f"is not connected); unmount it first (ratarmount -u {path})"
                ) from None
        raise RatarmountError(f"mount point {path} is already a mount point; unmount it first (ratarmount -u {path})")
    if "nonempty" not in fuse_options and os.listdir(path):
        raise RatarmountError(f"mount point {path} is not empty (pass -o nonempty to mount over it anyway)")


def users_of(mountpoint: str, most: int = 5) -> List[str]:
    """``PID (command)`` of processes whose working folder or open files lie in ``mountpoint``
    (what ``fuser -m`` would say), from /proc; only links are read, nothing in the mount."""
    root = os.path.realpath(mountpoint)
    inside = (root, root.rstrip("/") + "/")
    found: List[str] = []
    try:
        pids = [entry for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return found
    for pid in pids:
        if int(pid) == os.getpid():
            try:
                cwd = os.readlink("/proc/self/cwd")
            except OSError:
                continue
            if cwd == inside[0] or cwd.startswith(inside[1]):
                found.append("this command, whose working folder is in it")
            continue
        try:
            links = [f"/proc/{pid}/cwd"] + [f"/proc/{pid}/fd/{fd}" for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:  # gone, or not ours to look at
            continue
        for link in links:
            try:
                target = os.readlink(link)
            except OSError:
                continue
            if target == inside[0] or target.startswith(inside[1]):
                if len(found) == most:
                    return found + ["..."]
                try:
                    with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
                        command = f.read().strip()
                except OSError:
                    command = "?"
                found.append(f"{pid} ({command})")
                break
    return found


def _process_ended(mountpoint: str) -> bool:
    """Whether the mount's daemon is gone (killed, out of memory): the kernel answers ENOTCONN."""
    try:
        os.listdir(mountpoint)
    except OSError as exc:
        return exc.errno == errno.ENOTCONN
    return False


def unmount(mountpoint: str) -> None:
    mountpoint = os.path.realpath(mountpoint)  # (a link to the mount point: see to_mount_options)
    if not os.path.lexists(mountpoint):
        raise RatarmountError(f"{mountpoint} does not exist")
    from ratarmountcore.io.mountinfo import mounted_at, read_mountinfo

    mountinfo = read_mountinfo()
    if not mountinfo:  # (no /proc: whether it is a mount at all is what can be told)
        if not os.path.ismount(mountpoint):
            raise RatarmountError(f"{mountpoint} is not a mount point")
    else:
        kind = mounted_at(mountpoint, mountinfo)
        if kind is None:
            raise RatarmountError(f"{mountpoint} is not a mount point")
        if kind != MOUNT_TYPE:
            # (As root, umount below would take any file system away: a tmpfs, another tool's mount.)
            raise RatarmountError(f"{mountpoint} is not a ratarmount mount ({kind}): left mounted")
    for tool, args in (("fusermount3", ["-u"]), ("fusermount", ["-u"]), ("umount", [])):
        exe = shutil.which(tool)
        if exe is None:
            continue
        import subprocess

        # Busy can be the mount's own doing for a moment: it lists folders through the mount
        # point for lookup runs (folder_prefetch), a few milliseconds each.
        deadline = time.monotonic() + UNMOUNT_BUSY_WAIT
        while True:
            result = subprocess.run([exe, *args, mountpoint], capture_output=True, text=True)
            if result.returncode == 0:
                return
            if "busy" not in (result.stderr + result.stdout).lower() or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        message = (result.stderr or result.stdout).strip().splitlines()
        # "fusermount3: failed to unmount /mnt: Device or resource busy": the cause only.
        why = message[-1].rsplit(": ", 1)[-1] if message else "unknown error"
        if "busy" in why.lower():
            users = users_of(mountpoint)
            if users:
                why += f" (in use by {', '.join(users)})"
            if _process_ended(mountpoint):
                why += f"; its process has ended: fusermount3 -u -z {mountpoint} detaches it now"
        raise RatarmountError(f"cannot unmount {mountpoint}: {why}")
    raise RatarmountError("cannot unmount: neither fusermount3, fusermount nor umount is installed")


def unmount_all(mountpoints: Sequence[str], debug: int = 0) -> int:
    """Unmount each of ``mountpoints`` (``ratarmount -u A B``): a failure is said on a line of
    its own and the others are still unmounted; 1 when any failed."""
    status = 0
    for mountpoint in mountpoints:
        try:
            unmount(mountpoint)
        except (RatarmountError, OSError) as exc:
            if debug:
                logger.exception("unmounting %s failed", mountpoint)
            print(f"ratarmount: error: {describe(exc)}", file=sys.stderr)
            status = 1
    return status


def setup_logging(debug: int) -> None:
    from .messages import setup_stderr_logging

    setup_stderr_logging(
        logging.DEBUG if debug else logging.WARNING,
        "ratarmount: %(levelname)s: %(message)s" if debug else "ratarmount: %(message)s",
    )


def describe(exc: BaseException) -> str:
    """One line naming the file and the cause (see ``messages.printable``)."""
    from .messages import printable

    if isinstance(exc, OSError) and exc.strerror:
        return printable(f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror)
    return printable(str(exc))


def quiet_broken_pipe() -> int:
    """Whoever read our output stopped reading (``ratarmount --version | head -1``): exit as the
    shell's tools do when SIGPIPE ends them, silently. stdout is pointed at /dev/null first, so
    that flushing it at exit does not fail once more."""
    import signal

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.debug)
    with sigterm_raises():
        return _run(args, parser)


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        if args.version:
            print(version_text())
            return 0
        if args.unmount:
            return unmount_all([*args.unmount, *args.paths], args.debug)
        options = to_mount_options(args, parser)
        if options.log_file:
            from .daemon_log import add_log_file

            add_log_file(options.log_file)
        from .mount import mount

        return mount(options)
    except KeyboardInterrupt as interrupt:
        print(f"ratarmount: {ended_by(interrupt)}", file=sys.stderr)
        return exit_status(interrupt)
    except BrokenPipeError:
        return quiet_broken_pipe()
    except (RatarmountError, OSError) as exc:
        if args.debug:
            logger.exception("failed")
        print(f"ratarmount: error: {describe(exc)}", file=sys.stderr)
        return 1

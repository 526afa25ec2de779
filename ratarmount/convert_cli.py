"""``ratarmount-convert SOURCE OUTPUT.tar.zst``: rewrite an archive as seekable multi-frame zstd,
with its index written in the same pass (the first mount of the output is instant)."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
from typing import List, Optional

from ratarmountcore import __version__
from ratarmountcore.errors import RatarmountError
from ratarmountcore.options import CompressionOptions, IndexOptions, OpenOptions

from .arg_types import frame_mib, threads, zstd_level
from .cli import parse_index_folders
from .messages import printable, setup_stderr_logging
from .termination import ended_by, exit_status, sigterm_raises

logger = logging.getLogger("ratarmount.convert")

#: Errors only writing gives: the file they concern is the output.
_WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ratarmount-convert",
        description="Convert a tar archive (plain, .gz, .bz2, .zst, .xz) -- or a single compressed file -- "
        "into a multi-frame .tar.zst that ratarmount can seek in quickly, and write its index in the same pass.",
    )
    parser.add_argument("source", help="archive to read")
    parser.add_argument("output", help="file to write (usually ending in .tar.zst)")
    parser.add_argument(
        "--frame-size",
        type=frame_mib,
        default=4.0,
        metavar="MiB",
        help="uncompressed bytes per independent zstd frame, in MiB (default 4, at least 0.0625); smaller "
        "seeks faster, larger compresses better",
    )
    parser.add_argument("-l", "--level", type=zstd_level, default=3, help="zstd compression level (default 3)")
    parser.add_argument("-f", "--force", action="store_true", help="replace OUTPUT if it exists")
    parser.add_argument(
        "-P",
        "--parallelization",
        type=threads,
        default=0,
        metavar="N",
        help="threads for decompression and compression (default 0: the cores this process may use, by its CPU "
        "affinity and cgroup CPU quota, at most 16)",
    )
    parser.add_argument(
        "-r", "--recursive", action="store_true", help="index tars inside the tar as folders (as -r when mounting)"
    )
    parser.add_argument("--index-file", help="write the output's index to this path")
    parser.add_argument(
        "--index-folders",
        help="comma-separated folders to write the index in; an empty entry means 'beside the output'",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument("-d", "--debug", action="store_true", help="log debug messages and show tracebacks")
    parser.add_argument("--version", action="version", version=f"ratarmount-convert {__version__}")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_stderr_logging(logging.DEBUG if args.debug else logging.WARNING, "ratarmount-convert: %(message)s")
    folders = parse_index_folders(args.index_folders)
    options = OpenOptions(
        index=IndexOptions(index_file=args.index_file, index_folders=folders, progress=not args.no_progress),
        compression=CompressionOptions(parallelization=args.parallelization),
        recursive=args.recursive,
    )
    with sigterm_raises():
        return _convert(args, options)


def _convert(args: argparse.Namespace, options: OpenOptions) -> int:
    from ratarmountcore.convert import convert_to_seekable_zstd

    if os.path.isdir(args.output):
        print(
            f"ratarmount-convert: error: {printable(args.output)} is a folder; name the file to write", file=sys.stderr
        )
        return 1
    if os.path.lexists(args.output) and not args.force:
        print(
            f"ratarmount-convert: error: {printable(args.output)} already exists (use --force to replace it)",
            file=sys.stderr,
        )
        return 1
    try:
        result = convert_to_seekable_zstd(
            args.source,
            args.output,
            frame_size=max(1, int(args.frame_size * 1024 * 1024)),
            level=args.level,
            options=options,
            overwrite=args.force,
        )
    except KeyboardInterrupt as interrupt:
        print(f"ratarmount-convert: {ended_by(interrupt)}", file=sys.stderr)
        return exit_status(interrupt)
    except (RatarmountError, OSError, ValueError) as exc:
        if args.debug:
            logger.exception("conversion failed")
        text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        if isinstance(exc, OSError) and exc.filename and str(exc.filename) not in text:
            text = f"{exc.filename}: {text}"
        elif isinstance(exc, OSError) and exc.errno in _WRITE_ERRNOS and not exc.filename:
            text = f"{args.output}: {text}"  # (a write's error names no file: it can only be the output's)
        # (On one line: a name may hold a newline, so none is cut off; see messages.printable.)
        print(f"ratarmount-convert: error: {printable(text) if text else type(exc).__name__}", file=sys.stderr)
        return 1
    if sys.stderr.isatty() and not args.no_progress:
        print(
            f"ratarmount-convert: wrote {result.path} ({result.frames} frames, "
            f"{result.decompressed_size:,} -> {result.compressed_size:,} bytes)",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

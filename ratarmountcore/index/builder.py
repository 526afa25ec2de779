"""Find a valid index for an archive, or build one.

Search order: the candidate locations (``locations.candidate_paths``); the first existing index
that validates against the archive (format version, size, mtime, fingerprint, build options) is
used. Otherwise the index is built into the first writable candidate, via a temporary file that
is renamed into place only when complete.

A file at a candidate path that is not an index of ours (the PyPI ratarmount release writes
``ARCHIVE.index.sqlite`` too) is left alone: the index goes to the next candidate, so neither
program rebuilds its index on every mount because the other replaced it.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from ..errors import (
    IndexLocationFailedError,
    IndexNotWritableError,
    IndexWriteError,
    InvalidIndexError,
    OtherOptionsIndexError,
    StaleIndexError,
)
from ..io.descriptors import check_left
from ..io.host_paths import missing_folders, remove_empty
from ..options import IndexOptions
from . import full_folders, stale
from .fingerprint import ArchiveStats
from .locations import TEMPORARY_EXTRA, candidate_paths, folder_writable
from .sqlite_index import IndexReader, IndexWriter, foreign_file, why_left_alone, written_by_us

logger = logging.getLogger(__name__)

#: Fills a fresh writer with rows (and seek points); does not commit.
BuildFunction = Callable[[IndexWriter], None]


def _try_open(
    path: str,
    stats: ArchiveStats,
    build_options: Dict[str, str],
    archive: str,
    unusable: List[Callable[[], None]],
    opened: Optional[IndexReader] = None,
) -> Optional[IndexReader]:
    """The index at ``path`` when it is valid for the archive; else None, and what to report
    about it is added to ``unusable`` (reported only when no other location has a valid one: a
    stale index beside the archive and a valid one in the cache said "it will be rebuilt" on
    every mount, and never was; found by fuzzing)."""
    # Whose file it is matters only when it cannot be used: a valid index opens with one
    # connection, as before (mount start-up).
    try:
        reader = opened or IndexReader(path)
    except InvalidIndexError as exc:
        check_left(path)  # (SQLite says "unable to open" when it is out of descriptors)
        message = f"Ignoring {path}: {exc}"
        unusable.append(lambda: _report_unusable(path, message))
        return None
    try:
        reader.validate(stats)
        reader.check_options(build_options)
    except StaleIndexError as exc:
        reader.close()

        # (Options differ: the archive is the same, and the index was called one that "does not
        # match the archive (index was built with recursive='1', need '0')".)
        other_options = isinstance(exc, OtherOptionsIndexError)
        why = "was built with other options" if other_options else "does not match the archive"

        def report(reason: str = str(exc)) -> None:
            if _first_of_its_kind(os.path.dirname(os.path.abspath(archive)), why, reason):
                _report_unusable(path, f"Index {path} {why} ({reason}); it will be rebuilt")

        unusable.append(report)
        return None
    return reader


#: Stale indexes of the archives of one folder reported in full per reason: a folder of 1,000
#: class tars indexed without -r and mounted with it said the same thing 1,000 times.
REPORTED_PER_REASON = 3
_reasons: Dict[Tuple[str, str], int] = {}
_reasons_lock = threading.Lock()


def _first_of_its_kind(folder: str, why: str, reason: str) -> bool:
    """Whether a stale index of an archive in ``folder`` is reported for ``reason``; the one after
    the last reported says that further ones are rebuilt without a word each. ``why``: "does not
    match the archive" or "was built with other options"."""
    with _reasons_lock:
        seen = _reasons[folder, reason] = _reasons.get((folder, reason), 0) + 1
    if seen == REPORTED_PER_REASON + 1:
        logger.warning(
            "More indexes of archives in %s %s (%s); they are rebuilt without a message each",
            folder, why.replace("does not", "do not").replace("was", "were"), reason,
        )  # fmt: skip
    elif seen > REPORTED_PER_REASON + 1:
        logger.debug("Another index of an archive in %s %s (%s); rebuilding it", folder, why, reason)
    return seen <= REPORTED_PER_REASON


def _report_unusable(path: str, message: str) -> None:
    """A warning for an index of ours; another program's file is left alone (see below)."""
    if written_by_us(path):
        logger.warning("%s", message)
    else:
        logger.debug("%s is not an index of ours", path)


def _open_built(
    path: str,
    identity: Optional[Tuple[int, int]],
    stats: ArchiveStats,
    build_options: Dict[str, str],
    archive_path: str,
) -> IndexReader:
    """The index just renamed into place at ``path`` -- unless another process renamed its own
    over it in between (first mounts of one archive at once): then that one, if it is valid for
    this archive as opened here, else an error. It was used unchecked: a mount with ``-r`` got
    the index of one without, and a mount of the old version of an archive renamed over by a new
    one read every member through the new one's rows, wrong bytes without an error (found by
    fuzzing)."""
    reader = IndexReader(path)
    if reader.identity == identity:
        return reader
    reader.close()
    logger.info("%s: another process's index replaced the one just written", path)
    other = _try_open(path, stats, build_options, archive_path, [])
    if other is not None:
        return other
    raise InvalidIndexError(
        f"{archive_path}: the index {path} was replaced while it was written, by another mount's for other "
        "options or another version of the archive; mount again"
    )


#: The longest file path SQLite opens (its SQLITE_MAX_PATHNAME).
SQLITE_PATH_MAX = 512


def _cause(path: str, exc: BaseException) -> str:
    """Why no index could be created at ``path``, in a few words (a full or read-only disk, a
    path too long: the error blamed writability alone, found by fuzzing)."""
    if len(os.fsencode(path)) + TEMPORARY_EXTRA > SQLITE_PATH_MAX:
        return f"its path is longer than SQLite opens, {SQLITE_PATH_MAX} bytes"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc)


def _pass_over(archive_path: str, target: str, cause: str) -> None:
    """Remember ``target``'s folder as one to pass over (``full_folders``), saying so the first time."""
    level = logging.WARNING if full_folders.remember(os.path.dirname(target), cause) else logging.DEBUG
    message = "%s: cannot write its index %s (%s); building it at the next location"
    logger.log(level, message, archive_path, target, cause)


#: Seconds between looks at another process's build of the same index.
WAIT_POLL = 0.2
#: Seconds a build that let go of its lock may take to rename its file into place.
RENAME_WAIT = 1.0


def _waited_for_another_build(target: str, archive_path: str) -> bool:
    """Wait while another process builds the index ``target`` (the tasks of a job array mounting
    one new archive at once: each built the same index, each reading the whole archive); True
    when there was such a build, whose index the caller then tries."""
    other = stale.build_in_progress(target)
    if other is None:
        return False
    logger.warning("%s: another process is building its index (%s); waiting for it", archive_path, other)
    started = time.monotonic()
    while stale.build_in_progress(target) is not None:
        time.sleep(WAIT_POLL)
    # A build lets go of its lock as it closes the index, a moment before renaming it into place
    # (or before removing it, given up): a file still there a second later was left by a kill.
    released = time.monotonic()
    while os.path.lexists(other) and time.monotonic() - released < RENAME_WAIT:
        time.sleep(0.01)
    logger.info("%s: the other build ended after %.1f s of waiting", archive_path, time.monotonic() - started)
    return True


def first_valid(archive_path: str, stats: ArchiveStats, options: IndexOptions) -> Optional[Tuple[str, IndexReader]]:
    """The first index in the candidate locations that belongs to the archive as it is (build
    options aside), opened: for a mount of a compressed archive to learn whether it is a tar or
    a single file without decoding it, and, naming no gzip backend, to open it with the backend
    the index was built with (``open_or_build`` takes the reader over as ``found``). An
    index built with ``--gzip-backend indexed_gzip`` (a ``.tar.gz`` padded with zeros, which
    rapidgzip refuses) was rebuilt with the default backend on the next mount without the
    option, and failed again (found checking the README)."""
    if options.recreate:
        return None
    for path in candidate_paths(archive_path, options):
        if not os.path.isfile(path):
            continue
        try:
            reader = IndexReader(path)
        except InvalidIndexError:
            continue
        try:
            reader.validate(stats)
        except StaleIndexError:
            reader.close()
            continue
        return path, reader
    return None


def _existing(
    candidates: List[str],
    stats: ArchiveStats,
    build_options: Dict[str, str],
    archive_path: str,
    found: Optional[Tuple[str, IndexReader]],
) -> Optional[IndexReader]:
    """The first valid index among ``candidates`` (``found``: one opened already); when there
    is none, what was wrong with the others is reported."""
    unusable: List[Callable[[], None]] = []
    for path in candidates:
        if found is not None and path == found[0]:
            reader = _try_open(path, stats, build_options, archive_path, unusable, found[1])
        elif os.path.isfile(path):
            reader = _try_open(path, stats, build_options, archive_path, unusable)
        else:
            continue
        if reader is not None:
            logger.debug("Using index %s%s", path, " (an unusable one comes first)" if unusable else "")
            return reader
    for report in unusable:
        report()
    return None


def open_or_build(
    archive_path: str,
    stats: ArchiveStats,
    options: IndexOptions,
    build_options: Dict[str, str],
    build: BuildFunction,
    implicit_owner: "tuple[int, int]",
    failed: Mapping[str, str] = {},
    found: Optional[Tuple[str, IndexReader]] = None,
) -> IndexReader:
    """The archive's index: a valid existing one, else one built into the first candidate
    location that takes it. ``failed`` names locations where a build of this archive failed
    for a reason of the place (path -> cause): they are not tried again. A build that fails so
    where another location is left raises IndexLocationFailedError, for the caller to open the
    archive again (a first pass cannot be run twice on one reader) and pass that location in
    ``failed``: an index beside an archive on a file system that filled up, or whose quota ran
    out, during the build went nowhere, and the mount failed with a cache folder to spare.
    ``found``: ``first_valid``'s answer, taken over (used, or closed)."""
    candidates = [path for path in candidate_paths(archive_path, options) if path not in failed]
    used: Optional[IndexReader] = None
    try:
        if not options.recreate:
            used = _existing(candidates, stats, build_options, archive_path, found)
    finally:
        if found is not None and found[1] is not used:
            found[1].close()
    if used is not None:
        return used

    foreign: List[str] = []
    causes: Dict[str, str] = dict(failed)  # (why a candidate could not be written: said in the error)
    for number, target in enumerate(candidates):
        last = number + 1 == len(candidates)
        if foreign_file(target):
            foreign.append(target)
            continue
        passed_over = None if last else full_folders.remembered(os.path.dirname(target))
        if passed_over is not None:  # (another archive's build there ran out of room)
            causes[target] = passed_over
            continue
        made = missing_folders(os.path.dirname(target))
        if not folder_writable(target):
            causes[target] = "its folder cannot be written"
            continue
        if not options.recreate and _waited_for_another_build(target, archive_path):  # (asked to build: builds)
            built = _existing([target], stats, build_options, archive_path, None)
            if built is not None:
                return built
        try:
            writer = IndexWriter(target, stats, archive_path, build_options)
        except (OSError, sqlite3.Error) as exc:
            remove_empty(made)
            check_left(archive_path)
            causes[target] = _cause(target, exc)
            space = full_folders.creation_failure(exc)
            if space is not None and not last:
                _pass_over(archive_path, target, space)  # (a full disk went unsaid: found by fuzzing)
            else:
                logger.debug("Cannot create an index at %s: %s", target, exc)
            continue
        if foreign:
            logger.warning(
                "Leaving %s alone; writing the index to %s",
                ", ".join(f"{path} ({why_left_alone(path)})" for path in foreign),
                target,
            )
        logger.info("Creating index %s", target)
        try:
            try:
                with writer:
                    build(writer)
                    writer.commit(stats.mtime_ns, *implicit_owner)
            except BaseException:
                remove_empty(made)  # (folders made for an index of a bad archive were left)
                raise
        except sqlite3.Error as exc:  # (the disk filled up: "database or disk is full")
            free = writer.free_at_abort
            cause = full_folders.build_failure(exc, free)
            if cause is None or last:
                raise IndexWriteError.of(archive_path, target, full_folders.explained(exc, free)) from None
            _pass_over(archive_path, target, cause)
            raise IndexLocationFailedError(
                f"{archive_path}: cannot write its index {target} ({cause})", target, cause
            ) from None
        return _open_built(target, writer.identity, stats, build_options, archive_path)
    held = "".join(f" ({path}: {why_left_alone(path)}, left alone)" for path in foreign)
    tried = [*failed, *candidates]
    raise IndexNotWritableError(
        f"{archive_path}: cannot write an index to any of "
        f"{', '.join(f'{path} ({causes[path]})' if path in causes else path for path in tried)}{held}; "
        "use --index-file or --index-folders to name a writable place"
    )

"""Turn what the user named (paths, lists of paths) into one MountSource."""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence, Union

from ..errors import NoSourceError
from ..index.locations import check_named_folders
from ..io.host_paths import absolute
from ..options import OpenOptions
from ..progress import OPENING_DELAY, Progress
from .archive import open_archive
from .base import MountSource


def open_source(source: Union[str, Sequence[str]], options: OpenOptions) -> MountSource:
    check_named_folders(options.index)  # (before anything is made in them, or beside them)
    opened = _open(source, options)
    # How to open it again (``MountSource.__reduce__``), from any working folder, with the index
    # it has now (not rebuilt by every worker that unpickles it).
    again = _reopen_options(options)
    if isinstance(source, (str, os.PathLike)):
        opened.reopen_args = (absolute(source), again)
    else:
        opened.reopen_args = ([absolute(p) for p in source], again)
    return opened


def _reopen_options(options: OpenOptions) -> OpenOptions:
    """``options`` for opening the same source again elsewhere: index paths made absolute
    ("" -- beside the archive -- stays), and no ``recreate`` (the index was just made)."""
    index = options.index
    folders = tuple(absolute(os.path.expanduser(f)) if f else f for f in index.index_folders)
    index_file = absolute(os.path.expanduser(index.index_file)) if index.index_file else index.index_file
    return dataclasses.replace(
        options, index=dataclasses.replace(index, index_file=index_file, index_folders=folders, recreate=False)
    )


def _open(source: Union[str, Sequence[str]], options: OpenOptions) -> MountSource:
    if isinstance(source, (str, os.PathLike)):
        return _open_one(os.fspath(source), options)
    paths = [os.fspath(p) for p in source]
    if not paths:  # (paths[0] below raised IndexError)
        raise NoSourceError("no source to open: name an archive or folder, or a non-empty list of them")
    if len(paths) == 1:
        return _open_one(paths[0], options)
    from . import union_cache
    from .union import UnionSource

    opened = []
    bar = Progress("Opening archives", len(paths), options.index.progress, unit="archives", delay=OPENING_DELAY)
    try:
        for path in paths:
            opened.append(_open_one(path, options))
            bar.update(len(opened))
    except BaseException:
        for src in opened:
            src.close()
        raise
    finally:
        bar.close()
    return UnionSource(opened, union_cache.folder_for(options.index))


def _open_one(path: str, options: OpenOptions) -> MountSource:
    """An archive, or a folder (see ``directory.py``; with ``recursive``, its archives are opened
    and indexed now, so that no read waits for an index later)."""
    if not os.path.isdir(path):
        return open_archive(path, options)
    from .directory import DirectorySource

    folder = DirectorySource(path, options)
    if options.lazy:
        return folder
    try:
        folder.open_archives()
    except BaseException:
        folder.close()
        raise
    return folder

"""Where an archive's index lives: beside the archive, else in a cache folder."""

from __future__ import annotations

import os
from typing import List

from ..digest import sha256
from ..errors import IndexFolderNotFoundError, NotADirectoryRatarmountError
from ..io.host_paths import absolute
from ..options import DEFAULT_CACHE_FOLDER, IndexOptions

INDEX_SUFFIX = ".index.sqlite"


def candidate_paths(archive_path: str, options: IndexOptions) -> List[str]:
    """Index paths to try, in order. The first valid existing one is used; a new index is
    written to the first one whose folder is writable."""
    if options.index_file:
        return [absolute(os.path.expanduser(options.index_file))]
    archive = absolute(archive_path)
    digest = sha256(os.fsencode(archive)).hexdigest()[:16]
    base = os.path.basename(archive)
    paths: List[str] = []
    for folder in options.index_folders:
        if not folder:
            paths.append(os.path.join(os.path.dirname(archive), _index_name(base, "", digest)))
        else:
            folder = absolute(os.path.expanduser(folder))
            paths.append(os.path.join(folder, _index_name(base, f".{digest}", digest)))
    return paths


#: Random bytes in the temporary name of an index being written (``<index>.tmp-<hex>``).
_TEMPORARY_RANDOM = 6
#: Bytes the temporary name adds to the index's.
TEMPORARY_EXTRA = len(".tmp-") + 2 * _TEMPORARY_RANDOM
#: The longest index file name: NAME_MAX (255 bytes) less what the temporary name adds.
INDEX_NAME_MAX = 255 - TEMPORARY_EXTRA


def temporary_path(index_path: str) -> str:
    """A new temporary name for the index being written to ``index_path``."""
    return f"{index_path}.tmp-{os.urandom(_TEMPORARY_RANDOM).hex()}"


def _index_name(base: str, tag: str, digest: str) -> str:
    """``base + tag + INDEX_SUFFIX``; for an archive name too long for that (NAME_MAX allows 255
    bytes, and an archive named with 226 of them could not be mounted: found by fuzzing), as
    much of ``base`` as fits, and the path's ``digest`` to tell such names apart."""
    name = f"{base}{tag}{INDEX_SUFFIX}"
    if len(os.fsencode(name)) <= INDEX_NAME_MAX:
        return name
    tail = f".{digest}{INDEX_SUFFIX}"
    return os.fsdecode(os.fsencode(base)[: INDEX_NAME_MAX - len(tail)]) + tail


def _default_cache() -> str:
    return absolute(os.path.expanduser(DEFAULT_CACHE_FOLDER))


def check_named_folders(options: IndexOptions) -> None:
    """Raise ``IndexFolderNotFoundError`` naming the first folder the options name for indexes
    (``index_folders``, the folder of ``index_file``) that does not exist; the default cache
    folder (~/.cache/ratarmount) may be missing: it is made when an index goes there."""
    if options.index_file:
        index_file = absolute(os.path.expanduser(options.index_file))
        folder = os.path.dirname(index_file)
        if not os.path.exists(folder):
            raise IndexFolderNotFoundError(f"{folder}: the folder of the index file {index_file} does not exist")
        if not os.path.isdir(folder):
            raise NotADirectoryRatarmountError(f"{folder}: the folder of the index file {index_file} is not a folder")
        return
    for name in options.index_folders:
        if not name:
            continue
        folder = absolute(os.path.expanduser(name))
        if folder != _default_cache() and not os.path.exists(folder):
            raise IndexFolderNotFoundError(f"{folder}: the index folder does not exist")
        if os.path.exists(folder) and not os.path.isdir(folder):  # (was "its folder cannot be written")
            raise NotADirectoryRatarmountError(f"{folder}: the index folder is not a folder")


def folder_writable(path: str) -> bool:
    """Whether an index can be created at ``path``; only the default cache folder is made
    when missing (a folder the user named must exist: ``check_named_folders``)."""
    folder = os.path.dirname(path)
    if folder == _default_cache():
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError:
            return False
    return os.path.isdir(folder) and os.access(folder, os.W_OK | os.X_OK)

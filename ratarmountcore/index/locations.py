"""Where an archive's index lives: beside the archive, else in a cache folder."""

from __future__ import annotations

import os
from typing import List

from ..digest import sha256
from ..options import IndexOptions

INDEX_SUFFIX = ".index.sqlite"


def candidate_paths(archive_path: str, options: IndexOptions) -> List[str]:
    """Index paths to try, in order. The first valid existing one is used; a new index is
    written to the first one whose folder is writable."""
    if options.index_file:
        return [os.path.abspath(os.path.expanduser(options.index_file))]
    archive = os.path.abspath(archive_path)
    digest = sha256(os.fsencode(archive)).hexdigest()[:16]
    paths: List[str] = []
    for folder in options.index_folders:
        if not folder:
            paths.append(archive + INDEX_SUFFIX)
        else:
            folder = os.path.abspath(os.path.expanduser(folder))
            paths.append(os.path.join(folder, f"{os.path.basename(archive)}.{digest}{INDEX_SUFFIX}"))
    return paths


def folder_writable(path: str) -> bool:
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK | os.X_OK)

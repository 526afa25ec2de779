"""Paths on the host as the kernel resolves them."""

from __future__ import annotations

import os
from typing import List


def absolute(path: str) -> str:
    """``path`` made absolute the way the kernel finds it: its folder resolved (symbolic links
    followed), its last component as given. ``os.path.abspath`` drops ``link/..`` as text, where
    the kernel goes to the link target's parent: ``ratarmount lnk/../x.tar`` mounted another
    ``x.tar`` (and wrote the index beside it), a mount point so named was another folder (found by
    fuzzing). The last component is kept, so an archive that is a symbolic link keeps its index
    beside the link."""
    folder, name = os.path.split(path)
    if name in ("", ".", ".."):
        return os.path.realpath(path)
    return os.path.join(os.path.realpath(folder or "."), name)


def missing_folders(folder: str) -> List[str]:
    """``folder`` and those of its ancestors that do not exist, innermost first."""
    missing: List[str] = []
    while folder and not os.path.exists(folder):
        missing.append(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return missing


def remove_empty(folders: List[str]) -> None:
    """Remove ``folders`` (innermost first) while they are empty."""
    for folder in folders:
        try:
            os.rmdir(folder)
        except OSError:
            return

"""Member paths as the index keeps them: bytes (UTF-8, other bytes kept as surrogate escapes
decode them), separated by "/", a top-level name's parent being "/" itself."""

from __future__ import annotations

from typing import Tuple

ROOT = b"/"


def join_path(parent: bytes, name: bytes) -> bytes:
    """The path of ``name`` in folder ``parent``."""
    return ROOT + name if parent == ROOT else parent + b"/" + name


def parent_and_name(path: bytes) -> Tuple[bytes, bytes]:
    """``join_path``'s arguments for ``path`` (not the root)."""
    parent, _, name = path.rpartition(b"/")
    return parent or ROOT, name

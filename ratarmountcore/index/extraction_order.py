"""Which members of an archive with type conflicts GNU tar's extraction leaves in place.

Most archives name every path once, or several times with the same type (``tar -r`` appends a
newer version of a file): the last member of each path wins, and the index marks that with one
query. When a path is a folder in one member and a file, link or device in another, what ``tar
-x`` leaves depends on the order of the members, and this module replays it:

- a member below a path that is not a folder at that point is not extracted ("Not a
  directory"; GNU tar follows a symbolic link there, which an index never does);
- a folder that does not exist yet is made for the members below it (``mkdir -p``);
- a folder replaces a file, link or device of its name;
- a file, link or device replaces a folder only while the folder is empty ("File exists") --
  except the folder of an archive inside the archive (``-r``), which is replaced with all it
  holds, as a later member of the same name replaces any other.

The replay needs only each member's id (archive order), parent, name, whether it is a folder
(and an archive's), and only runs for archives that have such a conflict.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Set, Tuple

from .paths import ROOT, join_path, parent_and_name


class _Node:
    __slots__ = ("is_dir", "row", "children", "archive")

    def __init__(self, is_dir: bool, row: int, archive: bool = False) -> None:
        self.is_dir = is_dir
        #: The member in place (0: a folder made for the members below it).
        self.row = row
        #: Entries extracted into it so far (a folder only).
        self.children = 0
        #: Whether it is the folder of an archive inside the archive.
        self.archive = archive


def replay(rows: Iterable[Tuple[int, bytes, bytes, bool, bool]]) -> Tuple[Set[int], List[bytes]]:
    """``rows``: (id, parent, name, is a folder, is an archive's folder) of every member in
    archive order; the archive's own "./" member has parent and name ``b""``. Returns the ids
    of the members in place at the end, and the paths of the folders made for members below
    them (no member of their own)."""
    tree: Dict[bytes, _Node] = {ROOT: _Node(True, 0)}
    for row, parent, name, is_dir, archive in rows:
        if not name:  # the root itself: a folder, always there
            tree[ROOT].row = row
            continue
        if not _make_parents(tree, parent):
            continue
        path = join_path(parent, name)
        node = tree.get(path)
        if node is None:
            tree[path] = _Node(is_dir, row, archive)
            tree[parent].children += 1
        elif is_dir or not node.is_dir or not node.children or node.archive:
            if not is_dir and node.children:  # an archive's folder, and all it holds
                below = path + b"/"
                for inner in [key for key in tree if key.startswith(below)]:
                    del tree[inner]
                node.children = 0
            node.is_dir = is_dir
            node.row = row
            node.archive = archive
            # (A folder replaced by a folder keeps its entries.)
    kept = {node.row for node in tree.values() if node.row}
    made = [path for path, node in tree.items() if not node.row and path != ROOT]
    return kept, made


def _make_parents(tree: Dict[bytes, _Node], parent: bytes) -> bool:
    """Whether ``parent`` is (or can be made) a folder: every missing folder on the way is made,
    unless something that is not a folder is in the way."""
    node = tree.get(parent)
    if node is not None:
        return node.is_dir
    missing = [parent]
    above = parent_and_name(parent)[0]
    while True:
        node = tree.get(above)
        if node is not None:
            if not node.is_dir:
                return False
            break
        missing.append(above)
        above = parent_and_name(above)[0]
    for path in reversed(missing):
        tree[path] = _Node(True, 0)
        tree[parent_and_name(path)[0]].children += 1
    return True

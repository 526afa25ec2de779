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
  holds, as a later member of the same name replaces any other;
- the folder of an archive inside the archive is a file to ``tar -x``: a later folder or archive
  of its name replaces it with all it holds, and it does not replace a folder that holds
  entries (its members are then left out: the rows from its row to the end its scan recorded);
  the members after those rows find a file there (nothing is made below it, no link through it);
- a folder shown under another name than the archive's (``--strip-tar-extension``: ``NAME.tar``
  as ``NAME``) also holds the archive's own name as a file: a later member of that name, or a
  hard link to it, meets the archive there.

Hard links are made as ``tar -x`` makes them, with ``linkat`` on the tree as it is at that
point: the target is the member in place there (a symbolic link to a folder on the way is
followed when it is in place and GNU tar made it at once: relative, without ``..``); a link to a
missing target, or one below something that is not a folder, fails and changes nothing but the
folders made for its name; a link to a folder fails after tar removed what had the link's name
(the kernel checks the new name first: EEXIST, tar removes it and tries again: EPERM).

The replay needs only each member's id (archive order), parent, name, whether it is a folder
(and an archive's) and the targets of links, and only runs for archives that have such a
conflict.
"""

from __future__ import annotations

import posixpath
from typing import Dict, Iterable, List, NamedTuple, Optional, Set, Tuple

from .paths import ROOT, join_path, parent_and_name

#: Symbolic links followed on the way to a hard link's target (the kernel's limit, ELOOP).
MAX_LINK_HOPS = 40

#: (id, parent, name, is a folder, for an archive's folder the id after its members' rows (else
#: 0), a symbolic link's target or None, a hard link's target path or None). A name None: a
#: member left out whose folders tar -x makes all the same (a symbolic link with an empty target).
Row = Tuple[int, bytes, Optional[bytes], bool, int, Optional[bytes], Optional[bytes]]


class Replayed(NamedTuple):
    #: The ids of the members in place at the end.
    kept: Set[int]
    #: The paths of the folders made for members below them (no member of their own).
    made: List[bytes]
    #: Hard links made: link id -> id of the member whose data it has (never itself a link).
    links: Dict[int, int]


class _Node:
    __slots__ = ("is_dir", "row", "children", "archive", "symlink", "shown")

    def __init__(self, is_dir: bool, row: int, archive: int = 0, symlink: Optional[bytes] = None) -> None:
        self.is_dir = is_dir
        #: The member in place (0: a folder made for the members below it).
        self.row = row
        #: Entries extracted into it so far (a folder only).
        self.children = 0
        #: For the folder of an archive inside the archive, the id after its members' rows (the
        #: rows after them see the file tar -x made), else 0.
        self.archive = archive
        #: A symbolic link's target.
        self.symlink = symlink
        #: The path of the folder that shows this archive under another name (this node is the
        #: archive's file under its own name), else None.
        self.shown: Optional[bytes] = None


def replay(rows: Iterable[Row], stored_names: Optional[Dict[int, bytes]] = None) -> Replayed:
    """``rows``: every member in archive order (``Row``); the archive's own "./" member has
    parent and name ``b""``. ``stored_names``: archive folder id -> the archive's own name,
    for folders shown under another name."""
    tree: Dict[bytes, _Node] = {ROOT: _Node(True, 0)}
    links: Dict[int, int] = {}
    refused = 0  # the id after the rows of an inner archive tar could not put in place
    archives = False  # whether an archive's folder was placed (then its path is a file after its rows)
    for row, parent, name, is_dir, archive, symlink, hardlink in rows:
        if name is None:
            if row >= refused and not (archives and _below_archive_file(tree, parent, row)):
                _make_parents(tree, parent)
            continue
        if not name:  # the root itself: a folder, always there
            tree[ROOT].row = row
            continue
        if row < refused or (archives and _below_archive_file(tree, parent, row)):
            continue
        archives = archives or bool(archive)
        target = None
        if hardlink is not None:
            target, missing = _find(tree, hardlink, row)
            if target is None:  # (the kernel looks at the target before the new name)
                if missing:  # ENOENT: tar makes the folders of the new name and tries again
                    _make_parents(tree, parent)
                continue
        if not _make_parents(tree, parent):
            continue
        path = join_path(parent, name)
        node = tree.get(path)
        replaceable = node is not None and (not node.is_dir or not node.children or node.archive)
        if target is not None:
            if node is target or (
                node is not None and node.row and links.get(node.row, node.row) == links.get(target.row, target.row)
            ):
                continue  # EEXIST, but the name is the target already: tar takes that as made
            if target.is_dir and not target.archive:  # (an inner archive is a file to tar -x)
                if node is not None and replaceable:  # removed (EEXIST), then EPERM
                    _remove(tree, path, node)
                continue
            links[row] = links.get(target.row, target.row)
        if archive and node is not None and not replaceable:  # a file in tar -x: "File exists" over a folder
            refused = archive
            continue
        stored_name = stored_names.get(row) if archive and stored_names else None
        if stored_name is not None:
            if not _place_stored(tree, join_path(parent, stored_name), row, path):
                refused = archive
                continue
            node = tree.get(path)  # (it may have been the folder of the archive replaced there)
            replaceable = node is not None and (not node.is_dir or not node.children or node.archive)
        if node is not None and node.shown is not None:  # the archive's own name replaced: the archive too
            _remove_shown(tree, node)
        if node is None:
            tree[path] = _Node(is_dir, row, archive, symlink)
            tree[parent].children += 1
        elif is_dir or replaceable:
            if node.children and (not is_dir or archive or node.archive):
                # An archive's folder (a file in tar -x) replaced, or replacing, with all it holds.
                _remove_below(tree, path)
                node.children = 0
            node.is_dir = is_dir
            node.row = row
            node.archive = archive
            node.symlink = symlink
            # (A folder replaced by a folder keeps its entries.)
    kept = {node.row for node in tree.values() if node.row and node.shown is None}
    made = [path for path, node in tree.items() if not node.row and path != ROOT]
    return Replayed(kept, made, links)


def _remove_below(tree: Dict[bytes, _Node], path: bytes) -> None:
    below = path + b"/"
    for inner in [key for key in tree if key.startswith(below)]:
        del tree[inner]


def _remove(tree: Dict[bytes, _Node], path: bytes, node: _Node) -> None:
    if node.children:  # (an archive's folder)
        _remove_below(tree, path)
    if node.shown is not None:
        _remove_shown(tree, node)
    del tree[path]
    tree[parent_and_name(path)[0]].children -= 1


def _place_stored(tree: Dict[bytes, _Node], stored: bytes, row: int, shown: bytes) -> bool:
    """Put the archive ``row`` shown at ``shown`` as the file tar -x makes under its own name
    ``stored``; False when a folder that holds entries is there ("File exists")."""
    node = tree.get(stored)
    if node is not None:
        if node.is_dir and node.children and not node.archive:
            return False
        _remove(tree, stored, node)
    placeholder = _Node(False, row)
    placeholder.shown = shown
    tree[stored] = placeholder
    tree[parent_and_name(stored)[0]].children += 1
    return True


def _remove_shown(tree: Dict[bytes, _Node], placeholder: _Node) -> None:
    """The archive file ``placeholder`` stands for is replaced: so is its folder, if still shown."""
    shown = placeholder.shown
    placeholder.shown = None
    if shown is None:
        return
    folder = tree.get(shown)
    if folder is not None and folder.row == placeholder.row:
        _remove(tree, shown, folder)


def _below_archive_file(tree: Dict[bytes, _Node], folder: bytes, row: int) -> bool:
    """Whether ``folder`` is, or is below, an archive's folder whose rows end before ``row``
    (a file to tar -x)."""
    while True:
        node = tree.get(folder)
        if node is not None and node.archive and row >= node.archive:
            return True
        if folder == ROOT:
            return False
        folder = parent_and_name(folder)[0]


def _find(tree: Dict[bytes, _Node], path: bytes, row: int) -> Tuple[Optional[_Node], bool]:
    """The node at ``path`` as ``linkat`` resolves it for the member ``row``: symbolic links to
    folders on the way are followed when GNU tar made them at once (relative, without ``..``;
    others are placeholder files until the end of the extraction), an archive's folder after
    its rows is a file. (None, True) when a name on the way is missing (ENOENT), (None, False)
    when one is not a folder (ENOTDIR) or on a loop (ELOOP)."""
    parts = [part for part in path.split(b"/") if part]
    current = ROOT
    index = hops = 0
    while index < len(parts):
        if parts[index] == b".":  # (kept by the scanner: the target must be a folder)
            if index == len(parts) - 1:
                node = tree.get(current)
                return (None if node is None or (node.archive and row >= node.archive) else node), False
            index += 1
            continue
        child = join_path(current, parts[index])
        node = tree.get(child)
        if node is None:
            return None, True
        if index == len(parts) - 1:
            return node, False
        if node.symlink is not None:
            target = node.symlink
            hops += 1
            if not target or target.startswith(b"/") or b".." in target.split(b"/") or hops > MAX_LINK_HOPS:
                return None, False
            resolved = posixpath.normpath(join_path(current, target))
            parts = [part for part in resolved.split(b"/") if part] + parts[index + 1 :]
            current, index = ROOT, 0
            continue
        if not node.is_dir or (node.archive and row >= node.archive):
            return None, False
        current, index = child, index + 1
    return tree[ROOT], False


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

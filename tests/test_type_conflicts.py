"""Names that are folders in one member and files (links, devices) in another: the tree shown is
what ``tar -x`` leaves in place, which depends on the members' order (``extraction_order.py``)."""

from __future__ import annotations

import dataclasses
import io
import tarfile
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tarcompare import (
    FRESH,
    Entry,
    check_archive_against_tar,
    compare_trees,
    snapshot_dir,
    snapshot_source,
    tar_extract,
)

import ratarmountcore
from ratarmountcore.index.extraction_order import replay

#: (name, kind): "f" a file, "d" a folder, "h" a hard link to "t", "s" a symlink to "t"
Member = Tuple[str, str]


def _write(archive: Path, members: Sequence[Tuple[str, ...]]) -> None:
    """``members``: (name, kind) as ``Member`` says, or (name, kind, target) for links to
    another name than "t"."""
    with tarfile.open(archive, "w", format=tarfile.GNU_FORMAT) as tar:
        for i, (name, kind, *target) in enumerate(members):
            info = tarfile.TarInfo(name)
            info.mtime = 1_000_000 + i
            info.mode = 0o750 if kind == "d" else 0o640
            data = b""
            if kind == "d":
                info.type = tarfile.DIRTYPE
            elif kind in "hs":
                info.type = tarfile.LNKTYPE if kind == "h" else tarfile.SYMTYPE
                info.linkname = target[0] if target else "t"
            else:
                data = f"{name}#{i}".encode()
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_the_replay_keeps_what_tar_leaves_in_place() -> None:
    def kept(*rows: Tuple[str, bool]) -> Tuple[List[int], List[bytes]]:
        members = []
        for i, (path, is_dir) in enumerate(rows, start=1):
            parent, _, name = path.rpartition("/")
            members.append((i, (parent or "/").encode(), name.encode(), is_dir, False, None, None))
        ids, made, _links = replay(members)
        return sorted(ids), sorted(made)

    assert kept(("/a", True), ("/a/b", False), ("/a", False)) == ([1, 2], [])  # a folder with entries stays
    assert kept(("/a", True), ("/a", False)) == ([2], [])  # an empty one is replaced
    assert kept(("/a", False), ("/a/b", False)) == ([1], [])  # nothing below a file
    assert kept(("/a", False), ("/a", True), ("/a/b", False)) == ([2, 3], [])  # a folder replaces a file
    assert kept(("/a/b/c", False), ("/a/b", False)) == ([1], [b"/a", b"/a/b"])  # folders made on the way
    assert kept(("/a/b", False), ("/a", True)) == ([1, 2], [])  # the member of a made folder is kept
    # The folder of an archive inside the archive (-r) is replaced with all it holds.
    rows = [(1, b"/", b"x", True, 3, None, None), (2, b"/x", b"m", False, 0, None, None)]
    assert replay([*rows, (3, b"/", b"x", False, 0, None, None)]) == ({3}, [], {})
    # An archive refused by a folder that holds entries: its rows (up to the end its scan
    # recorded) are left out, the outer members after them are not, also below its name.
    rows = [
        (1, b"/", b"d", True, 0, None, None),
        (2, b"/d", b"f", False, 0, None, None),
        (3, b"/", b"d", True, 5, None, None),
        (4, b"/d", b"m", False, 0, None, None),
        (5, b"/d", b"g", False, 0, None, None),
    ]
    assert replay(rows) == ({1, 2, 5}, [], {})
    # Shown under another name (g for g.tar), the archive is also the file g.tar to tar -x.
    rows = [(1, b"/", b"g", True, 3, None, None), (2, b"/g", b"m", False, 0, None, None)]
    assert replay([*rows, (3, b"/", b"g.tar", False, 0, None, None)], {1: b"g.tar"}) == ({3}, [], {})
    assert replay([*rows, (3, b"/", b"h", False, 0, None, b"/g.tar")], {1: b"g.tar"}) == ({1, 2, 3}, [], {3: 1})
    # Hard links: made on the tree as it is then, through a symbolic link to a folder in place.
    rows = [
        (1, b"/", b"d", True, False, None, None),
        (2, b"/d", b"f", False, False, None, None),
        (3, b"/", b"s", False, False, b"d", None),
        (4, b"/", b"h", False, False, None, b"/s/f"),  # made: d/f's data
        (5, b"/", b"d", False, False, None, None),  # "File exists": d is not empty
        (6, b"/", b"h", False, False, None, b"/d"),  # to a folder: h removed, then EPERM
        (7, b"/x", b"h", False, False, None, b"/missing"),  # fails, but x is made for it
    ]
    assert replay(rows) == ({1, 2, 3}, [b"/x"], {4: 2})


@pytest.mark.parametrize(
    "members",
    [
        [("a/", "d"), ("a/b", "f"), ("a", "f")],  # "a: Cannot open: File exists"
        [("a", "f"), ("a/b", "f")],  # "a/b: Cannot open: Not a directory"
        [("a", "f"), ("a/b/c", "f"), ("a/", "d"), ("a/d", "f")],
        [("t", "f"), ("g/", "d"), ("g/x", "f"), ("g", "h")],  # "g: Cannot hard link to 't': File exists"
        [("t", "f"), ("g/", "d"), ("g", "h"), ("g/x", "f")],  # an empty folder is replaced
        [("a/b/c", "f"), ("a/b", "f"), ("a/", "d")],
    ],
)
def test_conflicts_show_what_tar_extracts(tmp_path: Path, members: List[Member]) -> None:
    archive = tmp_path / "conflicts.tar"
    _write(archive, members)
    check_archive_against_tar(archive, tmp_path, tar_status=(0, 2))


def test_nothing_is_shown_below_a_symlink(tmp_path: Path) -> None:
    """GNU tar writes a member below a symbolic link into the link's target; the index never
    follows a link, so the member is not shown at all (and nothing leaves the mount)."""
    archive = tmp_path / "link.tar"
    _write(archive, [("t/", "d"), ("s", "s"), ("s/c", "f")])
    with ratarmountcore.open(str(archive), FRESH) as src:
        assert sorted(src.listdir("/")) == ["s", "t"]
        assert src.readlink("/s") == "t"
        assert not src.exists("/s/c") and src.listdir("/t") == []


_NAMES = st.lists(st.sampled_from("ab"), min_size=1, max_size=3).map("/".join)


def _without_folder_times(tree: Dict[str, Entry]) -> Dict[str, Entry]:
    return {path: dataclasses.replace(e, mtime_ns=0) if e.kind == "d" else e for path, e in tree.items()}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(members=st.lists(st.tuples(_NAMES, st.sampled_from("fdh")), min_size=1, max_size=8))
def test_any_order_of_folders_and_files_shows_what_tar_extracts(tmp_path: Path, members: List[Member]) -> None:
    """Generated archives whose few names are files, folders or hard links in turn (the link
    target "t" first): the tree equals ``tar -x`` of the same archive, entry for entry. Folder
    times are left out: GNU tar sets a folder's time when the next member is not in it, and a
    member extracted into it later changes it again (the index keeps the member's time)."""
    _compare_with_tar(tmp_path, [("t", "f")] + [(name + "/" if kind == "d" else name, kind) for name, kind in members])


def _compare_with_tar(tmp_path: Path, members: Sequence[Tuple[str, ...]]) -> None:
    """``members`` (as ``_write`` takes them) written, extracted with ``tar -x`` and opened: the
    same tree, folder times left out."""
    folder = tmp_path / f"case{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    archive = folder / "generated.tar"
    _write(archive, members)
    result = tar_extract(archive, folder / "extracted", check=False)
    assert result.returncode in (0, 2), result.stderr
    expected = _without_folder_times(snapshot_dir(folder / "extracted"))
    with ratarmountcore.open(str(archive), FRESH) as src:
        actual = _without_folder_times(snapshot_source(src))
    compare_trees(expected, actual, {p for p, e in expected.items() if e.kind == "d"}, check_root=False)


_TARGETS = st.sampled_from(["t", "a", "b", "a/b", "b/a", "s/t", "s/a", "s/b/a", ".", "a/.", "/a", "../a", ""])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    members=st.lists(
        # (Symbolic links are all named "s" and nothing else is: tar -x writes a member below a
        # link into the link's target, which the index never does; see the test above.)
        st.one_of(
            st.tuples(_NAMES, st.sampled_from("fdhh"), _TARGETS), st.tuples(st.just("s"), st.just("s"), _TARGETS)
        ),
        min_size=1,
        max_size=9,
    )
)
def test_hard_links_are_made_on_the_tree_as_it_is_then(tmp_path: Path, members: List[Tuple[str, str, str]]) -> None:
    """Generated archives of files, folders, hard links and symbolic links to any of a few
    names (through other links; hard links also absolute or with ``..``), names changing type: a hard
    link is made where ``tar -x`` makes it, from the member in place then (or not at all, or
    removing what had its name), as the extracted tree shows."""
    # (Symbolic links not absolute or with "..": GNU tar makes those at the end, where it checks
    # that its placeholder is still there by inode number, which a later member may reuse.)
    delayed = lambda target: not target or target.startswith("/") or ".." in target  # noqa: E731
    written = [
        (name, kind, "t" if kind == "s" and delayed(target) else target or "t") for name, kind, target in members
    ]
    _compare_with_tar(tmp_path, [("t", "f"), *written])


def test_a_member_named_like_a_versions_folder_is_that_member(tmp_path: Path) -> None:
    """``x.versions`` stored as a file: it is shown as the file it is, and nothing below it
    resolves (the pseudo folder of x's versions is hidden by it, through the API as through a
    mount); without it, ``x.versions/1`` is x's first version."""
    archive = tmp_path / "versions.tar"
    with tarfile.open(archive, "w") as tar:
        for name, data in (("x", b"one"), ("x", b"two"), ("y", b"1"), ("y", b"2"), ("x.versions", b"real")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with ratarmountcore.open(str(archive), FRESH) as src:
        assert src.read("/x.versions") == b"real" and src.read("/x") == b"two"
        assert not src.exists("/x.versions/1") and not src.exists("/x.versions/2")
        assert src.read("/y.versions/1") == b"1" and src.read("/y") == b"2"


def test_no_versions_are_found_below_a_file(tmp_path: Path) -> None:
    """A member below a name that is a file when tar meets it is not extracted, and its
    versions are not found either (the API showed a/b.versions/1 below the file a, where the
    kernel never asks: ENOTDIR through a mount)."""
    archive = tmp_path / "below.tar"
    _write(archive, [("a", "f"), ("a/b", "f")])
    with ratarmountcore.open(str(archive), FRESH) as src:
        assert src.info("/a").is_file and not src.exists("/a/b")
        for path in ("/a/b.versions", "/a/b.versions/1", "/missing/b.versions", "/missing/b.versions/1"):
            assert not src.exists(path), path
        assert src.listdir("/a.versions") == ["1"]


def test_versions_are_the_members_of_a_name(tmp_path: Path) -> None:
    """``b.versions`` lists the members named b: a file b that could not replace the folder tar
    made for ``b/c`` is version 1, and the made folder (no member) is none of them."""
    archive = tmp_path / "made.tar"
    _write(archive, [("b/c", "f"), ("b", "f"), ("d/", "d"), ("d", "f")])
    with ratarmountcore.open(str(archive), FRESH) as src:
        assert src.info("/b").is_dir and src.listdir("/b.versions") == ["1"]
        assert src.read("/b.versions/1") == b"b#1" and not src.exists("/b.versions/2")
        assert src.listdir("/d.versions") == ["1", "2"] and src.read("/d.versions/2") == b"d#3"
        assert not src.exists("/x.versions")

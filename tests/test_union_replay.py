"""Unions with folder sources against a model of ``tar -x`` of the sources one after the other
(``sources/union_replay.py``): any mix of folders and tars whose names are files in some, folders
in others and only implied by member paths in others still."""

from __future__ import annotations

import errno
import io
import os
import stat
import subprocess
import tarfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest
from conftest import Mounter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ratarmountcore
from ratarmountcore.options import OpenOptions


@pytest.fixture(autouse=True)
def private_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


#: A source: (is a folder, {path: "f" or "d"}); folders' parents are in it, a tar's may be implied.
Source = Tuple[bool, Dict[str, str]]

NAMES = ["a", "b"]


def _all_paths(depth: int) -> List[str]:
    paths = [""]
    out: List[str] = []
    for _ in range(depth):
        paths = [f"{p}/{n}" if p else n for p in paths for n in NAMES]
        out += paths
    return out


PATHS = _all_paths(3)


@st.composite
def sources(draw: st.DrawFn) -> List[Source]:
    """2-4 sources over the same few names (so that they meet on them): each name absent, a file
    or a folder; a tar's folders with members below are left out (implied) half of the time.
    Nothing below a file of the same tar: a union shows such a tar as its own ``tar -x`` left it,
    also where the union refuses the file (see docs/design.md, "Unions")."""
    result: List[Source] = []
    for _ in range(draw(st.integers(2, 4))):
        folder = draw(st.booleans())
        tree: Dict[str, str] = {}
        for path in PATHS:  # (parents first)
            parent = path.rpartition("/")[0]
            if parent and tree.get(parent, "" if folder else "d") != "d":
                continue  # (nothing below a file; a folder's below its own folders only)
            parts = path.split("/")
            if any(tree.get("/".join(parts[:i])) == "f" for i in range(1, len(parts))):
                continue
            kind = draw(st.sampled_from(["", "", "f", "d"] if path.count("/") < 2 else ["", "", "", "f"]))
            if kind:
                tree[path] = kind
        if not folder:
            for path in [p for p, kind in tree.items() if kind == "d"]:
                if any(p.startswith(path + "/") for p in tree) and draw(st.booleans()):
                    del tree[path]  # implied by the members below it
        result.append((folder, tree))
    return result


def folder_mode(number: int) -> int:
    return 0o701 | (number << 3)


def file_data(number: int, path: str) -> bytes:
    return f"{number}:{path}".encode()


def make(tmp_path: Path, number: int, source: Source) -> str:
    folder, tree = source
    if folder:
        root = tmp_path / f"s{number}"
        root.mkdir()
        for path, kind in sorted(tree.items()):
            if kind == "d":
                (root / path).mkdir()
            else:
                (root / path).write_bytes(file_data(number, path))
        for path, kind in tree.items():
            if kind == "d":
                os.chmod(root / path, folder_mode(number))
        return str(root)
    archive = tmp_path / f"s{number}.tar"
    with tarfile.open(archive, "w", format=tarfile.GNU_FORMAT) as tar:
        for path, kind in sorted(tree.items(), key=lambda item: item[0].split("/")):
            info = tarfile.TarInfo(path)
            info.mtime = 1_600_000_000
            if kind == "d":
                info.type, info.mode = tarfile.DIRTYPE, folder_mode(number)
                tar.addfile(info)
            else:
                data = file_data(number, path)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return str(archive)


def model(all_sources: List[Source]) -> Dict[str, Tuple[str, int]]:
    """tar -x of each source in order: path -> (kind, mode or owner); a file or a folder replaces
    what is there (a file takes what is below along), except that a file is refused where a
    folder holds something ("File exists"), a folder only implied is made where nothing is and
    makes its members fail where a file is."""
    fs: Dict[str, Tuple[str, int]] = {}

    def parents_are_folders(path: str) -> bool:
        parts = path.split("/")
        return all(fs.get("/".join(parts[:i]), ("d", 0))[0] == "d" for i in range(1, len(parts)))

    for number, (_folder, tree) in enumerate(all_sources):
        implied = {"/".join(p.split("/")[:i]) for p in tree for i in range(1, p.count("/") + 1)} - set(tree)
        entries = [(p, tree[p]) for p in tree] + [(p, "i") for p in implied]
        for path, kind in sorted(entries, key=lambda item: item[0].split("/")):
            if not parents_are_folders(path):
                continue
            if kind == "i":
                fs.setdefault(path, ("d", 0o755))
                continue
            if kind == "f" and fs.get(path, ("",))[0] == "d" and any(p.startswith(path + "/") for p in fs):
                continue  # (rmdir of a folder that is not empty fails)
            if kind == "f" or fs.get(path, ("d",))[0] != "d":
                for below in [p for p in fs if p.startswith(path + "/")]:
                    del fs[below]
            fs[path] = ("f", number) if kind == "f" else ("d", folder_mode(number))
    return fs


def shown(src: ratarmountcore.MountSource) -> Dict[str, Tuple[str, int]]:
    out: Dict[str, Tuple[str, int]] = {}
    stack = [""]
    while stack:
        folder = stack.pop()
        for name in src.listdir(folder or "/"):
            path = f"{folder}/{name}" if folder else name
            info = src.info("/" + path)
            if info.is_dir:
                out[path] = ("d", stat.S_IMODE(info.mode))
                stack.append(path)
            else:
                data = src.read("/" + path)
                out[path] = ("f", int(data.split(b":")[0]))
                assert data == file_data(out[path][1], path)
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sources())
def test_a_union_of_folders_and_tars_is_what_tar_x_of_each_in_turn_leaves(
    tmp_path_factory: pytest.TempPathFactory, all_sources: List[Source]
) -> None:
    tmp_path = tmp_path_factory.mktemp("union")
    paths = [make(tmp_path, number, source) for number, source in enumerate(all_sources)]
    expected = model(all_sources)
    with ratarmountcore.open(paths) as src:
        assert shown(src) == expected
        for path in PATHS:  # lookups agree with the listings, also of names not shown
            info: Optional[ratarmountcore.FileInfo] = src.lookup("/" + path)
            assert (info is not None) == (path in expected), path
        if not any(folder for folder, _tree in all_sources):
            check_folder_links(src, expected)
        for folder in [""] + [p for p, (kind, _) in expected.items() if kind == "d"]:
            for row in src.list_stat_rows("/" + folder) or []:  # listings agree with lookups
                child = f"/{folder}/{row[0].decode()}" if folder else f"/{row[0].decode()}"
                assert row[6] == src.info(child).nlink, child


def check_folder_links(src: ratarmountcore.MountSource, expected: Dict[str, Tuple[str, int]]) -> None:
    """Each folder's link count is what tar -x leaves (2 and one per folder in it) in lookups,
    listings with attributes and stat rows alike. (Unions of archives only: a folder source's
    folders keep their own counts.)"""
    folders = [""] + [path for path, (kind, _) in expected.items() if kind == "d"]
    for folder in folders:
        inside = [p for p in folders if p and p.rpartition("/")[0] == folder]
        links = 2 + len(inside)
        assert src.info("/" + folder).nlink == links, folder
        for name in inside:
            child = name.rpartition("/")[2]
            assert src.info("/" + name).nlink == 2 + sum(p.rpartition("/")[0] == name for p in folders), name
            listed = dict(src.list_entries("/" + folder) or [])
            assert listed[child].nlink == src.info("/" + name).nlink, name
            rows = {row[0]: row for row in src.list_stat_rows("/" + folder) or []}
            assert rows[child.encode()][6] == src.info("/" + name).nlink, name


def _tar(path: Path, members: Dict[str, Optional[bytes]]) -> None:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("api", ["low", "high"])
@pytest.mark.parametrize("first", ["folder", "tar"])
def test_members_a_file_refused_stay_refused_when_a_later_source_has_the_folder(
    mounter: Mounter, tmp_path: Path, api: str, first: str
) -> None:
    """x is a file in the first source, only implied by a/x/a in the second, a folder in the
    third: tar -x refused x/a, so the folder is empty (x/a was shown, found by fuzzing)."""
    if first == "folder":
        (tmp_path / "f0").mkdir()
        (tmp_path / "f0" / "x").write_bytes(b"file x")
        (tmp_path / "f0" / "other").write_bytes(b"other")
        sources = [tmp_path / "f0"]
    else:
        (tmp_path / "f0").mkdir()
        (tmp_path / "f0" / "other").write_bytes(b"other")
        _tar(tmp_path / "e.tar", {"x": b"file x"})
        sources = [tmp_path / "f0", tmp_path / "e.tar"]
    _tar(tmp_path / "a.tar", {"x/a": b"refused"})
    _tar(tmp_path / "b.tar", {"x": None})
    sources += [tmp_path / "a.tar", tmp_path / "b.tar"]
    with ratarmountcore.open([str(p) for p in sources]) as src:
        assert src.listdir("/x") == [] and not src.exists("/x/a")
    mnt = mounter.mount(*sources, extra=["--fuse-api", api])
    assert os.listdir(mnt / "x") == []
    with pytest.raises(OSError) as caught:
        os.stat(mnt / "x" / "a")
    assert caught.value.errno == errno.ENOENT
    mounter.unmount(mnt)


def test_a_folder_only_implied_in_an_archive_of_a_folder_source_replaces_no_file(tmp_path: Path) -> None:
    """-r: b.tar/a is a file in the first folder; the second folder's b.tar is an archive whose
    a/c/f only implies a: the file stays (the implied folder replaced it, a/c/f was served)."""
    (tmp_path / "f0" / "b.tar").mkdir(parents=True)
    (tmp_path / "f0" / "b.tar" / "a").write_bytes(b"file a")
    (tmp_path / "f1").mkdir()
    _tar(tmp_path / "f1" / "b.tar", {"a/c/f": b"refused", "g": b"g"})
    with ratarmountcore.open([str(tmp_path / "f0"), str(tmp_path / "f1")], OpenOptions(recursive=True)) as src:
        assert sorted(src.listdir("/b.tar")) == ["a", "g"]
        assert src.read("/b.tar/a") == b"file a" and not src.exists("/b.tar/a/c/f")


@pytest.mark.parametrize("api", ["low", "high"])
def test_two_hard_links_to_one_archive_of_a_folder_source_are_two_folders(
    mounter: Mounter, tmp_path: Path, api: str
) -> None:
    """-r: the folder holds one archive under two names; an earlier tar adds a member below one of
    them only. Each name lists its own entries through the mount (the kernel got one folder inode
    for both, and listed /c.tar as /a.tar, found by fuzzing)."""
    (tmp_path / "folder").mkdir()
    _tar(tmp_path / "folder" / "a.tar", {"x/f": b"f"})
    os.link(tmp_path / "folder" / "a.tar", tmp_path / "folder" / "c.tar")
    _tar(tmp_path / "s0.tar", {"a.tar/extra": b"extra"})
    sources = [tmp_path / "s0.tar", tmp_path / "folder"]
    expected = {"/a.tar": ["extra", "x"], "/c.tar": ["x"], "/a.tar/x": ["f"], "/c.tar/x": ["f"]}
    with ratarmountcore.open([str(p) for p in sources], OpenOptions(recursive=True)) as src:
        assert {folder: sorted(src.listdir(folder)) for folder in expected} == expected
    mnt = mounter.mount(*sources, extra=["-r", "--fuse-api", api])
    for order in (list(expected), list(reversed(expected))):
        assert {folder: sorted(os.listdir(f"{mnt}{folder}")) for folder in order} == expected
    assert os.stat(mnt / "a.tar").st_ino != os.stat(mnt / "c.tar").st_ino
    assert not os.path.exists(mnt / "c.tar" / "extra")
    mounter.unmount(mnt)


def test_hard_links_whose_names_a_later_archive_replaced_count_only_what_is_left(
    mounter: Mounter, tmp_path: Path
) -> None:
    """A link group of three names in the first archive, one name replaced by the second, one
    by the third: the link counts are those of ``tar -x`` of the archives in turn (GNU tar
    unlinks a name before it extracts a member there), through the API (a lookup, a listing,
    the listing's rows, a reopen from the cached union table) and through a mount."""
    first = tmp_path / "first"
    first.mkdir()
    (first / "a").write_bytes(b"shared content")
    os.link(first / "a", first / "b")
    os.link(first / "a", first / "c")
    os.link(first / "a", first / "d")
    (first / "e").write_bytes(b"alone")
    for number, name in ((2, "b"), (3, "d")):
        (tmp_path / f"n{number}").mkdir()
        (tmp_path / f"n{number}" / name).write_bytes(b"replaced %d" % number)
    archives = [tmp_path / "a1.tar", tmp_path / "a2.tar", tmp_path / "a3.tar"]
    for archive, folder, names in zip(archives, (first, tmp_path / "n2", tmp_path / "n3"), ("abcde", "b", "d")):
        subprocess.run(["tar", "-C", str(folder), "-cf", str(archive), *names], check=True)
    extracted = tmp_path / "extracted"
    extracted.mkdir()
    for archive in archives:
        subprocess.run(["tar", "-C", str(extracted), "-xf", str(archive)], check=True)
    expected = {name: os.lstat(extracted / name).st_nlink for name in "abcde"}
    assert expected == {"a": 2, "b": 1, "c": 2, "d": 1, "e": 1}  # (what tar -x does, as checked)
    for _reopen in range(2):
        with ratarmountcore.open([str(p) for p in archives]) as src:
            assert {name: src.info("/" + name).nlink for name in "abcde"} == expected
            assert {name: info.nlink for name, info in src.list_entries("/")} == expected
            rows = {row[0].decode(): row[6] for row in src.list_stat_rows("/") or []}
            assert rows == expected
            assert src.read("/c") == b"shared content" and src.read("/d") == b"replaced 3"
    mnt = mounter.mount(*archives)
    assert {name: os.lstat(mnt / name).st_nlink for name in "abcde"} == expected
    assert {entry.name: entry.stat(follow_symlinks=False).st_nlink for entry in os.scandir(mnt)} == expected
    assert os.lstat(mnt / "a").st_ino == os.lstat(mnt / "c").st_ino
    mounter.unmount(mnt)

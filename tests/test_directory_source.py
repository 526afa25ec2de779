"""Folders as sources (sources/directory.py): alone, in unions, and with -r their archives as folders."""

from __future__ import annotations

import errno
import gzip
import io
import os
import random
import shutil
import stat
import struct
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List

import pytest
from conftest import Mounter, run_ratarmount, tar_bytes
from hypothesis import given, settings
from tarcompare import compare_trees, snapshot_dir, snapshot_source
from test_roundtrip import Tree, materialize, trees

import ratarmountcore
from ratarmountcore.options import OpenOptions
from ratarmountcore.sources.directory import DirectorySource


@pytest.fixture(autouse=True)
def private_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


CLASSES: Dict[str, Dict[str, bytes]] = {
    f"n{c:04d}": {f"n{c:04d}_{i}.JPEG": f"class {c} image {i}".encode() * (i + 1) for i in range(3)} for c in range(3)
}


def dataset(root: Path) -> Path:
    """train/ with class tars (one gzip-compressed), a plain file, a .gz that is not a tar, a
    file named .tar that is not one, and links that point out of the folder."""
    train = root / "train"
    train.mkdir(parents=True)
    for name, files in CLASSES.items():
        data = tar_bytes(files)
        if name == "n0002":
            (train / f"{name}.tar.gz").write_bytes(gzip.compress(data))
        else:
            (train / f"{name}.tar").write_bytes(data)
    (root / "labels.txt").write_text("n0000\nn0001\nn0002\n")
    (root / "table.csv.gz").write_bytes(gzip.compress(b"a,b\n1,2\n"))
    (root / "fake.tar").write_bytes(b"not a tar at all" * 100)
    os.symlink("/etc", root / "etc-link")
    os.symlink("../labels.txt", train / "labels-link")
    return root


def class_path(name: str) -> str:
    return f"/train/{name}.tar.gz" if name == "n0002" else f"/train/{name}.tar"


def test_folder_alone_shows_the_folder_as_it_is(tmp_path: Path) -> None:
    root = dataset(tmp_path / "data")
    with ratarmountcore.open(str(root)) as src:
        assert isinstance(src, DirectorySource) and not src.is_immutable
        assert src.listdir("/") == sorted(os.listdir(root))
        assert src.read("/labels.txt") == (root / "labels.txt").read_bytes()
        assert src.info("/train/n0000.tar").is_file  # without -r an archive is a file
        assert src.read("/train/n0000.tar") == (root / "train/n0000.tar").read_bytes()
        assert src.readlink("/etc-link") == "/etc"
        assert src.lookup("/etc-link/passwd") is None  # links are never followed
        assert src.lookup("/train/labels-link/x") is None
        assert src.lookup("/missing") is None and src.lookup("/labels.txt/x") is None
    compare_trees(snapshot_dir(root), snapshot_source(ratarmountcore.open(str(root))), label="folder")


def test_recursive_folder_shows_its_archives_as_folders(tmp_path: Path) -> None:
    root = dataset(tmp_path / "data")
    with ratarmountcore.open(str(root), OpenOptions(recursive=True)) as src:
        for name, files in CLASSES.items():
            assert src.is_dir(class_path(name))
            for member, data in files.items():
                assert src.read(f"{class_path(name)}/{member}") == data
            assert src.listdir(class_path(name)) == sorted(files)
        # Indexes written beside the archives are not shown; what is not a tar stays a file.
        assert src.listdir("/train") == ["labels-link", "n0000.tar", "n0001.tar", "n0002.tar.gz"]
        assert (root / "train/n0000.tar.index.sqlite").exists()
        assert src.read("/table.csv.gz") == (root / "table.csv.gz").read_bytes()
        assert src.read("/fake.tar") == (root / "fake.tar").read_bytes()
        assert src.lookup("/train/n0000.tar/missing.JPEG") is None
    # The second open finds the indexes: nothing is rebuilt.
    before = {p.name: p.stat().st_mtime_ns for p in (root / "train").glob("*.index.sqlite")}
    with ratarmountcore.open(str(root), OpenOptions(recursive=True)) as src:
        assert src.read("/train/n0001.tar/n0001_2.JPEG") == CLASSES["n0001"]["n0001_2.JPEG"]
    assert before == {p.name: p.stat().st_mtime_ns for p in (root / "train").glob("*.index.sqlite")}


def test_union_of_an_archive_and_a_folder_later_wins(tmp_path: Path) -> None:
    base = tmp_path / "base.tar"
    base.write_bytes(tar_bytes({"d/a.txt": b"old a", "d/b.txt": b"old b", "only.txt": b"base"}))
    fixes = tmp_path / "fixes"
    (fixes / "d").mkdir(parents=True)
    (fixes / "d/a.txt").write_bytes(b"fixed a")
    (fixes / "new.txt").write_bytes(b"new")
    with ratarmountcore.open([str(base), str(fixes)]) as src:
        assert not src.is_immutable
        assert src.read("/d/a.txt") == b"fixed a"
        assert src.read("/d/b.txt") == b"old b"
        assert src.listdir("/") == ["d", "new.txt", "only.txt"]
        assert src.listdir("/d") == ["a.txt", "b.txt"]
    with ratarmountcore.open([str(fixes), str(base)]) as src:
        assert src.read("/d/a.txt") == b"old a"


def test_versions_of_a_name_are_those_of_the_source_it_is_from(tmp_path: Path) -> None:
    """``PATH.versions`` lists the versions of the source that wins ``PATH``: none when a folder
    source wins it (the archive's versions were listed, and read, under a name they no longer had)."""
    base = tmp_path / "base.tar"
    with tarfile.open(base, "w") as tar:
        for data in (b"v1", b"v2"):  # x appended twice (tar -r)
            info = tarfile.TarInfo("d/x")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    fixes = tmp_path / "fixes"
    (fixes / "d").mkdir(parents=True)
    (fixes / "d/x").write_bytes(b"fixed")
    with ratarmountcore.open([str(base), str(fixes)]) as src:
        assert src.read("/d/x") == b"fixed"
        assert not src.exists("/d/x.versions") and not src.exists("/d/x.versions/1")
    with ratarmountcore.open([str(fixes), str(base)]) as src:  # the archive wins: its versions
        assert src.read("/d/x") == b"v2"
        assert src.listdir("/d/x.versions") == ["1", "2"]
        assert src.read("/d/x.versions/1") == b"v1"


@settings(settings.get_profile("roundtrip-api"))
@given(tree=trees())
def test_any_folder_reads_back_as_it_is(tree: Tree) -> None:
    with tempfile.TemporaryDirectory() as work:
        root = Path(work) / "root"
        materialize(tree, root)
        with DirectorySource(str(root)) as src:
            compare_trees(snapshot_dir(root), snapshot_source(src), label="folder source")


@pytest.mark.parametrize("api", ["low", "high"])
def test_mount_of_a_folder_with_archives(mounter: Mounter, tmp_path: Path, api: str) -> None:
    root = dataset(tmp_path / "data")
    mnt = mounter.mount(root, extra=["-r", "--fuse-api", api])
    assert sorted(os.listdir(mnt)) == ["etc-link", "fake.tar", "labels.txt", "table.csv.gz", "train"]
    assert sorted(os.listdir(mnt / "train")) == ["labels-link", "n0000.tar", "n0001.tar", "n0002.tar.gz"]
    listed = {entry.name: entry.inode() for entry in os.scandir(mnt)}
    assert listed["labels.txt"] == os.stat(mnt / "labels.txt").st_ino != 0
    for name, files in CLASSES.items():
        assert sorted(os.listdir(mnt / class_path(name).lstrip("/"))) == sorted(files)
        for member, data in files.items():
            assert (mnt / class_path(name).lstrip("/") / member).read_bytes() == data
    assert (mnt / "labels.txt").read_bytes() == (root / "labels.txt").read_bytes()
    assert os.readlink(mnt / "etc-link") == "/etc"
    with pytest.raises(OSError):
        (mnt / "labels.txt").write_text("x")
    # A folder may change while mounted: the mount shows the change a second later.
    (root / "labels.txt").write_text("n9999\nn9998\nn9997\n")  # same size, other bytes
    (root / "added.txt").write_text("added")
    time.sleep(1.2)
    assert (mnt / "labels.txt").read_text() == "n9999\nn9998\nn9997\n"
    assert (mnt / "added.txt").read_text() == "added"
    mounter.unmount(mnt)


def test_mount_point_inside_the_folder_is_refused(tmp_path: Path) -> None:
    root = dataset(tmp_path / "data")
    inside = root / "mnt"
    inside.mkdir()
    result = run_ratarmount(str(root), str(inside))
    assert result.returncode != 0 and "lies inside the folder" in result.stderr
    assert "Traceback" not in result.stderr and not os.path.ismount(inside)


@pytest.mark.skipif(os.environ.get("ROUNDTRIP_FUSE_EXAMPLES") == "0", reason="FUSE round trips turned off")
@settings(settings.get_profile("roundtrip-fuse"))
@given(tree=trees())
def test_any_folder_mounted_reads_back_as_it_is(tree: Tree) -> None:
    from conftest import fuse_available, lazy_unmount

    if not fuse_available():
        pytest.skip("needs /dev/fuse and fusermount")
    with tempfile.TemporaryDirectory() as work:
        root = Path(work) / "root"
        materialize(tree, root)
        mnt = Path(work) / "mnt"
        mnt.mkdir()
        result = run_ratarmount(str(root), str(mnt))
        assert result.returncode == 0, result.stderr
        try:
            compare_trees(snapshot_dir(root), snapshot_dir(mnt), check_root=False, label="mounted folder")
        finally:
            lazy_unmount(mnt)


def test_lazy_folder_opens_an_archive_only_when_it_is_used(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = dataset(tmp_path / "data")
    broken = root / "train" / "broken.tar"
    broken.write_bytes(tar_bytes({"a.bin": b"a" * 5000})[:1024])  # a header, then the end is missing
    with ratarmountcore.open(str(root), OpenOptions(recursive=True, lazy=True)) as src:
        listed = dict(src.list_entries("/train") or [])
        assert sorted(listed) == ["broken.tar", "labels-link", "n0000.tar", "n0001.tar", "n0002.tar.gz"]
        assert list((root / "train").glob("*.index.sqlite")) == []  # listed, none opened
        st = (root / "train" / "n0001.tar").stat()
        info = src.info("/train/n0001.tar")
        assert info.is_dir and info.mtime_ns == st.st_mtime_ns and (info.uid, info.gid) == (st.st_uid, st.st_gid)
        assert info.mode & 0o777 == (st.st_mode & 0o777) | ((st.st_mode & 0o444) >> 2)
        assert src.read("/train/n0001.tar/n0001_1.JPEG") == CLASSES["n0001"]["n0001_1.JPEG"]
        assert [p.name for p in (root / "train").glob("*.index.sqlite")] == ["n0001.tar.index.sqlite"]
        # An archive that fails to open: listed as an empty folder once (with a warning), then a file.
        assert src.listdir("/train/broken.tar") == []
        assert "broken.tar: shown as a file" in caplog.text
        assert src.info("/train/broken.tar").is_file
        assert src.read("/train/broken.tar") == broken.read_bytes()


def test_folder_shows_an_archive_that_fails_to_open_as_a_file_from_the_start(tmp_path: Path) -> None:
    root = dataset(tmp_path / "data")
    (root / "broken.tar").write_bytes(tar_bytes({"a.bin": b"a" * 5000})[:1024])
    with ratarmountcore.open(str(root), OpenOptions(recursive=True)) as src:
        assert src.info("/broken.tar").is_file
        assert src.read("/broken.tar") == (root / "broken.tar").read_bytes()
        assert src.is_dir("/train/n0000.tar")


def test_archive_members_in_a_folder_are_immutable_entries(tmp_path: Path) -> None:
    """The front-ends cache them for a day (an archive is watched); the folder's own entries a second."""
    root = dataset(tmp_path / "data")
    base = tmp_path / "base.tar"
    base.write_bytes(tar_bytes({"b.txt": b"b"}))
    with ratarmountcore.open(str(root), OpenOptions(recursive=True)) as src:
        assert src.is_immutable_entry(src.info("/train/n0000.tar/n0000_0.JPEG"))
        assert not src.is_immutable_entry(src.info("/train/n0000.tar"))
        assert not src.is_immutable_entry(src.info("/labels.txt"))
    with ratarmountcore.open([str(base), str(root)], OpenOptions(recursive=True)) as union:
        assert not union.is_immutable
        assert union.is_immutable_entry(union.info("/b.txt"))
        assert union.is_immutable_entry(union.info("/train/n0001.tar/n0001_1.JPEG"))
        assert not union.is_immutable_entry(union.info("/labels.txt"))


def test_lazy_archives_open_one_at_a_time_each_but_not_behind_each_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An archive whose index is being built keeps no other archive of the folder waiting."""
    root = dataset(tmp_path / "data")
    src = DirectorySource(str(root), OpenOptions(recursive=True, lazy=True))
    release = threading.Event()
    original = DirectorySource._open_archive
    opened: List[str] = []

    def slow_for_n0000(self: DirectorySource, relative: str) -> object:
        opened.append(relative)
        if relative == "train/n0000.tar":
            assert release.wait(10)
        return original(self, relative)

    monkeypatch.setattr(DirectorySource, "_open_archive", slow_for_n0000)
    with src:
        results: Dict[str, bytes] = {}
        slow = [
            threading.Thread(target=lambda: results.update(a=src.read("/train/n0000.tar/n0000_0.JPEG")))
            for _ in range(2)
        ]
        for thread in slow:
            thread.start()
        time.sleep(0.2)
        assert src.read("/train/n0001.tar/n0001_0.JPEG") == CLASSES["n0001"]["n0001_0.JPEG"]  # not held up
        release.set()
        for thread in slow:
            thread.join(10)
        assert results["a"] == CLASSES["n0000"]["n0000_0.JPEG"]
        assert opened.count("train/n0000.tar") == 1  # the second reader waited for the first opening


def test_member_found_before_its_archive_was_rewritten_is_never_read_from_the_new_file(tmp_path: Path) -> None:
    """A member's info names the source it was found in: read through a source opened on the
    rewritten file, its offsets would point into the new content."""
    root = tmp_path / "data"
    root.mkdir()
    archive = root / "x.tar"
    archive.write_bytes(tar_bytes({"a.bin": b"A" * 5000}))
    with ratarmountcore.open(str(root), OpenOptions(recursive=True)) as src:
        old = src.info("/x.tar/a.bin")
        archive.write_bytes(tar_bytes({"z.bin": b"Z" * 10000, "a.bin": b"A" * 5000}))  # in place
        os.utime(archive, ns=(1, 1))
        assert src.read("/x.tar/a.bin") == b"A" * 5000  # found afresh: the new file's member
        try:
            with src.open_info(old) as f:
                got = f.read()
        except OSError:
            return  # refused: fine
        assert got == b"A" * 5000, "the old member's offsets were read in the rewritten file"


def test_archive_members_have_unique_inode_numbers_found_again_by_number(tmp_path: Path) -> None:
    """Members carry inode numbers of their own (archive slot above the member's number), so
    the low-level front-end names them without a table; the folder's own entries have none; a
    rewritten archive's old numbers find nothing (its members are looked up anew)."""
    root = dataset(tmp_path / "data")
    with ratarmountcore.open(str(root), OpenOptions(recursive=True)) as src:
        numbers: Dict[int, str] = {}
        for name, files in CLASSES.items():
            folder = class_path(name)
            rows = {row[0].decode(): row for row in src.list_stat_rows(folder) or []}
            assert set(rows) == set(files)
            for member in files:
                path = f"{folder}/{member}"
                info = src.info(path)
                assert info.ino > 1 and info.ino not in numbers and rows[member][7] == info.ino
                numbers[info.ino] = path
                found = src.by_ino(info.ino)
                assert found is not None and found[0] == path and found[1].ino == info.ino
                assert found[1].size == len(files[member]) and src.open_info(found[1]).read() == files[member]
            part = src.list_stat_rows_after(folder, sorted(files)[0].encode(), 1) or []
            assert [row[0].decode() for row in part] == sorted(files)[1:2] and part[0][7] == rows[sorted(files)[1]][7]
            named = src.list_name_rows_after(folder, None, 100) or []
            assert named == [(row[0], row[1], row[7]) for row in sorted(rows.values())]
        assert src.info("/labels.txt").ino == 0 and src.info("/train/n0000.tar").ino == 0
        assert all(row[7] == 0 for row in src.list_stat_rows("/train") or [None])
        assert all(row[2] == 0 for row in src.list_name_rows_after("/train", None, 100) or [None])
        old = src.info("/train/n0001.tar/n0001_1.JPEG").ino
        (root / "train" / "n0001.tar").write_bytes(tar_bytes({"n0001_1.JPEG": b"new"}))
        os.utime(root / "train" / "n0001.tar", ns=(1, 1))
        assert src.read("/train/n0001.tar/n0001_1.JPEG") == b"new"
        assert src.by_ino(old) is None and src.info("/train/n0001.tar/n0001_1.JPEG").ino not in numbers
    base = tmp_path / "base.tar"
    base.write_bytes(tar_bytes({"b.txt": b"b"}))
    with ratarmountcore.open([str(base), str(root)], OpenOptions(recursive=True)) as union:
        # numbers too large for a union to shift are left out (0), never folded onto others
        assert union.info("/train/n0000.tar/n0000_0.JPEG").ino == 0 and union.info("/b.txt").ino > 1


def test_a_folder_of_archives_is_listed_without_table_nodes(tmp_path: Path) -> None:
    from test_lowlevel import list_all, parse_entry

    from ratarmount.inodes import ROOT_ID
    from ratarmount.lowlevel_ops import STABLE_LIMIT, LowLevelOperations

    root = dataset(tmp_path / "data")
    with ratarmountcore.open(str(root), OpenOptions(recursive=True)) as src:
        ops = LowLevelOperations(src)
        ops.init(no_open_supported=False)
        train = parse_entry(ops.lookup(ROOT_ID, b"train"))[0]
        folder = parse_entry(ops.lookup(train, b"n0000.tar"))[0]
        assert train >= STABLE_LIMIT and folder >= STABLE_LIMIT  # the folder's own: table ids
        calls: List[str] = []
        for method in ("list_entries", "list_stat_rows", "list_stat_rows_after"):
            real = getattr(src, method)
            setattr(src, method, lambda *a, real=real, method=method: calls.append(method) or real(*a))
        listed = [r[0] for r in list_all(ops, train, plus=True, size=4096)]
        assert b"n0000.tar" in listed and calls == ["list_entries"]  # the folder's own: listed once
        calls.clear()
        before = len(ops.nodes)
        records = list_all(ops, folder, plus=True, size=4096)
        members = [r for r in records if r[0] not in (b".", b"..")]
        assert sorted(r[0].decode() for r in members) == sorted(CLASSES["n0000"])
        assert all(1 < r[2] < STABLE_LIMIT and r[2] == r[3]["ino"] for r in members)
        assert len(ops.nodes) == before  # no table ids handed out for the members
        assert calls == ["list_stat_rows_after"]  # an archive's folder: from its rows
        node = members[0][2]
        handle = struct.unpack("=QII", ops.open(node, os.O_RDONLY))[0]
        buffer = bytearray(4096)
        size = ops.read(node, handle, 0, memoryview(buffer))
        assert bytes(buffer[:size]) == CLASSES["n0000"][members[0][0].decode()]
        ops.release(handle)


def test_strip_tar_extension_shows_class_tars_by_class(tmp_path: Path) -> None:
    """``NAME.tar`` shown as ``NAME`` -- not under both names (to the kernel those would be two
    folders) -- unless ``NAME`` exists; compressed tars and files that are not archives keep
    their names."""
    root = dataset(tmp_path / "data")
    train = root / "train"
    (train / "taken.tar").write_bytes(tar_bytes({"t.txt": b"t"}))
    (train / "taken").mkdir()
    options = OpenOptions(recursive=True, strip_tar_extension=True)
    with ratarmountcore.open(str(root), options) as src:
        assert src.listdir("/train") == ["labels-link", "n0000", "n0001", "n0002.tar.gz", "taken", "taken.tar"]
        assert "fake.tar" in src.listdir("/") and src.info("/fake.tar").is_file
        for name, files in CLASSES.items():
            shown = "/train/n0002.tar.gz" if name == "n0002" else f"/train/{name}"
            assert src.listdir(shown) == sorted(files)
            for member, data in files.items():
                assert src.read(f"{shown}/{member}") == data
                found = src.by_ino(src.info(f"{shown}/{member}").ino)
                assert found is not None and found[0] == f"{shown}/{member}"
        assert not src.exists("/train/n0000.tar") and not src.exists("/train/n0000.tar/n0000_0.JPEG")
        assert src.read("/train/taken.tar/t.txt") == b"t" and src.listdir("/train/taken") == []
        assert not src.exists("/train/nothing") and not src.exists("/train/nothing/x")
        assert {row[0] for row in src.list_stat_rows("/train") or []} >= {b"n0000", b"taken.tar"}
    with ratarmountcore.open(str(root), OpenOptions(recursive=True, strip_tar_extension=True, lazy=True)) as src:
        assert src.read("/train/n0001/n0001_2.JPEG") == CLASSES["n0001"]["n0001_2.JPEG"]


def test_strip_tar_extension_of_a_mounted_folder(mounter: Mounter, tmp_path: Path) -> None:
    root = dataset(tmp_path / "data")
    mnt = mounter.mount(root / "train", extra=["-r", "--strip-tar-extension"])
    assert sorted(os.listdir(mnt)) == ["labels-link", "n0000", "n0001", "n0002.tar.gz"]
    found = {}
    for folder, _dirs, files in os.walk(mnt):
        for name in files:
            if not os.path.islink(os.path.join(folder, name)):  # (labels-link leads out of the mount)
                with open(os.path.join(folder, name), "rb") as f:
                    found[os.path.relpath(os.path.join(folder, name), mnt)] = f.read()
    assert found == {
        f"{name if name != 'n0002' else 'n0002.tar.gz'}/{member}": data
        for name, files in CLASSES.items()
        for member, data in files.items()
    }
    assert not os.path.exists(mnt / "n0000.tar")


def test_many_stale_indexes_of_one_folder_are_reported_once_in_short(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Indexes built without -r and a folder mounted with it: three rebuilds are named, then one
    line says that the rest are rebuilt as well; every archive is rebuilt and read."""
    root = tmp_path / "train"
    root.mkdir()
    for c in range(8):
        (root / f"c{c}.tar").write_bytes(tar_bytes({f"c{c}_0.JPEG": f"class {c}".encode()}))
        ratarmountcore.open(str(root / f"c{c}.tar")).close()  # indexed without -r
    caplog.set_level("WARNING")
    with ratarmountcore.open(str(root), OpenOptions(recursive=True)) as src:
        assert [src.read(f"/c{c}.tar/c{c}_0.JPEG") for c in range(8)] == [f"class {c}".encode() for c in range(8)]
    named = [r for r in caplog.records if "was built with other options (without -r, now with -r)" in r.getMessage()]
    summary = [r for r in caplog.records if "More indexes of archives in" in r.getMessage()]
    assert len(named) == 3 and len(summary) == 1 and str(root) in summary[0].getMessage()


@pytest.mark.parametrize("union", [False, True])
def test_a_reader_of_a_file_renamed_over_keeps_reading_its_own_bytes(
    mounter: Mounter, tmp_path: Path, union: bool
) -> None:
    """A file of a mounted folder replaced by another renamed over its name (how tools update
    files) is a new file to the kernel: a process that opened the old one reads the old bytes
    and size to the end, never the new file's through a shared inode and page cache, while new
    opens get the new file (a stale handle makes the kernel look the name up again)."""
    root = tmp_path / "data"
    root.mkdir()
    old = random.Random(1).randbytes(300_000)
    new = b"new file, shorter" * 100
    (root / "f.bin").write_bytes(old)
    archive = tmp_path / "below.tar"
    archive.write_bytes(tar_bytes({"f.bin": b"hidden by the folder", "other": b"x"}))
    mnt = mounter.mount(archive, root) if union else mounter.mount(root)
    with open(mnt / "f.bin", "rb") as reader:
        assert reader.read(4096) == old[:4096]
        replacement = root / ".f.bin.tmp"
        replacement.write_bytes(new)
        os.rename(replacement, root / "f.bin")
        time.sleep(1.2)  # (the kernel's entry for the name times out after 1 s)
        with open(mnt / "f.bin", "rb") as second:
            assert second.read() == new
        assert os.fstat(reader.fileno()).st_size == len(old)
        assert reader.read() == old[4096:]
        # Opened again through the name the kernel had cached: the new file.
        with open(mnt / "f.bin", "rb") as third:
            assert third.read() == new
    mounter.unmount(mnt)


def test_hard_links_in_a_mounted_folder_share_an_inode_number(mounter: Mounter, tmp_path: Path) -> None:
    root = tmp_path / "data"
    (root / "sub").mkdir(parents=True)
    (root / "a").write_bytes(b"linked")
    os.link(root / "a", root / "sub" / "b")
    (root / "c").write_bytes(b"other")
    mnt = mounter.mount(root)
    a, b, c = (os.stat(mnt / name) for name in ("a", "sub/b", "c"))
    assert a.st_ino == b.st_ino != c.st_ino
    assert a.st_nlink == b.st_nlink == 2
    listed = {entry.name: entry.inode() for entry in os.scandir(mnt)}
    assert listed["a"] == a.st_ino
    assert (mnt / "sub" / "b").read_bytes() == b"linked"
    mounter.unmount(mnt)


@pytest.mark.parametrize("how", ["renamed over", "rewritten in place"])
def test_members_of_a_replaced_archive_are_the_new_ones_after_a_second(
    mounter: Mounter, tmp_path: Path, how: str
) -> None:
    """With -r, an archive of the folder replaced while mounted: its members, cached by the kernel
    for a day as immutable entries, give way to the new archive's once the kernel looks the
    archive's folder up again (after 1 s, as any entry of a folder), instead of failing (EIO)
    or showing the old archive until the next mount."""
    root = tmp_path / "data"
    root.mkdir()
    big = random.Random(3).randbytes(2_000_000)
    (root / "c.tar").write_bytes(tar_bytes({"x.txt": b"old x", "gone.txt": b"old only", "big.bin": big}))
    mnt = mounter.mount(root, extra=["-r"])
    assert (mnt / "c.tar" / "x.txt").read_bytes() == b"old x"
    assert (mnt / "c.tar" / "gone.txt").exists()
    reader = open(mnt / "c.tar" / "big.bin", "rb")  # a process reading on across the change
    assert reader.read(65536) == big[:65536]
    new = tar_bytes({"x.txt": b"the new x, longer", "added.txt": b"new"})
    if how == "renamed over":
        (root / ".c.tar.tmp").write_bytes(new)
        os.rename(root / ".c.tar.tmp", root / "c.tar")
    else:
        (root / "c.tar").write_bytes(new)
    time.sleep(1.2)
    assert (mnt / "c.tar" / "x.txt").read_bytes() == b"the new x, longer"  # (the folder's new node)
    if how == "renamed over":  # the old file is still there for it: its bytes, to the end
        assert reader.read() == big[65536:]
    else:  # gone: an error, never bytes of the new file
        with pytest.raises(OSError):
            reader.read()
    reader.close()
    assert (mnt / "c.tar" / "x.txt").read_bytes() == b"the new x, longer"
    assert os.stat(mnt / "c.tar" / "x.txt").st_size == len(b"the new x, longer")
    assert sorted(os.listdir(mnt / "c.tar")) == ["added.txt", "x.txt"]
    assert not (mnt / "c.tar" / "gone.txt").exists()
    mounter.unmount(mnt)


def expected_union(layers: List[Dict[str, bytes]]) -> Dict[str, bytes]:
    """What a union of ``layers`` (path -> content, later ones win) shows."""
    shown: Dict[str, bytes] = {}
    for layer in layers:
        shown.update(layer)
    return shown


def union_files(list_dir, read, root: str = "") -> Dict[str, bytes]:  # type: ignore[no-untyped-def]
    """Every file of a tree by walking its listings: path -> content."""
    found: Dict[str, bytes] = {}
    stack = [root]
    while stack:
        folder = stack.pop()
        for name, is_dir in list_dir(folder):
            path = f"{folder}/{name}"
            if is_dir:
                stack.append(path)
            else:
                found[path[len(root) :]] = read(path)
    return found


@pytest.mark.parametrize("order", ["folder last", "folder first", "folder between"])
def test_union_with_a_folder_lists_the_folder_as_it_is_now(mounter: Mounter, tmp_path: Path, order: str) -> None:
    """Files added to, replaced in and removed from a folder of a union after it was opened or
    mounted: listings show the folder as it is now, as lookups do, with the sources' order kept
    (a name in several sources is the last one's; a file removed from the folder shows an
    earlier source's again)."""
    below = {"/d/a.txt": b"tar a", "/d/b.txt": b"tar b", "/t.txt": b"tar only"}
    above = {"/d/b.txt": b"second tar b", "/d/s.txt": b"second tar s"}
    (tmp_path / "below.tar").write_bytes(tar_bytes({k[1:]: v for k, v in below.items()}))
    (tmp_path / "above.tar").write_bytes(tar_bytes({k[1:]: v for k, v in above.items()}))
    folder = tmp_path / "folder"
    (folder / "d").mkdir(parents=True)
    before = {"/d/a.txt": b"folder a", "/gone.txt": b"removed later", "/d/s.txt": b"folder s"}
    for path, data in before.items():
        (folder / path[1:]).write_bytes(data)
    archives = [str(tmp_path / "below.tar"), str(tmp_path / "above.tar")]
    paths, layers_of = {
        "folder last": (archives + [str(folder)], lambda f: [below, above, f]),
        "folder first": ([str(folder)] + archives, lambda f: [f, below, above]),
        "folder between": ([archives[0], str(folder), archives[1]], lambda f: [below, f, above]),
    }[order]
    mnt = mounter.mount(*[Path(p) for p in paths])
    with ratarmountcore.open(paths) as src:
        api = lambda: union_files(  # noqa: E731
            lambda d: [(n, src.info(f"{d}/{n}").is_dir) for n in src.listdir(d or "/")], src.read
        )
        mounted = lambda: union_files(  # noqa: E731
            lambda d: [(e.name, e.is_dir()) for e in os.scandir(d)], lambda p: Path(p).read_bytes(), str(mnt)
        )
        assert api() == mounted() == expected_union(layers_of(before))
        # The folder changes: a new file, a new folder, a file that shadows (or is shadowed by)
        # the archives', and a file removed.
        (folder / "new.txt").write_bytes(b"new")
        (folder / "e").mkdir()
        (folder / "e" / "deep.txt").write_bytes(b"deep")
        (folder / "d" / "b.txt").write_bytes(b"folder b")
        (folder / "gone.txt").unlink()
        (folder / "d" / "a.txt").unlink()
        now = {"/d/s.txt": b"folder s", "/new.txt": b"new", "/e/deep.txt": b"deep", "/d/b.txt": b"folder b"}
        time.sleep(1.2)  # (the kernel keeps a folder source's listings for 1 s)
        assert api() == mounted() == expected_union(layers_of(now))
    mounter.unmount(mnt)


def test_a_folder_sources_file_over_an_earlier_folder_is_what_tar_x_leaves(mounter: Mounter, tmp_path: Path) -> None:
    """A file in a folder source where an earlier archive has a folder: ``tar -x`` cannot
    remove a folder that holds something ("File exists"), so the file is refused and the
    folder keeps its entries, a later archive's folder of that name merging with it; where the
    folder is empty, the file replaces it and hides nothing (a later archive's folder then
    holds only its own entries). Files and folders changed in the folder source count at once."""
    for name, files in (
        ("a.tar", {"d/": b"", "d/x.txt": b"a x", "d/e/": b"", "d/e/deep.txt": b"a deep", "k.txt": b"a k"}),
        ("b.tar", {"d/": b"", "d/y.txt": b"b y", "d/e/": b"", "d/e/z.txt": b"b z"}),  # (folders of its own)
    ):
        with tarfile.open(tmp_path / name, "w", format=tarfile.GNU_FORMAT) as tar:
            for member, data in files.items():
                info = tarfile.TarInfo(member.rstrip("/"))
                info.type, info.size = (tarfile.DIRTYPE, 0) if member.endswith("/") else (tarfile.REGTYPE, len(data))
                tar.addfile(info, io.BytesIO(data))
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "d").write_bytes(b"a file in the folder")
    paths = [tmp_path / "a.tar", folder, tmp_path / "b.tar"]
    mnt = mounter.mount(*paths)
    with ratarmountcore.open([str(p) for p in paths]) as src:
        api = lambda: union_files(  # noqa: E731
            lambda d: [(n, src.info(f"{d}/{n}").is_dir) for n in src.listdir(d or "/")], src.read
        )
        mounted = lambda: union_files(  # noqa: E731
            lambda d: [(e.name, e.is_dir()) for e in os.scandir(d)], lambda p: Path(p).read_bytes(), str(mnt)
        )
        shown = {"/d/x.txt": b"a x", "/d/e/deep.txt": b"a deep", "/d/y.txt": b"b y", "/d/e/z.txt": b"b z"}
        shown["/k.txt"] = b"a k"
        assert api() == mounted() == shown  # (the file d refused)
        assert src.listdir("/d/e") == ["deep.txt", "z.txt"] and src.listdir("/d") == ["e", "x.txt", "y.txt"]
        (folder / "d").unlink()
        time.sleep(1.2)  # (the kernel keeps a folder source's names for 1 s)
        assert api() == mounted() == shown
        (folder / "d").mkdir()
        (folder / "d" / "e").write_bytes(b"now e is a file")  # refused too: d/e holds deep.txt
        time.sleep(1.2)
        assert api() == mounted() == shown
        (folder / "d" / "x.txt").mkdir()  # a folder replaces a file
        (folder / "d" / "e").unlink()
        time.sleep(1.2)
        del shown["/d/x.txt"]
        assert api() == mounted() == shown and src.listdir("/d/x.txt") == []
    mounter.unmount(mnt)


def test_a_folder_only_implied_by_a_later_archive_replaces_nothing_of_a_folder_source(tmp_path: Path) -> None:
    """Folders only implied by member paths never replace anything, also what a folder source
    before the archive has: its real folder keeps its own attributes (the union showed the
    implied folder's), and its symbolic link of that name stays a link with nothing below it
    (it was shown as a folder holding the archive's members)."""
    (tmp_path / "b.tar").write_bytes(tar_bytes({"sub/f": b"f", "other/g": b"g"}))
    folder = tmp_path / "folder"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "a").write_bytes(b"a")
    os.chmod(folder / "sub", 0o700)
    os.utime(folder / "sub", ns=(10**18, 10**18))
    os.symlink("sub", folder / "other")
    with ratarmountcore.open([str(folder), str(tmp_path / "b.tar")]) as src:
        st = src.stat("/sub")
        assert (stat.S_IMODE(st.st_mode), st.st_mtime_ns) == (0o700, 10**18)
        assert src.listdir("/sub") == ["a", "f"] and src.read("/sub/f") == b"f"
        assert src.info("/other").is_symlink and not src.exists("/other/g")
        listed = {name: src.info(f"/{name}") for name in src.listdir("/")}
        assert listed["other"].is_symlink and stat.S_IMODE(listed["sub"].mode) == 0o700


@pytest.mark.parametrize("api", ["low", "high"])
def test_folder_sources_around_an_archive_see_what_it_replaces(mounter: Mounter, tmp_path: Path, api: str) -> None:
    """An archive's file over a folder source's folder that holds something is refused, as
    ``tar -x`` refuses it ("File exists"), also where a still later folder source has the
    folder again; an archive that only implies a folder where a folder source before it has one
    adds its members to it; a folder source's folder replaces an archive's file. All as with
    archives in the folder sources' places (checked against tar -x of tars of the folders)."""
    for name in ("x", "y"):
        (tmp_path / "f0" / name).mkdir(parents=True)
        (tmp_path / "f0" / name / "a").write_bytes(b"a")
    (tmp_path / "t.tar").write_bytes(tar_bytes({"x": b"file x", "c": b"file c", "y": b"file y"}))
    (tmp_path / "f2" / "x").mkdir(parents=True)
    (tmp_path / "f2" / "x" / "b").write_bytes(b"b")
    (tmp_path / "f2" / "c").mkdir()
    (tmp_path / "f2" / "c" / "x").write_bytes(b"cx")
    with tarfile.open(tmp_path / "b.tar", "w") as tar:  # c/b (c implied), and the folder y again
        info = tarfile.TarInfo("c/b")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"cb"))
        info = tarfile.TarInfo("y")
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    sources = [tmp_path / "f0", tmp_path / "t.tar", tmp_path / "f2", tmp_path / "b.tar"]
    expected = {"/x": ["a", "b"], "/c": ["b", "x"], "/y": ["a"]}
    with ratarmountcore.open([str(path) for path in sources]) as src:
        assert {folder: src.listdir(folder) for folder in expected} == expected
        assert src.read("/x/a") == src.read("/y/a") == b"a" and src.read("/c/b") == b"cb"
    mnt = mounter.mount(*sources, extra=["--fuse-api", api])
    assert {folder: sorted(os.listdir(f"{mnt}{folder}")) for folder in expected} == expected
    assert (mnt / "x" / "a").read_bytes() == b"a" and (mnt / "y" / "a").read_bytes() == b"a"
    assert (mnt / "c" / "b").read_bytes() == b"cb"


def test_a_removed_name_never_opens_the_file_that_got_its_inode_number(mounter: Mounter, tmp_path: Path) -> None:
    """ext4 gives a freed inode number to the next new file at once: a name the kernel still
    caches for a deleted file must not lead to the new file that got its number (the node is
    keyed by device, inode and change time)."""
    root = tmp_path / "data"
    root.mkdir()
    (root / "a").write_bytes(b"the deleted file")
    mnt = mounter.mount(root)
    assert os.stat(mnt / "a").st_size == len(b"the deleted file")
    old_ino = os.stat(root / "a").st_ino
    (root / "a").unlink()
    (root / "b").write_bytes(b"another file, maybe on a's inode number")
    assert (mnt / "b").read_bytes() == b"another file, maybe on a's inode number"
    with pytest.raises(FileNotFoundError):
        (mnt / "a").read_bytes()  # (within the second the kernel keeps the name)
    print("inode number reused:", os.stat(root / "b").st_ino == old_ino)
    mounter.unmount(mnt)


def test_a_union_lists_a_name_from_an_earlier_source_when_the_folder_just_lost_it(tmp_path: Path) -> None:
    """A listing picks each name's winner from the folder's rows, then asks the winner for the
    entry: a file removed from the folder in between is the archive's again, not missing."""
    (tmp_path / "a.tar").write_bytes(tar_bytes({"x": b"archive x", "y": b"archive y"}))
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "x").write_bytes(b"folder x")
    with ratarmountcore.open([str(tmp_path / "a.tar"), str(folder)]) as src:
        names = [(b"x", 1), (b"y", 0)]  # as the rows said, before the folder lost x
        (folder / "x").unlink()
        entries = src._entries_of("/", names)  # type: ignore[attr-defined]
        assert sorted(entries) == ["x", "y"]
        with src.open_info(entries["x"]) as f:
            assert f.read() == b"archive x"


def test_a_folder_file_keeps_its_inode_number_when_changed_in_place(mounter: Mounter, tmp_path: Path) -> None:
    """chmod, touch and appending change a file's change time, and so its node (inodes.py), but
    not the inode number it shows: tail -F, find -samefile and rsync -H go by the number."""
    root = tmp_path / "data"
    root.mkdir()
    log = root / "log.txt"
    log.write_bytes(b"first line\n")
    mnt = mounter.mount(root)
    numbers = [os.stat(mnt / "log.txt").st_ino]
    for change in (
        lambda: os.chmod(log, 0o600),
        lambda: os.utime(log, ns=(10**18, 10**18)),
        lambda: log.write_bytes(log.read_bytes() + b"second line\n"),
    ):
        change()
        time.sleep(1.1)  # (the kernel keeps attributes for a second)
        numbers.append(os.stat(mnt / "log.txt").st_ino)
    assert len(set(numbers)) == 1, numbers
    assert {entry.name: entry.inode() for entry in os.scandir(mnt)}["log.txt"] == numbers[0]  # (d_ino)
    assert (mnt / "log.txt").read_bytes() == b"first line\nsecond line\n"
    mounter.unmount(mnt)


@pytest.mark.parametrize("before, after", [("folder", "link"), ("link", "folder"), ("folder", "file")])
def test_a_name_that_changes_type_is_never_an_io_error(
    mounter: Mounter, tmp_path: Path, before: str, after: str
) -> None:
    """The kernel refuses a node whose type changed (EIO): a name that was a folder and is a link
    now (or the other way round) is another node."""
    root = tmp_path / "data"
    (root / "target").mkdir(parents=True)

    def make(kind: str) -> None:
        path = root / "x"
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.exists():
            shutil.rmtree(path)
        if kind == "folder":
            path.mkdir()
            (path / "inside").write_bytes(b"in")
        elif kind == "link":
            path.symlink_to("target")
        else:
            path.write_bytes(b"a file")

    make(before)
    mnt = mounter.mount(root)
    os.lstat(mnt / "x")
    held = None
    if before == "folder":
        assert os.listdir(mnt / "x") == ["inside"]
        held = os.open(mnt / "x", os.O_RDONLY | os.O_DIRECTORY)  # (asks about the old node later)
    make(after)
    time.sleep(1.2)
    if held is not None:
        try:
            assert stat.S_ISDIR(os.fstat(held).st_mode)
        except OSError as exc:
            assert exc.errno == errno.ESTALE, exc  # stale, never EIO
        finally:
            os.close(held)
    st = os.lstat(mnt / "x")
    expected = {"folder": stat.S_ISDIR, "link": stat.S_ISLNK, "file": stat.S_ISREG}[after]
    assert expected(st.st_mode)
    if after == "folder":
        assert os.listdir(mnt / "x") == ["inside"]
    elif after == "link":
        assert os.readlink(mnt / "x") == "target"
    else:
        assert (mnt / "x").read_bytes() == b"a file"
    mounter.unmount(mnt)


def test_an_archive_rewritten_in_place_with_its_mtime_put_back_shows_its_new_members(
    mounter: Mounter, tmp_path: Path
) -> None:
    """rsync --inplace -t rewrites an archive in place and puts its size and mtime back: only
    the change time tells (a -r folder's archive and its watch look at it too)."""
    root = tmp_path / "data"
    root.mkdir()
    archive = root / "x.tar"
    archive.write_bytes(tar_bytes({"a": b"a" * 10000, "b": b"b" * 10000}))
    os.utime(archive, ns=(10**18, 10**18))
    mnt = mounter.mount(root, extra=["-r"])
    assert (mnt / "x.tar" / "a").read_bytes() == b"a" * 10000
    swapped = tar_bytes({"b": b"B" * 10000, "a": b"A" * 10000})  # same size, other order
    assert len(swapped) == archive.stat().st_size
    with open(archive, "r+b") as f:
        f.write(swapped)
    os.utime(archive, ns=(10**18, 10**18))
    time.sleep(1.2)
    assert (mnt / "x.tar" / "a").read_bytes() == b"A" * 10000
    assert (mnt / "x.tar" / "b").read_bytes() == b"B" * 10000
    mounter.unmount(mnt)


def test_archives_deleted_from_a_folder_do_not_keep_their_descriptors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With -r, an archive that was opened and then deleted (its name never looked up again)
    held its descriptor, its index connection and its disk space for the rest of the mount:
    swept out, beyond the few kept for processes still reading them."""
    from ratarmountcore.sources import directory

    monkeypatch.setattr(directory, "SWEEP_INTERVAL", 0.0)
    root = tmp_path / "data"
    root.mkdir()

    def descriptors() -> int:
        return len(os.listdir("/proc/self/fd"))

    with ratarmountcore.open(str(root), OpenOptions(recursive=True)) as src:
        (root / "keep.tar").write_bytes(tar_bytes({"k": b"kept"}))
        assert src.read("/keep.tar/k") == b"kept"
        start = descriptors()
        for i in range(3 * directory.RETIRED_MAX):
            archive = root / f"y{i}.tar"
            archive.write_bytes(tar_bytes({"m": f"member {i}".encode()}))
            assert src.read(f"/y{i}.tar/m") == f"member {i}".encode()
            archive.unlink()
            for suffix in (".index.sqlite",):
                (root / f"y{i}.tar{suffix}").unlink(missing_ok=True)
        assert src.read("/keep.tar/k") == b"kept"
        # (Each open archive holds its file and its index: the retired ones and the last one.)
        assert descriptors() - start <= 2 * (directory.RETIRED_MAX + 2), descriptors() - start


def test_a_reader_of_a_growing_folder_file_reads_what_was_appended(mounter: Mounter, tmp_path: Path) -> None:
    """A log in a mounted folder, read by a process that keeps it open (tail -f): what is
    appended after the open is read too, once the kernel knows the new size."""
    root = tmp_path / "data"
    root.mkdir()
    log = root / "log.txt"
    log.write_bytes(b"line 1\n")
    mnt = mounter.mount(root)
    with open(mnt / "log.txt", "rb") as reader:
        assert reader.read() == b"line 1\n"
        with open(log, "ab") as writer:
            writer.write(b"line 2\n")
        time.sleep(1.2)  # (the kernel keeps the size it knows for a second)
        assert reader.read() == b"line 2\n"
    with ratarmountcore.open(str(root)) as src, src.open("/log.txt") as f:
        assert f.read(3) == b"lin"
        with open(log, "ab") as writer:
            writer.write(b"line 3\n")
        assert f.read() == b"e 1\nline 2\nline 3\n"
    mounter.unmount(mnt)

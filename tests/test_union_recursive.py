"""Union mounts (later sources win, folders merge, one indexed lookup) and archives in archives."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Dict, List, Optional

import pytest
from conftest import Mounter, read_tree, run_ratarmount, tar_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ratarmountcore
from ratarmountcore.options import OpenOptions
from ratarmountcore.sources.union import UnionSource


@pytest.fixture(autouse=True)
def private_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def test_union_later_wins_and_folders_merge(tmp_path: Path) -> None:
    a = tmp_path / "a.tar"
    b = tmp_path / "b.tar"
    a.write_bytes(tar_bytes({"d/x": b"from a", "only_a": b"A", "d/sub/deep": b"deep"}))
    b.write_bytes(tar_bytes({"d/x": b"from b", "d/y": b"B"}))
    with ratarmountcore.open([str(a), str(b)]) as src:
        assert src.read("/d/x") == b"from b"
        assert src.read("/only_a") == b"A"
        assert src.listdir("/d") == ["sub", "x", "y"]
        assert src.read("/d/sub/deep") == b"deep"
        assert src.listdir("/") == ["d", "only_a"]
        inodes = {src.stat(p).st_ino for p in ("/d/x", "/d/y", "/only_a", "/d/sub/deep")}
        assert len(inodes) == 4
    with ratarmountcore.open([str(b), str(a)]) as src:
        assert src.read("/d/x") == b"from a"


def test_union_lookup_asks_only_the_winning_source(tmp_path: Path) -> None:
    paths: List[str] = []
    for i in range(200):
        path = tmp_path / f"part{i:03}.tar"
        path.write_bytes(tar_bytes({f"shard{i:03}/file.bin": bytes([i]) * 10, "common.txt": str(i).encode()}))
        paths.append(str(path))
    with ratarmountcore.open(paths) as src:
        assert isinstance(src, UnionSource)
        calls = []
        for number, source in enumerate(src.sources):
            original = source.lookup

            def counting(path: str, original=original, number=number):  # type: ignore[no-untyped-def]
                calls.append(number)
                return original(path)

            source.lookup = counting  # type: ignore[method-assign]
        assert src.read("/shard005/file.bin") == b"\x05" * 10
        assert src.read("/common.txt") == b"199"
        assert calls == [5, 199]
        assert len(src.listdir("/")) == 201
    # The union table is cached and reused by the next mount of the same sources.
    tables = list((tmp_path / "home" / ".cache" / "ratarmount").glob("union-*.sqlite"))
    assert len(tables) == 1
    before = tables[0].stat().st_ino  # (a table is written under another name, then renamed)
    with ratarmountcore.open(paths) as src:
        assert src.read("/shard150/file.bin") == bytes([150]) * 10
    assert tables[0].stat().st_ino == before


def test_union_table_is_rebuilt_when_a_source_changes(tmp_path: Path) -> None:
    a = tmp_path / "a.tar"
    b = tmp_path / "b.tar"
    a.write_bytes(tar_bytes({"x": b"1"}))
    b.write_bytes(tar_bytes({"y": b"2"}))
    with ratarmountcore.open([str(a), str(b)]) as src:
        assert src.listdir("/") == ["x", "y"]
    b.write_bytes(tar_bytes({"z": b"3", "x": b"4"}))
    os.utime(b, ns=(1, 1))
    with ratarmountcore.open([str(a), str(b)]) as src:
        assert src.listdir("/") == ["x", "z"]
        assert src.read("/x") == b"4"


def make_nested(tmp_path: Path) -> Dict[str, bytes]:
    inner_files = {f"n{c:04}": {f"n{c:04}_{i}.JPEG": os.urandom(700 + i) for i in range(5)} for c in range(4)}
    outer: Dict[str, bytes] = {"README": b"outer"}
    for synset, files in inner_files.items():
        outer[f"train/{synset}.tar"] = tar_bytes(files)
    deeper = tar_bytes({"level2.tar": tar_bytes({"leaf.txt": b"leaf"})})
    outer["nested/level1.tar"] = deeper
    (tmp_path / "outer.tar").write_bytes(tar_bytes(outer))
    expected = {"/README": b"outer", "/nested/level1.tar/level2.tar/leaf.txt": b"leaf"}
    for synset, files in inner_files.items():
        for name, data in files.items():
            expected[f"/train/{synset}.tar/{name}"] = data
    return expected


def test_recursive_archives_via_api(tmp_path: Path) -> None:
    expected = make_nested(tmp_path)
    options = OpenOptions(recursive=True)
    with ratarmountcore.open(str(tmp_path / "outer.tar"), options) as src:
        assert read_tree(src) == expected
        assert src.is_dir("/train/n0001.tar")
    index = tmp_path / "outer.tar.index.sqlite"
    built = index.stat().st_mtime_ns
    with ratarmountcore.open(str(tmp_path / "outer.tar"), options) as src:
        assert src.read("/train/n0003.tar/n0003_4.JPEG") == expected["/train/n0003.tar/n0003_4.JPEG"]
    assert index.stat().st_mtime_ns == built  # the inner members came from the persistent index
    with ratarmountcore.open(str(tmp_path / "outer.tar")) as src:  # without -r: plain files again
        assert not src.is_dir("/train/n0001.tar")


def test_recursive_and_union_through_fuse(mounter: Mounter, tmp_path: Path) -> None:
    expected = make_nested(tmp_path)
    extra = tmp_path / "extra.tar"
    extra.write_bytes(tar_bytes({"README": b"overridden", "train/more.txt": b"more"}))
    mnt = mounter.mount(tmp_path / "outer.tar", extra, extra=["-r"])
    expected["/README"] = b"overridden"
    expected["/train/more.txt"] = b"more"
    found = {}
    for root, _dirs, files in os.walk(mnt):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                found[path[len(str(mnt)) :]] = f.read()
    assert found == expected


def test_folder_link_counts_of_a_union_through_fuse_are_those_of_tar_x(mounter: Mounter, tmp_path: Path) -> None:
    """A folder in several archives has 2 links and one per folder in it across all of them,
    as ``tar -x`` of one after the other leaves it (it had the last archive's count)."""
    import subprocess

    first, second = tmp_path / "a.tar", tmp_path / "b.tar"
    first.write_bytes(tar_bytes({"d/x/f": b"1", "d/y/g": b"2", "e/f": b"3"}))
    second.write_bytes(tar_bytes({"d/z/h": b"4", "d/w/v/i": b"5", "top/j": b"6"}))
    extracted = tmp_path / "x"
    extracted.mkdir()
    for archive in (first, second):
        subprocess.run(["tar", "-xf", str(archive), "-C", str(extracted)], check=True)
    mnt = mounter.mount(first, second)
    folders = [root[len(str(extracted)) :] or "/" for root, _dirs, _files in os.walk(extracted)]
    assert len(folders) == 9
    for folder in folders:  # a lookup each (after the walk below: from listings with attributes)
        assert os.stat(f"{mnt}{folder}").st_nlink == os.stat(f"{extracted}{folder}").st_nlink, folder
    walked = {root[len(str(mnt)) :] or "/": os.stat(root).st_nlink for root, _dirs, _files in os.walk(mnt)}
    assert walked == {folder: os.stat(f"{extracted}{folder}").st_nlink for folder in folders}


def compress(data: bytes, tool: str) -> bytes:
    import subprocess

    return subprocess.run([tool, "-c"], input=data, capture_output=True, check=True).stdout


@pytest.mark.parametrize(
    "tool,suffix", [("gzip", "tar.gz"), ("bzip2", "tar.bz2"), ("xz", "tar.xz"), ("zstd", "tar.zst")]
)
def test_recursive_compressed_inner_archives(tmp_path: Path, tool: str, suffix: str) -> None:
    classes = {f"n{c:04}": {f"img{i}.JPEG": os.urandom(3000 + 100 * i) for i in range(6)} for c in range(3)}
    outer = {f"train/{synset}.{suffix}": compress(tar_bytes(files), tool) for synset, files in classes.items()}
    outer["train/notes.txt.gz"] = compress(b"not a tar", "gzip")
    (tmp_path / "outer.tar").write_bytes(tar_bytes(outer))
    options = OpenOptions(recursive=True)
    for _mount in range(2):  # the second open reads rows and seek points from the index
        with ratarmountcore.open(str(tmp_path / "outer.tar"), options) as src:
            for synset, files in classes.items():
                assert src.listdir(f"/train/{synset}.{suffix}") == sorted(files)
                for name, data in files.items():
                    assert src.read(f"/train/{synset}.{suffix}/{name}") == data
            assert src.read("/train/notes.txt.gz") == outer["train/notes.txt.gz"]


@pytest.mark.parametrize("tool,suffix", [("gzip", "tar.gz"), ("bzip2", "tar.bz2"), ("xz", "tar.xz")])
def test_a_damaged_compressed_inner_archive_is_shown_as_the_file_it_is(tmp_path: Path, tool: str, suffix: str) -> None:
    """A compressed inner archive whose data fails its checks (a CRC at the stream's end, after
    members were read) is shown as the file it is, with the outer archive around it; it made
    the whole outer archive fail to open. A compressed member whose data starts with a block of
    zeros (a disk image) is not an empty archive: it stays a file (it was an empty folder)."""
    inner = compress(tar_bytes({"m.txt": bytes(range(256)) * 400, "n.txt": os.urandom(5000)}), tool)
    damaged = bytearray(inner)
    damaged[len(damaged) // 2] ^= 0x10
    zeros = compress(bytes(64 * 1024) + b"an image", tool)
    members = {"good.txt": b"good", f"in.{suffix}": bytes(damaged), f"disk.img.{tool}": zeros, "after.txt": b"after"}
    (tmp_path / "outer.tar").write_bytes(tar_bytes(members))
    for _mount in range(2):
        with ratarmountcore.open(str(tmp_path / "outer.tar"), OpenOptions(recursive=True)) as src:
            assert src.read("/good.txt") == b"good" and src.read("/after.txt") == b"after"
            assert src.info(f"/in.{suffix}").is_file and src.read(f"/in.{suffix}") == bytes(damaged)
            assert src.info(f"/disk.img.{tool}").is_file and src.read(f"/disk.img.{tool}") == zeros
            assert sorted(src.listdir("/")) == sorted(members)


def _tar_in_order(members: List[tuple]) -> bytes:  # type: ignore[type-arg]
    """A tar of (name, data) in order, names may repeat; data None: a folder."""
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.mtime = 1_600_000_000
            if data is None:
                info.type = tarfile.DIRTYPE
            elif isinstance(data, tuple):  # ("link", target): a hard link
                info.type, info.linkname = tarfile.LNKTYPE, data[1]
                data = None
            else:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data or b""))
    return buffer.getvalue()


_INNER = [("a.txt", b"inner")]


@pytest.mark.parametrize(
    "members,expected,strip",
    [
        # tar -r of an updated inner archive: the newer copy replaces the older with all it held
        (
            [
                ("x.tar", [("old.txt", b"old"), ("both.txt", b"v1")]),
                ("x.tar", [("both.txt", b"v2"), ("new.txt", b"n")]),
            ],
            {"/x.tar/both.txt": b"v2", "/x.tar/new.txt": b"n"},
            False,
        ),
        # a folder replaces the archive (a file to tar -x) with all it held
        ([("x.tar", [("old.txt", b"old")]), ("x.tar/", None), ("x.tar/f", b"f")], {"/x.tar/f": b"f"}, False),
        # an archive (a file to tar -x) does not replace a folder that holds files; the outer
        # archive's members after it are extracted, also those below its name (left out before)
        (
            [("sub/", None), ("sub/f", b"f"), ("sub", [("inner.txt", b"i")]), ("sub/g", b"g"), ("z", b"z")],
            {"/sub/f": b"f", "/sub/g": b"g", "/z": b"z"},
            False,
        ),
        # ... also a folder tar made for the members below it (the archive was merged into it)
        ([("sub/x", b"x"), ("sub", _INNER), ("z", b"z")], {"/sub/x": b"x", "/z": b"z"}, False),
        # the outer archive's members after an archive's find a file there: nothing below it
        # (they were shown in its folder), no hard link through it
        ([("sub", _INNER), ("sub/x/", None), ("sub/a.txt", b"outer")], {"/sub/a.txt": b"inner"}, False),
        ([("sub", _INNER), ("h", ("link", "sub/a.txt"))], {"/sub/a.txt": b"inner"}, False),
        ([("o.tar", [("sub", _tar_in_order(_INNER)), ("sub/z", b"z")])], {"/o.tar/sub/a.txt": b"inner"}, False),
        # --strip-tar-extension: the folder g shows g.tar, which tar -x makes as a file g.tar;
        # a later member g.tar replaces it, folder or file (both were shown) ...
        ([("g.tar", _INNER), ("g.tar", b"plain")], {"/g.tar": b"plain"}, True),
        ([("g.tar", _INNER), ("g.tar/", None), ("g.tar/f", b"f")], {"/g.tar/f": b"f"}, True),
        # ... it replaces an earlier file g.tar, not a folder g.tar that holds files ...
        ([("g.tar", b"plain"), ("g.tar", _INNER)], {"/g/a.txt": b"inner"}, True),
        ([("g.tar/f", b"f"), ("g.tar", _INNER)], {"/g.tar/f": b"f"}, True),
        # ... nothing is made below it, and a hard link to it is another name of its file
        ([("g.tar", _INNER), ("g.tar/f", b"f")], {"/g/a.txt": b"inner"}, True),
        ([("g.tar", _INNER), ("h", ("link", "g.tar"))], {"/g/a.txt": b"inner", "/h": _tar_in_order(_INNER)}, True),
    ],
)
def test_an_inner_archive_and_another_member_of_its_name(
    tmp_path: Path,
    members: List[tuple],  # type: ignore[type-arg]
    expected: Dict[str, bytes],
    strip: bool,
) -> None:
    """An inner archive is a file to ``tar -x``: what stays of it and of another member of its
    name is what stays of a file and that member (the older archive's members were shown too)."""
    outer = [(name, _tar_in_order(data) if isinstance(data, list) else data) for name, data in members]
    (tmp_path / "outer.tar").write_bytes(_tar_in_order(outer))
    options = OpenOptions(recursive=True, strip_tar_extension=strip)
    with ratarmountcore.open(str(tmp_path / "outer.tar"), options) as src:
        shown = {
            f"{folder.rstrip('/')}/{name}": src.read(f"{folder.rstrip('/')}/{name}")
            for folder, _dirs, files in src.walk("/")
            for name in files
        }
    assert shown == expected


@pytest.mark.parametrize("tool", [None, "gzip"])
def test_a_hard_link_to_an_inner_archive_is_its_file(tmp_path: Path, tool: Optional[str]) -> None:
    """A hard link to a member that ``-r`` shows as a folder: ``tar -x`` makes it (another name
    of the archive's file), so it is shown as that file, with its own inode number (it was left
    out, and its data with it)."""
    inner = tar_bytes({"inner.txt": b"inside"})
    stored = compress(inner, tool) if tool else inner
    name = "c.tar.gz" if tool else "c.tar"
    (tmp_path / "outer.tar").write_bytes(_tar_in_order([(name, stored), ("d", ("link", name))]))
    with ratarmountcore.open(str(tmp_path / "outer.tar"), OpenOptions(recursive=True)) as src:
        assert src.read(f"/{name}/inner.txt") == b"inside"
        assert src.info("/d").is_file and src.read("/d") == stored
        assert src.info("/d").ino != src.info(f"/{name}").ino and src.info("/d").nlink == 1


def test_recursive_compressed_inner_through_fuse(mounter: Mounter, tmp_path: Path) -> None:
    files = {f"img{i}.JPEG": os.urandom(5000) for i in range(20)}
    (tmp_path / "outer.tar").write_bytes(tar_bytes({"cls.tar.gz": compress(tar_bytes(files), "gzip")}))
    mnt = mounter.mount(tmp_path / "outer.tar", extra=["-r"])
    assert sorted(os.listdir(mnt / "cls.tar.gz")) == sorted(files)
    for name, data in files.items():
        assert (mnt / "cls.tar.gz" / name).read_bytes() == data


def test_index_built_with_recursion_serves_without_it_when_no_member_is_an_archive(tmp_path: Path) -> None:
    plain = tmp_path / "plain.tar"
    plain.write_bytes(tar_bytes({"a.txt": b"a", "b/c.txt": b"c"}))
    nested = tmp_path / "nested.tar"
    nested.write_bytes(tar_bytes({"inner.tar": tar_bytes({"x.txt": b"x"}), "y.txt": b"y"}))
    for path in (plain, nested):
        with ratarmountcore.open(str(path), OpenOptions(recursive=True)):
            pass
    built = {p: Path(str(p) + ".index.sqlite").stat().st_mtime_ns for p in (plain, nested)}
    with ratarmountcore.open(str(plain)) as src:  # no inner archive: the same index serves
        assert src.read("/b/c.txt") == b"c"
    assert Path(str(plain) + ".index.sqlite").stat().st_mtime_ns == built[plain]
    with ratarmountcore.open(str(nested)) as src:  # inner.tar is a folder in that index: rebuilt
        assert src.info("/inner.tar").is_file
    assert Path(str(nested) + ".index.sqlite").stat().st_mtime_ns != built[nested]


def test_strip_tar_extension_names_inner_archives_by_class(tmp_path: Path) -> None:
    """``NAME.tar`` inside an archive is the folder ``NAME`` (also nested, and compressed inner
    archives keep their names); the index records the option: an index built without it is
    rebuilt, an index without inner archives serves either way."""
    expected = make_nested(tmp_path)
    stripped = {
        path.replace("/n0000.tar/", "/n0000/").replace("/n0001.tar/", "/n0001/").replace("/n0002.tar/", "/n0002/")
        .replace("/n0003.tar/", "/n0003/").replace("/level1.tar/level2.tar/", "/level1/level2/"): data
        for path, data in expected.items()
    }  # fmt: skip
    outer = tmp_path / "outer.tar"
    index = Path(str(outer) + ".index.sqlite")
    with ratarmountcore.open(str(outer), OpenOptions(recursive=True)) as src:
        assert src.is_dir("/train/n0001.tar")
    built = index.stat().st_mtime_ns
    options = OpenOptions(recursive=True, strip_tar_extension=True)
    with ratarmountcore.open(str(outer), options) as src:
        assert read_tree(src) == stripped
        assert src.listdir("/train") == ["n0000", "n0001", "n0002", "n0003"]
        assert not src.exists("/train/n0001.tar") and src.is_dir("/nested/level1/level2")
    assert index.stat().st_mtime_ns != built  # names differ: rebuilt
    rebuilt = index.stat().st_mtime_ns
    with ratarmountcore.open(str(outer), options) as src:
        assert src.read("/train/n0002/n0002_1.JPEG") == expected["/train/n0002.tar/n0002_1.JPEG"]
    assert index.stat().st_mtime_ns == rebuilt  # and then used
    plain = tmp_path / "plain.tar"
    plain.write_bytes(tar_bytes({"a.tar.txt": b"a"}))
    with ratarmountcore.open(str(plain), OpenOptions(recursive=True)):
        pass
    built = Path(str(plain) + ".index.sqlite").stat().st_mtime_ns
    with ratarmountcore.open(str(plain), options) as src:  # no inner archive: nothing to strip
        assert src.read("/a.tar.txt") == b"a"
    assert Path(str(plain) + ".index.sqlite").stat().st_mtime_ns == built
    gz = tmp_path / "gz.tar"
    inner = compress(tar_bytes({"x": b"x"}), "gzip")
    gz.write_bytes(tar_bytes({"c.tar.gz": inner, "only.tar": tar_bytes({"y": b"y"})}))
    with ratarmountcore.open(str(gz), options) as src:
        assert src.listdir("/") == ["c.tar.gz", "only"] and src.read("/c.tar.gz/x") == b"x"


def test_an_index_of_inner_archives_built_by_older_rules_is_rebuilt(tmp_path: Path) -> None:
    """What an index shows of inner archives changed (their rows are what their scan recorded;
    a stripped archive's own name holds its file): an index with inner archives and older rules
    is rebuilt once; one without inner archives serves as it is."""
    for name, members, rebuilt in (
        ("nested.tar", {"x.tar": tar_bytes({"y": b"y"})}, True),
        ("flat.tar", {"x": b"x"}, False),
    ):
        archive = tmp_path / name
        archive.write_bytes(tar_bytes(members))
        index = Path(str(archive) + ".index.sqlite")
        with ratarmountcore.open(str(archive), OpenOptions(recursive=True)):
            pass
        with sqlite3.connect(index) as conn:  # as an index of the last release wrote it
            conn.execute("DELETE FROM metadata WHERE key = 'inner_archive_rules'")
        conn.close()
        built = index.stat().st_mtime_ns
        with ratarmountcore.open(str(archive), OpenOptions(recursive=True)) as src:
            assert src.read("/x.tar/y" if rebuilt else "/x") == (b"y" if rebuilt else b"x")
        assert (index.stat().st_mtime_ns != built) == rebuilt, name


@pytest.mark.parametrize("api", ["low", "high"])
def test_a_union_shows_nothing_below_a_file_a_later_archive_only_implies_as_a_folder(
    mounter: Mounter, tmp_path: Path, api: str
) -> None:
    """a.tar has a file f, b.tar only f/a: the implied folder replaces nothing, and f/a is not
    the union's (tar -x of a, then b: "Not a directory"). The API found and read f/a below the
    file, where the mount said ENOTDIR."""
    (tmp_path / "a.tar").write_bytes(tar_bytes({"f": b"file"}))
    (tmp_path / "b.tar").write_bytes(tar_bytes({"f/a": b"below", "g": b"g"}))
    sources = [str(tmp_path / "a.tar"), str(tmp_path / "b.tar")]
    with ratarmountcore.open(sources) as src:
        assert src.read("/f") == b"file" and src.listdir("/") == ["f", "g"]
        with pytest.raises(NotADirectoryError):
            src.stat("/f/a")
        assert not src.exists("/f/a.versions/1")
    mnt = mounter.mount(*sources, extra=["--fuse-api", api])
    assert (mnt / "f").read_bytes() == b"file" and sorted(os.listdir(mnt)) == ["f", "g"]
    with pytest.raises(NotADirectoryError):
        os.lstat(mnt / "f" / "a")


@pytest.mark.parametrize("api", ["low", "high"])
def test_versions_in_a_union_are_those_of_the_source_a_name_is_from(mounter: Mounter, tmp_path: Path, api: str) -> None:
    """``PATH.versions`` lists the versions of the source that wins PATH, and its entries are
    found there only: ``f.versions/2`` was x1's second version while the listing was x2's (and
    ENOENT through the low-level mount after other lookups); versions of a name the union does
    not show were found by lstat, then ESTALE to read."""
    x1 = [("f", b"one"), ("f", b"two"), ("c", b"c"), ("c/x", b"hidden"), ("c/", None)]
    (tmp_path / "x1.tar").write_bytes(_tar_in_order(x1))
    (tmp_path / "x2.tar").write_bytes(_tar_in_order([("f", b"new")]))
    sources = [str(tmp_path / "x1.tar"), str(tmp_path / "x2.tar")]
    with ratarmountcore.open(sources) as src:
        assert src.listdir("/f.versions") == ["1"] and src.read("/f.versions/1") == b"new"
        assert not src.exists("/f.versions/2") and not src.exists("/c/x") and not src.exists("/c/x.versions/1")
        assert src.listdir("/c") == [] and src.listdir("/c.versions") == ["1", "2"]
    mnt = mounter.mount(*sources, extra=["--fuse-api", api])
    assert (mnt / "f.versions" / "1").read_bytes() == b"new"
    for missing in ("f.versions/2", "f.versions/0", "c/x.versions/1", "f.versions/2", "c/x.versions/1"):
        with pytest.raises(FileNotFoundError):  # (again: the folder's rows answer later lookups)
            os.lstat(mnt / missing)
    assert os.listdir(mnt / "f.versions") == ["1"] and (mnt / "c.versions" / "1").read_bytes() == b"c"


def test_strip_tar_extension_through_fuse(mounter: Mounter, tmp_path: Path) -> None:
    expected = make_nested(tmp_path)
    mnt = mounter.mount(tmp_path / "outer.tar", extra=["-r", "--strip-tar-extension"])
    assert sorted(os.listdir(mnt / "train")) == ["n0000", "n0001", "n0002", "n0003"]
    assert not os.path.exists(mnt / "train" / "n0000.tar")
    with open(mnt / "train" / "n0003" / "n0003_2.JPEG", "rb") as f:
        assert f.read() == expected["/train/n0003.tar/n0003_2.JPEG"]
    result = run_ratarmount("--strip-tar-extension", str(tmp_path / "outer.tar"), str(tmp_path / "elsewhere"))
    assert result.returncode != 0 and "works with -r" in result.stderr and "Traceback" not in result.stderr


def test_the_first_entries_of_a_large_union_folder_come_from_the_sources_that_have_them(tmp_path: Path) -> None:
    """Shards mounted together (one folder of all their files): telling that the folder is large
    lists only the shards of its first names, not all of them; the parts of a listing by rows
    agree with the whole listing."""
    paths: List[str] = []
    for i in range(50):
        path = tmp_path / f"shard{i:02}.tar"
        path.write_bytes(tar_bytes({f"{i:02}-{k:02}.jpg": f"{i}/{k}".encode() for k in range(20)}))
        paths.append(str(path))
    with ratarmountcore.open(paths) as src:
        listed = []
        for number, source in enumerate(src.sources):  # type: ignore[attr-defined]
            original = source.list_entries

            def counting(path: str, original=original, number=number):  # type: ignore[no-untyped-def]
                listed.append(number)
                return original(path)

            source.list_entries = counting  # type: ignore[method-assign]
        first = src.list_entries_upto("/", 45)
        expected = sorted(f"{i:02}-{k:02}.jpg" for i in range(3) for k in range(20))[:45]
        assert [name for name, _ in first or []] == expected
        assert sorted(listed) == [0, 1, 2]
        assert all(info.ino >> 40 == int(name[:2]) for name, info in first or [])
        rows = src.list_stat_rows("/") or []
        parts: List[bytes] = []
        after = None
        while True:
            part = src.list_stat_rows_after("/", after, 64) or []
            if not part:
                break
            parts += [row[0] for row in part]
            after = part[-1][0]
        assert parts == sorted(row[0] for row in rows) and len(parts) == 1000
        for row in rows:  # the union table's attributes are the winner's
            info = src.info("/" + row[0].decode())
            assert row[1:] == (info.mode, info.size, info.mtime_ns, info.uid, info.gid) + (
                info.nlink,
                info.ino,
                info.rdev,
                info.st_blocks,
            )


_NAME = st.text(alphabet="abcXYZ019_-.", min_size=1, max_size=12).filter(lambda n: n not in (".", ".."))


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    classes=st.dictionaries(_NAME, st.dictionaries(_NAME, st.binary(max_size=64), min_size=1, max_size=4), max_size=5),
    loose=st.dictionaries(_NAME, st.binary(max_size=64), max_size=3),
)
def test_any_inner_tars_read_back_without_their_extension(
    tmp_path_factory: pytest.TempPathFactory, classes: Dict[str, Dict[str, bytes]], loose: Dict[str, bytes]
) -> None:
    """Generated class tars (any names, also ones ending in .tar themselves) in an outer tar beside
    loose files: with ``strip_tar_extension`` every member reads back at ``CLASS/MEMBER``, exactly
    once, and the loose files as they are; where a loose file is also named ``CLASS``, the later
    of the two is shown (versions of one name)."""
    folder = tmp_path_factory.mktemp("strip")
    outer: Dict[str, bytes] = {f"{name}.tar": tar_bytes(files) for name, files in classes.items()}
    outer.update({name: data for name, data in loose.items() if f"{name}" not in outer})
    (folder / "outer.tar").write_bytes(tar_bytes(outer))
    with ratarmountcore.open(str(folder / "outer.tar"), OpenOptions(recursive=True, strip_tar_extension=True)) as src:
        found = read_tree(src)
        expected: Dict[str, bytes] = {}
        for name in outer:  # in archive order: a later member of the same shown name wins
            if name.endswith(".tar") and name[:-4] in classes:
                for path in [p for p in expected if p == f"/{name[:-4]}" or p.startswith(f"/{name[:-4]}/")]:
                    del expected[path]
                expected.update({f"/{name[:-4]}/{member}": data for member, data in classes[name[:-4]].items()})
            else:
                expected = {p: d for p, d in expected.items() if not p.startswith(f"/{name}/")}
                expected[f"/{name}"] = outer[name]
        assert found == expected
        for name in classes:
            assert not src.exists(f"/{name}.tar") or f"{name}.tar" in loose


@pytest.mark.parametrize("cut", [512 + 4000, 512 + 10_000 - 1, 512 + 10_240 + 100])
def test_a_truncated_inner_tar_never_reads_into_the_outer_archive(tmp_path: Path, cut: int) -> None:
    """An inner tar cut off inside a member's data: that member is left out with a warning (its
    reads went on into the outer archive's next header and data), the members before it stay."""
    inner = tar_bytes({"first.txt": b"F" * 300, "member.txt": b"A" * 10_000, "last.txt": b"L" * 50})
    first_end = 512 + 512 + 512  # first.txt's header and data, member.txt's header
    outer = tmp_path / "outer.tar"
    outer.write_bytes(tar_bytes({"inner.tar": inner[: first_end + cut - 512], "next.txt": b"Z" * 10_000}))
    with ratarmountcore.open(str(outer), OpenOptions(recursive=True)) as src:
        assert src.read("/inner.tar/first.txt") == b"F" * 300
        shown = src.listdir("/inner.tar")
        for name in shown:
            data = src.read(f"/inner.tar/{name}")
            assert set(data) <= {ord("F"), ord("A"), ord("L")}, name  # never the outer archive's bytes
        assert "member.txt" not in shown or src.read("/inner.tar/member.txt") == b"A" * 10_000
        assert src.read("/next.txt") == b"Z" * 10_000


@pytest.mark.parametrize("tool", [None, "gzip"])
def test_a_damaged_inner_archive_of_which_nothing_could_be_read_is_the_file_it_is(
    tmp_path: Path, tool: Optional[str]
) -> None:
    """An inner archive cut off before its first member's end (a tar's data, a gzip stream's
    first deflate block) is shown as the file it is; it was an empty folder that hid its bytes."""
    inner = tar_bytes({"big.bin": os.urandom(40_000), "small.txt": b"s"})
    stored = (compress(inner, tool) if tool else inner)[:10_000]
    name = "cut.tar.gz" if tool else "cut.tar"
    (tmp_path / "outer.tar").write_bytes(tar_bytes({name: stored, "after.txt": b"after"}))
    for _mount in range(2):
        with ratarmountcore.open(str(tmp_path / "outer.tar"), OpenOptions(recursive=True)) as src:
            assert src.info(f"/{name}").is_file and src.read(f"/{name}") == stored
            assert src.read("/after.txt") == b"after"


def _tar_of(path: Path, tree: Dict[str, object]) -> Path:
    """A tar of ``tree``: name -> bytes (a file), None (a folder), or ("link", target) (a hard link)."""
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for name, what in tree.items():
            info = tarfile.TarInfo(name)
            if what is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif isinstance(what, tuple):
                info.type, info.linkname = tarfile.LNKTYPE, what[1]
                tar.addfile(info)
            else:
                assert isinstance(what, bytes)
                info.size = len(what)
                tar.addfile(info, io.BytesIO(what))
    return path


def test_a_file_of_a_later_source_replaces_an_empty_folder_and_is_refused_over_a_full_one(tmp_path: Path) -> None:
    """As ``tar -x`` of one source after the other: a file replaces a folder it can remove (an
    empty one; a folder of a still later source then starts empty), and is refused where the
    folder holds something ("File exists"), which stays as it is, however it was made (with a
    member of its own, or only implied by its members' paths)."""
    empty = _tar_of(tmp_path / "E.tar", {"d": None, "keep/k": b"k"})
    full = _tar_of(tmp_path / "A.tar", {"d": None, "d/old": b"old", "d/sub/deep": b"deep", "keep/k": b"k"})
    implied = _tar_of(tmp_path / "I.tar", {"d/old": b"old"})
    b = _tar_of(tmp_path / "B.tar", {"d": b"file"})
    c = _tar_of(tmp_path / "C.tar", {"d": None, "d/new": b"new"})
    with ratarmountcore.open([str(empty), str(b), str(c)]) as src:
        assert sorted(src.listdir("/")) == ["d", "keep"] and src.listdir("/d") == ["new"]
    with ratarmountcore.open([str(empty), str(b)]) as src:
        assert src.read("/d") == b"file" and src.read("/keep/k") == b"k"
    with ratarmountcore.open([str(full), str(b), str(c)]) as src:
        assert sorted(src.listdir("/d")) == ["new", "old", "sub"] and src.read("/d/sub/deep") == b"deep"
    for first in (full, implied):
        with ratarmountcore.open([str(first), str(b)]) as src:
            assert src.info("/d").is_dir and src.read("/d/old") == b"old"


def test_a_hard_link_whose_other_name_a_later_source_replaces_stays_readable(tmp_path: Path) -> None:
    """A holds b and x.txt as one file (hard links); B replaces b. x.txt is still A's: found by
    its inode number (what the kernel asks a mount by) under the name the union still shows."""
    a = _tar_of(tmp_path / "A.tar", {"b": b"payload", "x.txt": ("link", "b")})
    b = _tar_of(tmp_path / "B.tar", {"b": b"other"})
    with ratarmountcore.open([str(a), str(b)]) as src:
        assert src.read("/x.txt") == b"payload" and src.read("/b") == b"other"
        info = src.lookup("/x.txt")
        assert info is not None
        found = src.by_ino(info.ino)
        assert found is not None and found[0] == "/x.txt" and found[1].ino == info.ino


def test_a_miss_in_a_union_of_archives_asks_no_source(tmp_path: Path) -> None:
    """The union table lists every name of a union of archives: a name not in it is a miss at
    once (a Python start-up from a union probes thousands of missing names), except the
    PATH.versions names no table lists, which their sources answer."""
    archives = [_tar_of(tmp_path / f"s{i}.tar", {f"f{i}": b"%d" % i, "same": b"%d" % i}) for i in range(20)]
    with ratarmountcore.open([str(a) for a in archives]) as src:
        assert isinstance(src, UnionSource)
        asked: List[str] = []
        for source in src.sources:
            original = source.lookup

            def counting(path: str, original=original) -> object:  # type: ignore[no-untyped-def]
                asked.append(path)
                return original(path)

            source.lookup = counting  # type: ignore[method-assign]
        assert src.lookup("/missing") is None and src.lookup("/f3/below") is None
        assert asked == []
        assert src.read("/same.versions/1") == b"19"  # (its own archive's first version)

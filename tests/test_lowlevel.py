"""The low-level front-end: request logic checked against the kernel's reply layouts (parsed here
independently of ``kernel_abi``), node ids, and the fallback to libfuse's high-level API."""

from __future__ import annotations

import errno
import gc
import io
import os
import stat
import struct
import tarfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytest
from conftest import Mounter, tar_bytes

import ratarmountcore
from ratarmount.inodes import ROOT_ID, StaleNodeError
from ratarmount.lowlevel_ops import STABLE_LIMIT, TIMEOUT, LowLevelOperations
from ratarmount.workers import MAX_THREADS_CAP, default_max_threads, loop_threads
from ratarmountcore.errors import RatarmountError
from ratarmountcore.sources.base import FileInfo

ATTR = struct.Struct("=QQQqqqIIIIIIIIII")
ENTRY_HEAD = struct.Struct("=QQQQII")
DIRENT = struct.Struct("=QQII")


def parse_attr(raw: bytes) -> Dict[str, int]:
    names = "ino size blocks atime mtime ctime atimensec mtimensec ctimensec mode nlink uid gid rdev blksize flags"
    return dict(zip(names.split(), ATTR.unpack(raw)))


def parse_entry(raw: bytes) -> Tuple[int, int, Dict[str, int]]:
    assert len(raw) == ENTRY_HEAD.size + ATTR.size
    node, generation, entry_valid, attr_valid, _, _ = ENTRY_HEAD.unpack_from(raw)
    assert generation == 0 and attr_valid == entry_valid
    return node, entry_valid, parse_attr(raw[ENTRY_HEAD.size :])


def parse_page(raw: bytes, plus: bool) -> List[Tuple[bytes, int, int, Dict[str, int]]]:
    """(name, dirent offset, node id (plus only), attrs (plus only)) of each record."""
    records = []
    position = 0
    while position < len(raw):
        node, attrs = 0, {}
        if plus:
            node, _, attrs = parse_entry(raw[position : position + ENTRY_HEAD.size + ATTR.size])
            position += ENTRY_HEAD.size + ATTR.size
        ino, offset, namelen, kind = DIRENT.unpack_from(raw, position)
        name = raw[position + DIRENT.size : position + DIRENT.size + namelen]
        assert ino != 0
        if plus and node:
            assert kind == stat.S_IFMT(attrs["mode"]) >> 12 and attrs["ino"] == ino
        records.append((name, offset, node, attrs))
        position += (DIRENT.size + namelen + 7) & ~7
    assert position == len(raw)
    return records


def make_tar(path: Path) -> Path:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in {"a/one": b"1" * 10, "a/two": b"22", "b/three": b"333", "top": b"t"}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1_600_000_000
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("a/link-to-one")
        link.type = tarfile.LNKTYPE
        link.linkname = "a/one"
        tar.addfile(link)
        symlink = tarfile.TarInfo("sym")
        symlink.type = tarfile.SYMTYPE
        symlink.linkname = "a/two"
        tar.addfile(symlink)
        again = tarfile.TarInfo("top")  # a second version of "top"
        again.size = 2
        tar.addfile(again, io.BytesIO(b"T2"))
    return path


@pytest.fixture
def ops(tmp_path: Path):  # type: ignore[no-untyped-def]
    source = ratarmountcore.open(str(make_tar(tmp_path / "data.tar")))
    operations = LowLevelOperations(source)
    operations.init(no_open_supported=False)
    yield operations
    source.close()


def list_all(ops: LowLevelOperations, node: int, plus: bool, size: int) -> List[Tuple[bytes, int, int, Dict[str, int]]]:
    handle = struct.unpack("=QII", ops.opendir(node))[0]
    records = []
    offset = 0
    while True:
        page = ops.readdir(node, handle, size, offset, plus)
        assert len(page) <= size
        if not page:
            break
        parsed = parse_page(page, plus)
        assert [r[1] for r in parsed] == list(range(offset + 1, offset + 1 + len(parsed)))
        records += parsed
        offset = parsed[-1][1]
    ops.releasedir(handle)
    return records


def recorded_lookups(source: ratarmountcore.MountSource) -> List[str]:
    """The paths ``source.lookup`` is asked for from now on."""
    asked: List[str] = []
    real = source.lookup

    def counting(path: str):  # type: ignore[no-untyped-def]
        asked.append(path)
        return real(path)

    source.lookup = counting  # type: ignore[method-assign]
    return asked


def lookup(ops: LowLevelOperations, parent: int, name: bytes) -> Tuple[int, Dict[str, int]]:
    """A LOOKUP as the front-end answers it: the reply, then what is left for after it."""
    node, timeout, attrs = parse_entry(ops.lookup(parent, name))
    ops.after_reply()
    assert timeout == TIMEOUT
    return node, attrs


def test_archive_entries_are_named_by_their_inode_numbers(ops: LowLevelOperations) -> None:
    for size in (200, 4096):  # tiny pages: one entry each; normal pages
        root = list_all(ops, ROOT_ID, plus=True, size=size)
        assert [r[0] for r in root] == [b".", b"..", b"a", b"b", b"sym", b"top"]
        assert root[0][2] == 0 and root[1][2] == 0  # "." and ".." carry no node id
        for name, _offset, node, attrs in root[2:]:
            assert node == attrs["ino"] == ops.source.info("/" + name.decode()).ino
            assert 1 < node < STABLE_LIMIT
    # Nothing to remember: the kernel's references are inode numbers the index resolves.
    assert len(ops.nodes) == 1
    a_node, a_attrs = lookup(ops, ROOT_ID, b"a")
    assert stat.S_ISDIR(a_attrs["mode"])
    plain = list_all(ops, a_node, plus=False, size=4096)
    plus = list_all(ops, a_node, plus=True, size=4096)
    assert [r[0] for r in plain] == [r[0] for r in plus] == [b".", b"..", b"link-to-one", b"one", b"two"]
    assert len(ops.nodes) == 1


def test_attributes_reads_and_links(ops: LowLevelOperations) -> None:
    a_node, _ = lookup(ops, ROOT_ID, b"a")
    one, one_attrs = lookup(ops, a_node, b"one")
    link, link_attrs = lookup(ops, a_node, b"link-to-one")
    assert link == one and link_attrs == one_attrs and one_attrs["nlink"] == 2  # a hard link: one inode
    assert one_attrs["size"] == 10 and one_attrs["mtime"] == 1_600_000_000
    getattr_reply = ops.getattr(one)
    assert struct.unpack_from("=Q", getattr_reply)[0] == TIMEOUT
    assert parse_attr(getattr_reply[16:]) == one_attrs
    buffer = bytearray(64)
    assert ops.read(link, 0, 0, memoryview(buffer)) == 10 and bytes(buffer[:10]) == b"1" * 10
    assert ops.read(one, 0, 8, memoryview(buffer)) == 2
    top, top_attrs = lookup(ops, ROOT_ID, b"top")
    assert top_attrs["size"] == 2 and ops.read(top, 0, 0, memoryview(buffer)) == 2 and buffer[:2] == b"T2"
    sym, sym_attrs = lookup(ops, ROOT_ID, b"sym")
    assert stat.S_ISLNK(sym_attrs["mode"]) and ops.readlink(sym) == b"a/two"
    with pytest.raises(OSError) as info:
        ops.readlink(top)
    assert info.value.errno == errno.EINVAL


def test_misses_are_cached_negative_entries(ops: LowLevelOperations) -> None:
    node, timeout, attrs = parse_entry(ops.lookup(ROOT_ID, b"missing"))
    assert node == 0 and timeout == TIMEOUT and attrs["mode"] == 0


def test_pseudo_entries_get_counted_table_nodes(ops: LowLevelOperations) -> None:
    versions, attrs = lookup(ops, ROOT_ID, b"top.versions")
    assert versions >= STABLE_LIMIT and attrs["ino"] == versions and stat.S_ISDIR(attrs["mode"])
    listed = list_all(ops, versions, plus=True, size=4096)
    assert [r[0] for r in listed] == [b".", b"..", b"1", b"2"]
    buffer = bytearray(8)
    first = listed[2][2]
    assert ops.read(first, 0, 0, memoryview(buffer)) == 1 and buffer[:1] == b"t"
    lookup(ops, ROOT_ID, b"top.versions")  # the kernel now holds two references
    ops.forget(versions, 1)
    assert ops.getattr(versions)
    ops.forget(versions, 1)
    with pytest.raises(OSError) as info:
        ops.getattr(versions)
    assert info.value.errno == errno.ESTALE


def test_forget_batches_count_table_nodes_and_skip_inode_numbers(ops: LowLevelOperations) -> None:
    versions, _attrs = lookup(ops, ROOT_ID, b"top.versions")
    lookup(ops, ROOT_ID, b"top.versions")
    lookup(ops, ROOT_ID, b"top.versions")  # three references
    own, _attrs = lookup(ops, ROOT_ID, b"a")  # a stable inode number: not in the table
    assert own < STABLE_LIMIT
    ops.forget_all([own, versions, ROOT_ID], [5, 2, 1])
    assert ops.getattr(versions) and ops.getattr(own) and ops.getattr(ROOT_ID)
    ops.forget_all([versions], [1])
    with pytest.raises(OSError) as info:
        ops.getattr(versions)
    assert info.value.errno == errno.ESTALE


class _RecordingLib:
    """Stands in for libfuse in the glue's callbacks: records the replies."""

    def __init__(self) -> None:
        self.replies: List[str] = []

    def fuse_reply_none(self, _req: int) -> None:
        self.replies.append("none")

    def fuse_reply_buf(self, _req: int, payload: bytes, size: int) -> None:
        assert len(payload) == size
        self.replies.append("buf")

    def fuse_reply_err(self, _req: int, code: int) -> None:
        self.replies.append(f"err {errno.errorcode[code]}")

    def fuse_req_ctx(self, _req: int) -> None:
        raise AssertionError("not asked for by these callbacks")


def _glue(ops: LowLevelOperations, lib: Optional[_RecordingLib] = None) -> Any:
    """A ``LowLevelFuse`` made without mounting: its callbacks over ``ops``, replies recorded."""
    lowlevel = pytest.importorskip("ratarmount.lowlevel")
    glue = lowlevel.LowLevelFuse.__new__(lowlevel.LowLevelFuse)
    glue.lib, glue.ops, glue._pinned, glue._callbacks = lib or _RecordingLib(), ops, set(), []
    glue._local, glue.reads = None, lowlevel.ReadHandOff(2, 2)
    return glue


def test_forget_multi_glue_hands_the_pairs_over(ops: LowLevelOperations) -> None:
    """The FORGET_MULTI callback reads the C array of (node, count) pairs as it is."""
    lowlevel = pytest.importorskip("ratarmount.lowlevel")
    versions, _attrs = lookup(ops, ROOT_ID, b"top.versions")
    lookup(ops, ROOT_ID, b"top.versions")
    glue = _glue(ops)
    table = glue._build_table()
    forget_multi = lowlevel.FORGET_MULTI(table.forget_multi)
    pairs = (lowlevel.ForgetData * 3)(
        lowlevel.ForgetData(5, 7), lowlevel.ForgetData(versions, 1), lowlevel.ForgetData(ROOT_ID, 1)
    )
    forget_multi(None, 3, pairs)
    assert ops.getattr(versions)  # one of two references left
    forget_multi(None, 1, (lowlevel.ForgetData * 1)(lowlevel.ForgetData(versions, 1)))
    with pytest.raises(OSError):
        ops.getattr(versions)
    assert glue.lib.replies == ["none", "none"]


def test_forget_multi_glue_makes_no_type_per_batch_size(ops: LowLevelOperations) -> None:
    """Batches of every size leave no ctypes type behind: ctypes keeps each array type it made
    (and its pointer type) for good, so a type per distinct batch size grew the daemon for as
    long as it ran. The pairs still arrive as they are."""
    lowlevel = pytest.importorskip("ratarmount.lowlevel")
    handed: List[Tuple[List[int], List[int]]] = []
    ops.forget_all = lambda nodes, counts: handed.append((nodes, counts))  # type: ignore[method-assign]
    glue = _glue(ops)
    forget_multi = lowlevel.FORGET_MULTI(glue._build_table().forget_multi)
    pairs = [lowlevel.ForgetData(1000 + i, i + 1) for i in range(300)]
    batches = [(lowlevel.ForgetData * size)(*pairs[:size]) for size in range(1, 301)]  # made before counting
    gc.collect()
    types_before = sum(1 for obj in gc.get_objects() if isinstance(obj, type))
    for size, batch in enumerate(batches, 1):
        forget_multi(None, size, batch)
    gc.collect()
    assert sum(1 for obj in gc.get_objects() if isinstance(obj, type)) - types_before < 10
    assert handed[6] == ([1000 + i for i in range(7)], [i + 1 for i in range(7)])
    assert len(handed) == 300 and glue.lib.replies == ["none"] * 300


def test_lookup_glue_replies_before_the_hint_to_read_ahead(tmp_path: Path) -> None:
    """The LOOKUP callback writes the reply first, then tells the source which file a random
    open will read: the kernel goes on with the open while the hint's fadvise runs. A hint that
    fails is only logged, and a failed lookup leaves none behind."""
    lowlevel = pytest.importorskip("ratarmount.lowlevel")
    archive = tmp_path / "hints.tar"
    archive.write_bytes(tar_bytes({"a/f0": b"0", "c/h": b"h"}))
    with ratarmountcore.open(str(archive)) as source:
        ops = LowLevelOperations(source)
        ops.init(no_open_supported=True)
        recording = _RecordingLib()

        def will_read(info: "ratarmountcore.FileInfo") -> None:
            recording.replies.append(f"hint {info.size}")

        source.will_read = will_read  # type: ignore[method-assign]
        glue = _glue(ops, recording)
        callback = lowlevel.LOOKUP(glue._build_table().lookup)
        a = lookup(ops, ROOT_ID, b"a")[0]
        callback(None, a, b"f0")  # a random open: folder, then file
        assert recording.replies == ["buf", "hint 1"]

        def failing(info: "ratarmountcore.FileInfo") -> None:
            raise OSError(errno.EBADF, "closed")

        source.will_read = failing  # type: ignore[method-assign]
        c = lookup(ops, ROOT_ID, b"c")[0]
        callback(None, c, b"h")  # (logged, not raised into C)
        assert recording.replies == ["buf", "hint 1", "buf"]
        source.will_read = will_read  # type: ignore[method-assign]
        callback(None, a, b"x" * 300)  # a random open that fails
        assert recording.replies == ["buf", "hint 1", "buf", "err ENAMETOOLONG"]


def test_union_entries_are_named_by_their_union_inode_numbers(tmp_path: Path) -> None:
    """A union numbers its entries (source above the entry's own number), finds them again by
    number, and lists from the sources' plain rows: no table ids. An entry hidden by a later
    source's is not found by its number."""
    first = make_tar(tmp_path / "first.tar")
    with tarfile.open(tmp_path / "second.tar", "w") as tar:
        for name, data in {"top": b"second", "b/extra": b"x"}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with ratarmountcore.open(str(first)) as alone:
        hidden = alone.info("/top").ino
    with ratarmountcore.open([str(first), str(tmp_path / "second.tar")]) as source:
        ops = LowLevelOperations(source)
        node, attrs = lookup(ops, ROOT_ID, b"top")
        assert 1 < node < STABLE_LIMIT and node == attrs["ino"] and attrs["size"] == 6 and len(ops.nodes) == 1
        root = list_all(ops, ROOT_ID, plus=True, size=4096)
        named = {r[0]: r[2] for r in root if r[0] not in (b".", b"..")}
        assert set(named) == {b"a", b"b", b"sym", b"top"} and named[b"top"] == node
        assert all(1 < n < STABLE_LIMIT for n in named.values()) and len(ops.nodes) == 1
        merged = list_all(ops, named[b"b"], plus=True, size=4096)
        assert sorted(r[0] for r in merged if r[0] not in (b".", b"..")) == [b"extra", b"three"]
        assert source.by_ino(node) is not None and source.by_ino(node)[0] == "/top"  # type: ignore[index]
        assert source.by_ino(hidden) is None  # the first archive's "top" lost to the second's
        buffer = bytearray(16)
        assert ops.read(node, 0, 0, memoryview(buffer)) == 6 and buffer[:6] == b"second"
        paged = source.list_stat_rows_after("/", b"a", 2)
        assert [r[0] for r in paged or []] == [b"b", b"sym"]
        for folder in ("/", "/b", "/a", "/top.versions"):  # names only: the same rows, narrower
            rows = source.list_stat_rows_after(folder, None, 100) or []
            assert source.list_name_rows_after(folder, None, 100) == [(r[0], r[1], r[7]) for r in rows], folder
        assert source.list_name_rows_after("/top", None, 5) is None


def test_union_entries_are_found_by_number_after_the_recent_lookups_are_forgotten(tmp_path: Path) -> None:
    """Every number a union hands out is found again by ``by_ino`` (a single compressed file
    among its sources too), or the entry gets none and a table id."""
    import gzip

    (tmp_path / "notes.txt.gz").write_bytes(gzip.compress(b"plain text " * 100))
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "loose.txt").write_bytes(b"loose")
    paths = [str(make_tar(tmp_path / "data.tar")), str(tmp_path / "notes.txt.gz"), str(folder)]
    with ratarmountcore.open(paths) as source:
        ops = LowLevelOperations(source)
        nodes = {}
        for name in (b"notes.txt", b"top", b"loose.txt", b"a"):
            nodes[name] = parse_entry(ops.lookup(ROOT_ID, name))[0]
        assert nodes[b"loose.txt"] >= STABLE_LIMIT  # a folder's file: a table id
        assert all(nodes[n] < STABLE_LIMIT for n in (b"notes.txt", b"top", b"a"))
        ops._looked_up.clear()  # as when LOOKED_UP_MAX others came between
        ops._listed_folders.clear()
        sizes = {name: parse_attr(ops.getattr(node)[16:])["size"] for name, node in nodes.items()}
        assert sizes == {b"notes.txt": 1100, b"top": 2, b"loose.txt": 5, b"a": 0}


def test_opens(ops: LowLevelOperations) -> None:
    one = lookup(ops, lookup(ops, ROOT_ID, b"a")[0], b"one")[0]
    for flags, code in ((os.O_WRONLY, errno.EROFS), (os.O_RDWR, errno.EROFS)):
        with pytest.raises(OSError) as info:
            ops.open(one, flags)
        assert info.value.errno == code
    with pytest.raises(OSError) as info:
        ops.open(lookup(ops, ROOT_ID, b"a")[0], os.O_RDONLY)
    assert info.value.errno == errno.EISDIR
    handle, flags, _ = struct.unpack("=QII", ops.open(one, os.O_RDONLY))
    assert handle and flags & 2  # FOPEN_KEEP_CACHE
    buffer = bytearray(4)
    assert ops.read(one, handle, 3, memoryview(buffer)) == 4
    ops.release(handle)
    with pytest.raises(OSError) as info:
        ops.read(one, handle, 0, memoryview(buffer))
    assert info.value.errno == errno.EBADF
    ops.init(no_open_supported=True)
    with pytest.raises(OSError) as info:
        ops.open(one, os.O_RDONLY)
    assert info.value.errno == errno.ENOSYS


@pytest.mark.parametrize("api", ["low", "high"])
def test_both_fuse_apis_serve_the_same_tree(mounter: Mounter, tmp_path: Path, api: str) -> None:
    archive = make_tar(tmp_path / "data.tar")
    mnt = mounter.mount(archive, extra=["--fuse-api", api])
    assert sorted(os.listdir(mnt)) == ["a", "b", "sym", "top"]
    assert sorted(os.listdir(mnt / "a")) == ["link-to-one", "one", "two"]
    assert (mnt / "a/link-to-one").read_bytes() == b"1" * 10 and (mnt / "top").read_bytes() == b"T2"
    assert os.stat(mnt / "a/one").st_ino == os.stat(mnt / "a/link-to-one").st_ino
    assert os.readlink(mnt / "sym") == "a/two"
    assert (mnt / "top.versions/1").read_bytes() == b"t"
    assert not (mnt / "missing").exists()
    mounter.unmount(mnt)


def test_high_level_only_options_fall_back(mounter: Mounter, tmp_path: Path) -> None:
    """``-o uid=`` is an option of libfuse's high-level library: the mount still honours it."""
    archive = make_tar(tmp_path / "data.tar")
    mnt = mounter.mount(archive, extra=["-o", "uid=4321"])
    assert os.stat(mnt / "a/one").st_uid == 4321
    mounter.unmount(mnt)


@pytest.mark.parametrize("threads", ["1", "2", "5"])
def test_worker_threads_can_be_chosen(mounter: Mounter, tmp_path: Path, threads: str) -> None:
    """``-o max_threads=N`` sizes the low-level loop (not a reason to fall back to the
    high-level API); with a single worker, a stat of every file of a folder (a run of lookups
    handed to the prefetcher) must not wait for a listing no thread is left to serve."""
    members = {f"d/f{i:03d}": bytes([i]) * (i + 1) for i in range(200)}
    archive = tmp_path / "data.tar"
    archive.write_bytes(tar_bytes(members))
    mnt = mounter.mount(archive, extra=["-o", f"max_threads={threads},max_idle_threads=1"])
    assert os.path.ismount(mnt)
    started = time.monotonic()
    assert [os.stat(mnt / name).st_size for name in members] == [len(data) for data in members.values()]
    assert time.monotonic() - started < 5  # a waiting lookup times out after 0.25 s, each
    assert (mnt / "d/f199").read_bytes() == members["d/f199"]
    mounter.unmount(mnt)


@pytest.mark.parametrize("value", ["0", "many", "-3"])
def test_bad_thread_counts_are_refused(value: str) -> None:
    with pytest.raises(RatarmountError, match=f"max_threads={value}"):
        loop_threads({"max_threads": value})
    with pytest.raises(RatarmountError, match=f"max_idle_threads={value}"):
        loop_threads({"max_idle_threads": value})
    assert loop_threads({}) == (default_max_threads(), default_max_threads())
    assert loop_threads({"max_threads": "7"}) == (7, 7)
    assert 2 <= default_max_threads() <= MAX_THREADS_CAP


def test_folder_versions_are_pseudo_entries(tmp_path: Path) -> None:
    """An older version of a folder (``tar -r`` of the folder again) lists empty under both
    front-ends: it must not be named by the inode number of its row (which names the folder)."""
    archive = tmp_path / "dirs.tar"
    with tarfile.open(archive, "w") as tar:
        for name in ("d", "d/f", "d"):
            info = tarfile.TarInfo(name)
            if name == "d":
                info.type = tarfile.DIRTYPE
            else:
                info.size = 1
            tar.addfile(info, io.BytesIO(b"x") if name != "d" else None)
    with ratarmountcore.open(str(archive)) as source:
        assert source.listdir("/d") == ["f"] and source.listdir("/d.versions/1") == []
        ops = LowLevelOperations(source)
        versions, _ = lookup(ops, ROOT_ID, b"d.versions")
        first, attrs = lookup(ops, versions, b"1")
        assert first >= STABLE_LIMIT and stat.S_ISDIR(attrs["mode"])
        assert [r[0] for r in list_all(ops, first, plus=True, size=4096)] == [b".", b".."]
        folder, _ = lookup(ops, ROOT_ID, b"d")
        assert folder < STABLE_LIMIT
        assert [r[0] for r in list_all(ops, folder, plus=True, size=4096)] == [b".", b"..", b"f"]


def test_a_folder_source_resolves_an_archive_member_once_per_lookup(tmp_path: Path) -> None:
    """In a folder of archives (``-r``) the OPEN and GETATTR after a member's LOOKUP use the entry
    the lookup found (an archive member cannot change under its node id); the folder's own files
    may change, so they are looked up again."""
    folder = tmp_path / "folder"
    folder.mkdir()
    make_tar(folder / "data.tar")
    (folder / "plain.txt").write_bytes(b"plain")
    with ratarmountcore.open(str(folder), options=ratarmountcore.OpenOptions(recursive=True)) as source:
        ops = LowLevelOperations(source)
        ops.init(no_open_supported=False)
        looked_up = recorded_lookups(source)
        archive = parse_entry(ops.lookup(ROOT_ID, b"data.tar"))[0]
        a = parse_entry(ops.lookup(archive, b"a"))[0]
        looked_up.clear()
        one, timeout, attrs = parse_entry(ops.lookup(a, b"one"))
        assert timeout == TIMEOUT and attrs["size"] == 10 and looked_up == ["/data.tar/a/one"]
        handle = struct.unpack("=QII", ops.open(one, os.O_RDONLY))[0]
        assert parse_attr(ops.getattr(one)[16:])["size"] == 10
        buffer = bytearray(16)
        assert ops.read(one, handle, 0, memoryview(buffer)) == 10 and bytes(buffer[:10]) == b"1" * 10
        ops.release(handle)
        assert looked_up == ["/data.tar/a/one"]
        plain, timeout, _ = parse_entry(ops.lookup(ROOT_ID, b"plain.txt"))
        assert timeout == 1
        looked_up.clear()
        ops.release(struct.unpack("=QII", ops.open(plain, os.O_RDONLY))[0])
        assert looked_up == ["/plain.txt"]  # looked at again: it may have changed


def test_runs_of_lookups_are_answered_from_whole_folder_replies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of lookups in one folder (a stat of every file) makes the replies of the whole folder
    at once: later lookups there, misses included, never reach the source, and every answer is
    the one an entry-by-entry lookup gives (pseudo entries too). Large folders stay uncached."""
    from ratarmount import lowlevel_ops

    monkeypatch.setattr(lowlevel_ops, "REPLY_FOLDER_MAX", 30)
    archive = tmp_path / "many.tar"
    with tarfile.open(archive, "w", format=tarfile.GNU_FORMAT) as tar:
        names = [f"d/f{i}" for i in range(25)] + ["d/f0", "d/caf\udce9"] + [f"big/g{i}" for i in range(40)]
        for i, name in enumerate(names):
            info = tarfile.TarInfo(name)
            data = f"{name}#{i}".encode("utf-8", "surrogateescape")
            info.size = len(data)
            info.uid, info.gid, info.mode, info.mtime = 1000 + i, 2000 + i, 0o640 + i % 8, 1_000_000_000.5 + i
            tar.addfile(info, io.BytesIO(data))
    source = ratarmountcore.open(str(archive))
    reference = LowLevelOperations(ratarmountcore.open(str(archive)))
    ops = LowLevelOperations(source)
    ops.init(no_open_supported=False)
    asked = recorded_lookups(source)
    for folder, count in ((b"d", 25), (b"big", 40)):
        folder_node = lookup(ops, ROOT_ID, folder)[0]
        reference_node = lookup(reference, ROOT_ID, folder)[0]
        prefix = b"f" if folder == b"d" else b"g"
        raw_names = [prefix + b"%d" % i for i in range(count)] + [b"missing"]
        if folder == b"d":
            raw_names += [b"caf\xe9", b"f0.versions"]
        asked.clear()
        for name in raw_names:
            got = ops.lookup(folder_node, name)
            assert got == reference._lookup_slow(reference_node, name)[0], name  # (entry by entry)
        cached = ops._replies.get(folder_node)
        if folder == b"d":
            assert cached is not None and cached is not lowlevel_ops._NOT_CACHED
            # The first lookup (entry by entry) and the listing of the folder; then only the
            # pseudo entry is asked for.
            assert len([p for p in asked if not p.endswith(".versions")]) == 2
            node = parse_entry(ops.lookup(folder_node, b"f3"))[0]
            view = memoryview(bytearray(100))
            count_read = ops.read(node, 0, 0, view)
            assert bytes(view[:count_read]) == b"d/f3#3"
        else:
            assert cached is lowlevel_ops._NOT_CACHED  # more entries than REPLY_FOLDER_MAX
            assert len([p for p in asked if p.startswith("/big/")]) == len(raw_names)
    source.close()
    reference.source.close()


def list_by_node(
    ops: LowLevelOperations, node: int, plus: bool, size: int, offset: int = 0, full: bool = True
) -> List[Tuple[bytes, int, int, Dict[str, int]]]:
    """Like ``list_all`` for a kernel that does not open folders: pages asked by node id
    (``full``: as asked by our prefetcher, else by any other process)."""
    records = []
    while True:
        page = ops.readdir(node, 0, size, offset, plus, full)
        if not page:
            return records
        parsed = parse_page(page, plus)
        assert [r[1] for r in parsed] == list(range(offset + 1, offset + 1 + len(parsed)))
        records += parsed
        offset = parsed[-1][1]


@pytest.mark.parametrize("plus", [True, False])
def test_folders_are_listed_by_node_without_opendir(tmp_path: Path, plus: bool) -> None:
    """When the kernel offers it, OPENDIR is answered ENOSYS once and folders are listed by node
    id: the pages are the same as through a handle, the kept listing goes with the last page,
    and a page asked after the listing was dropped (a kernel re-reading, many folders at once)
    is made again from the index, the same."""
    from ratarmount import lowlevel_ops

    archive = tmp_path / "folder.tar"
    with tarfile.open(archive, "w", format=tarfile.GNU_FORMAT) as tar:
        for i in range(300):
            info = tarfile.TarInfo(f"d/entry-{i:04d}-{'n' * (i % 50)}")
            info.size = i
            tar.addfile(info, io.BytesIO(b"x" * i))
    with ratarmountcore.open(str(archive)) as source:
        reference = LowLevelOperations(source)
        reference.init(no_open_supported=True)
        ops = LowLevelOperations(source)
        ops.init(no_open_supported=True, no_opendir_supported=True)
        folder = lookup(ops, ROOT_ID, b"d")[0]
        with pytest.raises(OSError) as info:
            ops.opendir(folder)
        assert info.value.errno == errno.ENOSYS
        with pytest.raises(OSError) as info:
            ops.opendir(lookup(ops, folder, b"entry-0001-n")[0])
        assert info.value.errno == errno.ENOTDIR
        expected = list_all(reference, folder, plus, size=4096)
        assert len(expected) == 302
        assert list_by_node(ops, folder, plus, size=4096) == expected
        assert not ops._node_listings  # dropped with the empty page after the last
        first = ops.readdir(folder, 0, 4096, 0, plus)
        ops._node_listings.clear()
        offset = parse_page(first, plus)[-1][1]
        assert parse_page(ops.readdir(folder, 0, 4096, offset, plus), plus)[0][1] == offset + 1
        assert parse_page(first, plus) + list_by_node(ops, folder, plus, 4096, offset) == expected
        for node in range(lowlevel_ops.NODE_LISTINGS_MAX + 5):  # many folders half read
            ops._listing_of(folder if node == 0 else ROOT_ID, 0)
        assert len(ops._node_listings) <= lowlevel_ops.NODE_LISTINGS_MAX


@pytest.mark.parametrize("chunk", [4096, 16])
def test_listings_for_other_processes_name_files_without_inodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """A listing asked by any process but our prefetcher (``find``) gives files node id 0 and no
    attributes -- the same names, positions, inode numbers and types -- and folders their node
    ids with attributes, on every page of a large folder too. A run of lookups in such a folder
    hands it over as stale (its kernel listing is dropped before it is listed again in full)."""
    from ratarmount import lowlevel_ops

    monkeypatch.setattr(lowlevel_ops, "LISTING_CHUNK", chunk)
    archive = tmp_path / "names.tar"
    files = {f"d/f{i:03d}": b"x" * i for i in range(40)}
    files.update({f"d/sub{i}/inner": b"y" for i in range(0, 40, 7)})
    archive.write_bytes(tar_bytes(files))
    with ratarmountcore.open(str(archive)) as source:
        prefetcher = _RecordingPrefetcher()
        ops = LowLevelOperations(source, prefetcher=prefetcher)  # type: ignore[arg-type]
        ops.init(no_open_supported=True, no_opendir_supported=True)
        folder = lookup(ops, ROOT_ID, b"d")[0]
        full = list_by_node(ops, folder, plus=True, size=4096)
        assert folder not in ops._names_only
        named = list_by_node(ops, folder, plus=True, size=4096, full=False)
        assert folder in ops._names_only
        assert [(r[0], r[1]) for r in named] == [(r[0], r[1]) for r in full]
        assert len(named) == 2 + 40 + 6
        for (name, _offset, node, attrs), (_name, _offset2, full_node, full_attrs) in zip(named, full):
            if name.startswith(b"f"):
                assert node == 0 and full_node != 0
            else:  # ".", "..", and the folders, which `find` descends into
                assert (node, attrs) == (full_node, full_attrs)
        assert list_by_node(ops, folder, plus=False, size=4096, full=False) == list_by_node(ops, folder, False, 4096)
        for name in (b"f001", b"f039", b"sub7"):  # the records carry the entries' inode numbers
            assert lookup(ops, folder, name)[1]["ino"] == dirent_ino(ops, folder, name)
        assert prefetcher.stale[:1] == [folder]  # the run: the second of those lookups
        assert ops.listings_in_full  # files listed were looked up: listings carry attributes now
        assert list_by_node(ops, folder, plus=True, size=4096, full=False) == full


@pytest.mark.parametrize("size", [200, 4096, 1 << 16])
def test_packed_listings_are_the_listings_made_from_rows(tmp_path: Path, size: int) -> None:
    """A folder of files is listed from its packed records (index/dirents.py) with the same
    pages, byte for byte, as from its rows -- names that are not UTF-8, links, a hard link, pages
    cut anywhere -- and a folder with a subfolder is listed from its rows."""
    archive = tmp_path / "packed.tar"
    with tarfile.open(archive, "w", format=tarfile.GNU_FORMAT) as tar:
        for i in range(120):
            info = tarfile.TarInfo(f"d/{'n' * (i % 37)}{i:03d}" + ("\udce9" if i % 11 == 0 else ""))
            info.size = i
            tar.addfile(info, io.BytesIO(b"x" * i))
        link = tarfile.TarInfo("d/zlink")
        link.type, link.linkname = tarfile.SYMTYPE, "000"
        tar.addfile(link)
        hard = tarfile.TarInfo("d/zhard")
        hard.type, hard.linkname = tarfile.LNKTYPE, "d/n001"
        tar.addfile(hard)
        tar.addfile(tarfile.TarInfo("e/file"), io.BytesIO(b""))
        sub = tarfile.TarInfo("e/sub")
        sub.type = tarfile.DIRTYPE
        tar.addfile(sub)
    with ratarmountcore.open(str(archive)) as source:
        assert source.list_dirents("/d") is not None and source.list_dirents("/e") is None
        ops = LowLevelOperations(source)
        ops.init(no_open_supported=True, no_opendir_supported=True)
        for name in (b"d", b"e"):
            folder = lookup(ops, ROOT_ID, name)[0]
            packed = list_by_node(ops, folder, plus=True, size=size, full=False)
            assert not ops._packed  # dropped with the empty page after the last
            rows_only = LowLevelOperations(source)
            rows_only.init(no_open_supported=True, no_opendir_supported=True)
            rows_only._packed_page = lambda *_args: None  # type: ignore[method-assign]
            assert packed == list_by_node(rows_only, folder, plus=True, size=size, full=False), name
            assert len(packed) == (2 + 122 if name == b"d" else 4)
            assert all(node == 0 for _name, _offset, node, _attrs in packed[2:] if _name != b"sub")


def dirent_ino(ops: LowLevelOperations, folder: int, name: bytes) -> int:
    """The inode number of ``name`` in the plain READDIR records of ``folder`` (page by page)."""
    offset = 0
    while True:
        page = ops.readdir(folder, 0, 4096, offset, False)
        assert page, name
        position = 0
        while position < len(page):
            ino, offset, namelen, _kind = DIRENT.unpack_from(page, position)
            if page[position + DIRENT.size : position + DIRENT.size + namelen] == name:
                return int(ino)
            position += (DIRENT.size + namelen + 7) & ~7


class _RecordingPrefetcher:
    def __init__(self) -> None:
        self.requests: List[Tuple[str, int]] = []
        self.stale: List[int] = []

    def request(self, path: str, entries: int, done: object = None, stale: int = 0, hold: object = None) -> bool:
        self.requests.append((path, entries))
        self.stale.append(stale)
        return True

    def has_listed(self, path: str) -> bool:
        return any(requested == path for requested, _entries in self.requests)

    def close(self) -> None:
        self.requests.append(("closed", 0))


def _with_recording_prefetcher(source: "ratarmountcore.MountSource") -> Tuple[LowLevelOperations, _RecordingPrefetcher]:
    prefetcher = _RecordingPrefetcher()
    ops = LowLevelOperations(source, prefetcher=prefetcher)  # type: ignore[arg-type]
    ops.init(no_open_supported=True)
    return ops, prefetcher


def test_lookup_runs_hand_the_folder_to_the_prefetcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lookups in a row in one folder (a stat of every file) hand that folder, with its size,
    to the prefetcher once per run; random opens, which alternate between a folder and its
    parent, never do; a folder too large to make replies for is still counted (up to a limit)."""
    from ratarmount import lowlevel_ops

    monkeypatch.setattr(lowlevel_ops, "REPLY_FOLDER_MAX", 8)
    archive = tmp_path / "runs.tar"
    files = {**{f"a/f{i}": b"a" for i in range(10)}, **{f"b/g{i}": b"b" for i in range(3)}, "c/h": b"c"}
    archive.write_bytes(tar_bytes(files))
    with ratarmountcore.open(str(archive)) as source:
        ops, prefetcher = _with_recording_prefetcher(source)
        a, b = (lookup(ops, ROOT_ID, name)[0] for name in (b"a", b"b"))
        assert prefetcher.requests == [("/", 3)]  # a run in the root, two lookups long
        for folder, name in ((a, b"f0"), (b, b"g0"), (a, b"f1"), (b, b"g1")):  # alternating
            lookup(ops, folder, name)
            lookup(ops, ROOT_ID, b"c")
        assert prefetcher.requests == [("/", 3)]
        for name in (b"f2", b"f3", b"missing", b"f4"):
            lookup(ops, a, name)
        # 10 > REPLY_FOLDER_MAX: counted all the same; then its parent (the prefetcher drops
        # what it listed already)
        assert prefetcher.requests == [("/", 3), ("/a", 10), ("/", 3)]
        ops.destroy()
        assert prefetcher.requests[-1] == ("closed", 0)
        # A run in a folder whose replies were not made yet: the listing the prefetcher asks for
        # next is made from the rows the run just read, and equals one made from the index.
        ops = LowLevelOperations(source, prefetcher=_RecordingPrefetcher())  # type: ignore[arg-type]
        ops.init(no_open_supported=True)
        a = lookup(ops, ROOT_ID, b"a")[0]
        lookup(ops, a, b"f0")
        lookup(ops, a, b"f1")
        assert list(ops._rows_ready) == [a]
        reference = LowLevelOperations(source)
        assert list_all(ops, a, plus=True, size=4096) == list_all(reference, a, plus=True, size=4096)
        assert not ops._rows_ready


def test_a_run_in_a_folder_listed_before_lists_it_again(tmp_path: Path) -> None:
    """Lookups that come in a run in a folder the prefetcher listed already mean that the
    kernel dropped what the listing linked (memory pressure, drop_caches): a second pass over
    the tree hands the folder over again, as stale (its cached listing dropped first), once per
    run. Runs of lookups of names that do not exist (which no listing links) never ask for it
    again."""
    archive = tmp_path / "again.tar"
    archive.write_bytes(tar_bytes({f"{d}/f{i}": d.encode() for d in "ab" for i in range(6)}))
    with ratarmountcore.open(str(archive)) as source:
        ops, prefetcher = _with_recording_prefetcher(source)
        a, b = (lookup(ops, ROOT_ID, name)[0] for name in (b"a", b"b"))

        def handed_over() -> List[Tuple[str, int]]:
            """The requests for the folders: (path, stale node id)."""
            pairs = zip(prefetcher.requests, prefetcher.stale)
            return [(path, stale) for (path, _entries), stale in pairs if path != "/"]

        def run(folder: int, names: Sequence[bytes]) -> None:
            lookup(ops, ROOT_ID, b"a" if folder == a else b"b")
            for name in names:
                lookup(ops, folder, name)

        run(a, [b"f0", b"f1", b"f2"])  # the first pass: each folder listed, nothing stale
        run(b, [b"f0", b"f1", b"f2"])
        assert handed_over() == [("/a", 0), ("/b", 0)]
        run(a, [b"f3", b"f4", b"f5"])  # the kernel forgot them: listed again, once a run
        run(b, [b"f3", b"f4", b"f5"])
        assert handed_over() == [("/a", 0), ("/b", 0), ("/a", a), ("/b", b)]
        for folder in (a, b):  # misses in a listed folder: not again
            lookup(ops, ROOT_ID, b"a" if folder == a else b"b")
            for name in (b"x1", b"x2", b"x3"):
                assert lookup(ops, folder, name)[0] == 0  # (a negative entry)
        # (as before: handed over not stale, which the prefetcher drops for a folder it listed)
        assert handed_over()[4:] == [("/a", 0), ("/b", 0)]


def test_folders_are_counted_without_loading_them_whole(tmp_path: Path) -> None:
    archive = tmp_path / "wide.tar"
    archive.write_bytes(tar_bytes({f"wide/f{i:03d}": b"w" for i in range(300)}))
    with ratarmountcore.open(str(archive)) as source:
        assert [name for name, _ in source.list_entries_upto("/wide", 5)] == ["f000", "f001", "f002", "f003", "f004"]
        assert len(source.list_entries_upto("/wide", 1000) or []) == 300
        assert [name for name, _ in source.list_entries_upto("/", 5) or []] == ["wide"]
        assert source.list_entries_upto("/wide/f001", 5) is None and source.list_entries_upto("/nope", 5) is None


@pytest.mark.parametrize("union", [False, True])
def test_random_opens_tell_the_source_what_will_be_read(tmp_path: Path, union: bool) -> None:
    """A file looked up right after a lookup in another folder (a random open: folder, then
    file) is handed to ``will_read``; lookups in a row in one folder (a stat of every file)
    and folders are not. Unions pass the hint on to the archive that holds the file."""
    archive = tmp_path / "hints.tar"
    archive.write_bytes(tar_bytes({"a/f0": b"0", "a/f1": b"1", "a/f2": b"2", "c/h": b"h"}))
    paths = [str(archive), str(make_tar(tmp_path / "other.tar"))] if union else str(archive)
    with ratarmountcore.open(paths) as source:
        hinted: List[Tuple[int, int]] = []
        archive_source = source.sources[0] if union else source  # type: ignore[attr-defined]
        original = archive_source.will_read

        def recording(info: "ratarmountcore.FileInfo") -> None:
            hinted.append((info.locator.offset, info.size))
            original(info)

        archive_source.will_read = recording
        ops = LowLevelOperations(source)
        ops.init(no_open_supported=True)
        a = lookup(ops, ROOT_ID, b"a")[0]
        lookup(ops, a, b"f0")  # random open of a/f0
        c = lookup(ops, ROOT_ID, b"c")[0]
        lookup(ops, c, b"h")  # random open of c/h
        lookup(ops, a, b"f1")  # a lookup in another folder than the last one
        lookup(ops, a, b"f2")  # the same folder again: a run, no hint
        lookup(ops, a, b"missing")
        expected = [archive_source.lookup(p).locator for p in ("/a/f0", "/c/h", "/a/f1")]
        assert hinted == [(locator.offset, 1) for locator in expected]

        # The hint waits for the reply: ``lookup`` only makes it, ``after_reply`` gives it, once.
        hinted.clear()
        parse_entry(ops.lookup(c, b"h"))
        assert hinted == []
        ops.after_reply()
        ops.after_reply()
        assert hinted == [(archive_source.lookup("/c/h").locator.offset, 1)]
        hinted.clear()

        # While another worker answers a read (several readers at once), a random open is not
        # hinted: the disk has work in flight anyway. Alone again, it is.
        reading, release = threading.Event(), threading.Event()
        unopened = ops.files.read_unopened

        def slow_read(info: "ratarmountcore.FileInfo", offset: int, view: memoryview) -> int:
            reading.set()
            release.wait(10)
            return unopened(info, offset, view)

        ops.files.read_unopened = slow_read  # type: ignore[method-assign]
        node_h = lookup(ops, c, b"h")[0]
        hinted.clear()
        reader = threading.Thread(target=ops.read, args=(node_h, 0, 0, memoryview(bytearray(4))))
        reader.start()
        assert reading.wait(10)
        lookup(ops, a, b"f0")  # a random open (the last lookup was in c)
        release.set()
        reader.join(10)
        assert hinted == [] and not ops._busy
        lookup(ops, c, b"h")
        assert hinted == [(archive_source.lookup("/c/h").locator.offset, 1)]


class _ListingPrefetcher:
    """Lists the folder at once through ``ops`` (as the kernel would, asked by the prefetcher's
    thread) and tells the waiting lookup it is done."""

    def __init__(self) -> None:
        self.ops: LowLevelOperations
        self.node = 0
        self.listed: List[Tuple[bytes, int, int, Dict[str, int]]] = []
        self.waited: List[bool] = []

    def request(self, path: str, entries: int, done: object = None, stale: int = 0, hold: object = None) -> bool:
        if path != "/":
            self.waited.append(done is not None)
            self.listed = list_by_node(self.ops, self.node, plus=True, size=1 << 16)
            if done is not None:
                done.set()  # type: ignore[attr-defined]
        return True

    def has_listed(self, path: str) -> bool:
        return False

    def close(self) -> None:
        pass


def _run_folder(tmp_path: Path) -> ratarmountcore.MountSource:
    archive = tmp_path / "run.tar"
    archive.write_bytes(tar_bytes({f"a/f{i}": b"a" * i for i in range(6)}))
    return ratarmountcore.open(str(archive))


def _listing_ops(source: ratarmountcore.MountSource, parallel: bool) -> Tuple[LowLevelOperations, _ListingPrefetcher]:
    prefetcher = _ListingPrefetcher()
    ops = LowLevelOperations(source, prefetcher=prefetcher)  # type: ignore[arg-type]
    ops.init(no_open_supported=True, no_opendir_supported=True)
    ops.parallel_dirops = parallel
    prefetcher.ops = ops
    return ops, prefetcher


@pytest.mark.parametrize(
    ("parallel", "other_waits", "one_worker"),
    [(True, False, False), (False, False, False), (True, True, False), (True, False, True)],
)
def test_the_lookup_that_hands_a_folder_over_waits_for_its_listing(
    tmp_path: Path, parallel: bool, other_waits: bool, one_worker: bool
) -> None:
    """With parallel lookups and listings negotiated, the second lookup of a run waits for the
    listing of its folder, and that listing names its entry without a node id (the kernel would
    wait for the lookup before linking it: a deadlock); every other entry carries its own. It
    does not wait while another lookup waits (several processes in several folders would wait
    behind each other's listings), nor without parallel folder operations (the kernel would
    hold the listing), nor with a single worker thread (none would be left to serve it)."""
    waits = parallel and not other_waits and not one_worker
    with _run_folder(tmp_path) as source:
        ops, prefetcher = _listing_ops(source, parallel)
        ops.lookups_may_wait = not one_worker
        a = lookup(ops, ROOT_ID, b"a")[0]
        prefetcher.node = a
        if other_waits:
            ops._waiting[ROOT_ID] = b"elsewhere"
        lookup(ops, a, b"f0")
        assert lookup(ops, a, b"f1")[1]["size"] == 1
        assert prefetcher.waited == [waits]
        ops._waiting.pop(ROOT_ID, None)
        nodes = {name: node for name, _offset, node, _attrs in prefetcher.listed}
        assert set(nodes) == {b".", b".."} | {f"f{i}".encode() for i in range(6)}
        assert (nodes[b"f1"] == 0) is waits
        assert all(node > 0 for name, node in nodes.items() if name not in (b"f1", b".", b".."))
        assert not ops._waiting
        # A listing made later names every entry again.
        again = list_by_node(ops, a, True, 1 << 16)
        assert all(node > 0 for name, _o, node, _a in again if name not in (b".", b".."))


def test_a_refused_hand_over_leaves_the_waiting_lookup_alone(tmp_path: Path) -> None:
    """Another process's run in a folder whose listing a lookup already waits for is refused by
    the prefetcher; it must not clear that lookup's place in the listing (the kernel would then
    wait for the lookup, and the lookup for the listing)."""
    archive = tmp_path / "run.tar"
    archive.write_bytes(tar_bytes({f"a/f{i}": b"a" for i in range(6)}))
    with ratarmountcore.open(str(archive)) as source:
        prefetcher = _RecordingPrefetcher()
        prefetcher.request = lambda path, entries, done=None, stale=0, hold=None: False  # type: ignore[method-assign]
        ops = LowLevelOperations(source, prefetcher=prefetcher)  # type: ignore[arg-type]
        ops.init(no_open_supported=True, no_opendir_supported=True)
        ops.parallel_dirops = True
        a = lookup(ops, ROOT_ID, b"a")[0]
        ops._waiting[a] = b"f5"  # a lookup of f5 waits for the listing of a
        lookup(ops, a, b"f0")
        lookup(ops, a, b"f1")  # a run: handed over, refused
        assert ops._waiting == {a: b"f5"}
        del ops._waiting[a]  # (no other waits: this one would, but the hand-over is refused)
        ops._handed_over = 0
        lookup(ops, a, b"f2")
        lookup(ops, a, b"f3")
        assert ops._waiting == {}


def test_an_entry_named_by_the_table_is_left_out_for_its_waiting_lookup_too(tmp_path: Path) -> None:
    """Entries without an inode number of their own get node ids from the table when a page is
    served; the one a lookup waits on must get none either (and no reference counted)."""
    with _run_folder(tmp_path) as source:
        # The entry of size 1 has no inode number of its own (as a folder source's in a union).
        def numberless(info: Optional[FileInfo]) -> Optional[FileInfo]:
            return info._replace(ino=0) if info is not None and info.size == 1 else info

        lookup_of, entries_of, rows_of = source.lookup, source.list_entries, source.list_stat_rows_after
        source.lookup = lambda path: numberless(lookup_of(path))  # type: ignore[method-assign]
        source.list_entries = lambda path: [(n, numberless(i)) for n, i in entries_of(path) or ()]  # type: ignore[method-assign]
        source.list_stat_rows_after = (
            lambda path, after, limit: [  # type: ignore[method-assign]
                row[:7] + (0,) + row[8:] if row[2] == 1 else row for row in rows_of(path, after, limit) or ()
            ]
        )
        ops, prefetcher = _listing_ops(source, True)
        a = lookup(ops, ROOT_ID, b"a")[0]
        prefetcher.node = a
        lookup(ops, a, b"f0")
        f1 = lookup(ops, a, b"f1")[0]  # named by the table, counted once
        assert f1 >= ops.nodes.first and prefetcher.waited == [True]
        nodes = {name: node for name, _offset, node, _attrs in prefetcher.listed}
        assert nodes[b"f1"] == 0 and nodes[b"f2"] > 0
        ops.forget(f1, 1)  # the one count the lookup gave: gone from the table
        with pytest.raises(StaleNodeError):
            ops.nodes.path(f1)


@pytest.mark.parametrize(
    "mode", [stat.S_IFREG | 0o644, stat.S_IFDIR | 0o755, stat.S_IFLNK | 0o777, stat.S_IFCHR | 0o600]
)
def test_a_plain_listing_record_is_the_tail_of_the_plus_record(mode: int) -> None:
    """A READDIR page is cut from the READDIRPLUS records (``readdir`` without ``plus``): the
    plain record must be exactly what ``dirent`` makes, for every name length's padding."""
    from ratarmount import kernel_abi as abi

    for length in range(1, 20):
        name = bytes(range(65, 65 + length))
        plus = abi.direntplus_of(7, TIMEOUT, 3 + length, name, 1234, mode, 99, 10**18 + 5, 1, 2, 3, 0, 1)
        assert len(plus) % 8 == 0
        assert plus[abi.ENTRY_SIZE :] == abi.dirent(1234, 3 + length, name, mode)


@pytest.mark.parametrize("from_run", [False, True])
def test_folders_named_in_a_listing_are_resolved_by_path(tmp_path: Path, from_run: bool) -> None:
    """A folder the kernel got from a listing (``find`` lists it next; a random open looks a
    file up in it) is resolved by its path from the listing, not by a query for its inode
    number (on a cold index, a read of the table B-tree per folder) -- also when the listing
    was made from the entries just read for a run of lookups. A remembered path that no
    longer names that node falls back to the query."""
    archive = tmp_path / "folders.tar"
    archive.write_bytes(tar_bytes({f"d{i}/f": bytes([i]) for i in range(5)}))
    with ratarmountcore.open(str(archive)) as source:
        ops = LowLevelOperations(source)
        ops.init(no_open_supported=True, no_opendir_supported=True)
        if from_run:
            ops._rows_ready[ROOT_ID] = source.list_stat_rows_after("/", None, 100) or []
        nodes = {name: node for name, _offset, node, _attrs in list_by_node(ops, ROOT_ID, True, 1 << 16)}
        assert not ops._rows_ready  # (used up, when given)
        queried: List[int] = []
        by_ino = source.by_ino

        def counting(ino: int) -> object:
            queried.append(ino)
            return by_ino(ino)

        source.by_ino = counting  # type: ignore[method-assign]
        listed = list_by_node(ops, nodes[b"d3"], True, 1 << 16)
        assert [name for name, *_ in listed] == [b".", b"..", b"f"]
        looked_up = recorded_lookups(source)
        node = lookup(ops, nodes[b"d4"], b"f")[0]
        assert looked_up == ["/d4/f"]  # (the folder's path from the listing: no query for it)
        assert ops.read(node, 0, 0, memoryview(bytearray(8))) == 1
        assert queried == []
        ops._listed_folders[nodes[b"d2"]] = "/d1"  # (as if the tree had changed: it cannot)
        assert [name for name, *_ in list_by_node(ops, nodes[b"d2"], True, 1 << 16)] == [b".", b"..", b"f"]
        assert queried == [nodes[b"d2"]]


@pytest.mark.parametrize(("minor", "given"), [(14, True), (12, True), (10, False)])
def test_high_level_worker_threads_only_where_libfuse_knows_the_option(
    monkeypatch: pytest.MonkeyPatch, minor: int, given: bool
) -> None:
    """The high-level front-end gets one worker per core too, but only from libfuse 3.12 on:
    older libfuse 3 (Ubuntu 22.04 ships 3.10) fails a mount with an unknown ``max_threads``.
    A user's own ``-o max_threads`` always goes through."""
    import types

    from ratarmount import fuse_compat
    from ratarmount.cli import MountOptions
    from ratarmount.mount import fuse_kwargs
    from ratarmountcore.options import OpenOptions

    monkeypatch.setattr(fuse_compat, "fuse", types.SimpleNamespace(fuse_version_major=3, fuse_version_minor=minor))
    options = MountOptions(sources=["/a.tar"], mountpoint="/mnt", open_options=OpenOptions())
    kwargs = fuse_kwargs(options, "a.tar")
    assert ("max_threads" in kwargs) is given and ("max_idle_threads" in kwargs) is given
    if given:
        assert kwargs["max_threads"] == str(default_max_threads())
    own = MountOptions(
        sources=["/a.tar"], mountpoint="/mnt", open_options=OpenOptions(), fuse_options={"max_threads": "9"}
    )
    assert fuse_kwargs(own, "a.tar")["max_threads"] == "9"


MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
40 27 0:50 / /lustre rw,relatime - lustre 10.0.0.1@tcp:/scratch rw,flock
41 40 0:51 / /lustre/home/me/local\\040copy rw - ext4 /dev/sdb1 rw
42 27 0:52 / /nfs rw shared:7 - nfs4 server:/export rw,vers=4.2
43 27 0:53 / /data rw - ext4 /dev/sdc rw
44 27 0:54 / /data rw - fuse.sshfs me@host:/data rw
"""


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/lustre/scratch/imagenet.tar", "lustre"),
        ("/lustre", "lustre"),
        ("/lustre/home/me/local copy/a.tar", "ext4"),  # a mount below, its name escaped
        ("/lustrex/a.tar", "ext4"),  # a prefix of the name only
        ("/nfs/x.tar.gz", "nfs4"),  # optional fields before the separator
        ("/data/a.tar", "fuse.sshfs"),  # mounted over: the later mount wins
        ("/home/a.tar", "ext4"),
    ],
)
def test_file_system_type_of_an_archive(path: str, kind: str) -> None:
    from ratarmountcore.io.mountinfo import file_system_type

    assert file_system_type(path, MOUNTINFO) == kind


def test_archives_on_network_file_systems_get_more_workers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A worker waits in ``pread`` for as long as a cold read takes: on a parallel or network
    file system the default leaves room for more reads in flight; an explicit -o wins."""
    from ratarmount import workers

    monkeypatch.setattr(workers, "usable_cores", lambda: 2)
    local = str(tmp_path / "a.tar")
    assert workers.default_max_threads([local]) == 2
    monkeypatch.setattr(workers, "file_system_type", lambda path, _m=None: "lustre" if "lustre" in path else "ext4")
    assert workers.default_max_threads([local, "/lustre/b.tar"]) == workers.NETWORK_MIN_THREADS
    assert workers.loop_threads({}, ["/lustre/b.tar"]) == (workers.NETWORK_MIN_THREADS,) * 2
    assert workers.loop_threads({"max_threads": "3"}, ["/lustre/b.tar"]) == (3, 3)
    monkeypatch.setattr(workers, "usable_cores", lambda: 64)
    assert workers.default_max_threads(["/lustre/b.tar"]) == workers.MAX_THREADS_CAP


class _HoldingPrefetcher:
    """Takes every folder; those of ``held`` wait until the test lists them itself (as the
    prefetcher's threads would), the others count as listed at once."""

    def __init__(self, held: Tuple[str, ...]) -> None:
        self.held = held
        self.requests: Dict[str, Tuple[int, threading.Event, int]] = {}

    def request(
        self,
        path: str,
        entries: int,
        done: Optional[threading.Event] = None,
        stale: int = 0,
        hold: object = None,
    ) -> bool:
        assert done is not None or not path.startswith(self.held)
        self.requests[path] = (entries, done or threading.Event(), stale)
        if done is not None and not path.startswith(self.held):
            done.set()
        return True

    def has_listed(self, path: str) -> bool:
        return path in self.requests

    def close(self) -> None:
        pass


def test_folders_are_listed_ahead_of_a_walk(tmp_path: Path) -> None:
    """Runs of lookups in d0, then d1 (a walk): d2-d4 are handed over with their rows before
    the walk gets there. A lookup in d2 waits for its listing, which leaves that one name
    without a node id and reuses the rows; the walk in d2 moves the window to d5."""
    files = {f"d{f}/f{i}": b"x" * (f * 10 + i) for f in range(6) for i in range(4)}
    archive = tmp_path / "walk.tar"
    archive.write_bytes(tar_bytes(files))
    with ratarmountcore.open(str(archive)) as source:
        prefetcher = _HoldingPrefetcher(held=("/d2", "/d3", "/d4", "/d5"))
        ops = LowLevelOperations(source, prefetcher=prefetcher)  # type: ignore[arg-type]
        ops.init(no_open_supported=True, no_opendir_supported=True)
        ops.parallel_dirops = True
        nodes = [lookup(ops, ROOT_ID, f"d{f}".encode())[0] for f in range(6)]
        lookup(ops, nodes[0], b"f0")
        lookup(ops, nodes[0], b"f1")  # a run, but the first: nothing ahead
        assert not any(path.startswith("/d") and path != "/d0" for path in prefetcher.requests)
        lookup(ops, nodes[1], b"f0")
        lookup(ops, nodes[1], b"f1")
        assert sorted(p for p in prefetcher.requests if p not in ("/", "/d0", "/d1")) == ["/d2", "/d3", "/d4"]
        assert prefetcher.requests["/d2"][:3:2] == (4, 0)  # (no listing without attributes to drop)
        assert ops._ahead is not None and ops._ahead.pending[nodes[2]].end == 2 + 4

        rows_read: List[str] = []
        real_rows = source.list_stat_rows_after

        def counted(path: str, after: Optional[bytes], limit: int):  # type: ignore[no-untyped-def]
            rows_read.append(path)
            return real_rows(path, after, limit)

        source.list_stat_rows_after = counted  # type: ignore[method-assign]
        replies: List[Dict[str, int]] = []
        walker = threading.Thread(target=lambda: replies.append(lookup(ops, nodes[2], b"f3")[1]))
        walker.start()
        for _ in range(200):  # until the lookup waits for the listing
            if ops._ahead is not None and b"f3" in ops._ahead.pending[nodes[2]].names:
                break
            time.sleep(0.005)
        listed = {name: node for name, _offset, node, _attrs in list_by_node(ops, nodes[2], True, 1 << 16)}
        assert listed[b"f3"] == 0  # the kernel would wait for the lookup to link it
        assert all(listed[f"f{i}".encode()] > 0 for i in range(3))
        assert not walker.is_alive() or not replies  # (still waiting, unless the wait ran out)
        prefetcher.requests["/d2"][1].set()
        walker.join(10)
        assert replies and replies[0]["size"] == 23
        assert rows_read == ["/d5"]  # the listing of d2 reused its rows; d5 read to go ahead
        assert "/d5" in prefetcher.requests
        # The next lookup in d2 (the walk went on without waiting) is an ordinary one.
        assert lookup(ops, nodes[2], b"f0")[1]["size"] == 20
        assert ops._ahead is not None and nodes[2] not in ops._ahead.pending


def _walked_into_d1(
    source: ratarmountcore.MountSource, folders: int
) -> Tuple[LowLevelOperations, _HoldingPrefetcher, List[int]]:
    """A front-end whose prefetcher holds d2-d4, after runs of lookups in d0, then d1 (a walk),
    and the node ids of d0 ... d(``folders`` - 1)."""
    prefetcher = _HoldingPrefetcher(held=("/d2", "/d3", "/d4"))
    ops = LowLevelOperations(source, prefetcher=prefetcher)  # type: ignore[arg-type]
    ops.init(no_open_supported=True, no_opendir_supported=True)
    ops.parallel_dirops = True
    nodes = [lookup(ops, ROOT_ID, f"d{f}".encode())[0] for f in range(folders)]
    for f in (0, 1):
        lookup(ops, nodes[f], b"f0")
        lookup(ops, nodes[f], b"f1")
    return ops, prefetcher, nodes


def test_a_lookup_in_a_folder_listed_ahead_waits_only_when_no_other_lookup_waits(tmp_path: Path) -> None:
    """Two workers: a second waiting lookup would leave none to serve the listings waited for."""
    files = {f"d{f}/f{i}": b"x" * (f * 10 + i) for f in range(5) for i in range(4)}
    archive = tmp_path / "walk.tar"
    archive.write_bytes(tar_bytes(files))
    with ratarmountcore.open(str(archive)) as source:
        ops, prefetcher, nodes = _walked_into_d1(source, 5)
        assert ops._ahead is not None and nodes[2] in ops._ahead.pending

        class Recording(threading.Event):
            waits = 0

            def wait(self, timeout: Optional[float] = None) -> bool:
                Recording.waits += 1
                return super().wait(0)

        ops._ahead.pending[nodes[2]].done = Recording()
        ops._waiting[nodes[0]] = b"elsewhere"  # another lookup waits for a listing
        assert lookup(ops, nodes[2], b"f3")[1]["size"] == 23
        assert Recording.waits == 0 and ops._ahead_waits == 0
        assert nodes[2] not in ops._ahead.pending  # (answered: the listing may name it again)
        del ops._waiting[nodes[0]]
        ops._ahead.pending[nodes[3]].done = Recording()
        lookup(ops, nodes[3], b"f0")  # nobody else waits: this one does
        assert Recording.waits == 1 and ops._ahead_waits == 0


def test_folders_too_large_are_not_listed_ahead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A walk into folders larger than ``FOLDER_MAX`` lists none of them ahead (the kernel would
    cache an inode for each of their entries), nor any folder after the first such one."""
    from ratarmount import lowlevel_ops

    files = {f"d{f}/f{i}": b"x" for f in range(5) for i in range(3 if f != 3 else 6)}
    archive = tmp_path / "walk.tar"
    archive.write_bytes(tar_bytes(files))
    monkeypatch.setattr(lowlevel_ops, "FOLDER_MAX", 4)
    with ratarmountcore.open(str(archive)) as source:
        ops, prefetcher, nodes = _walked_into_d1(source, 5)
        assert sorted(p for p in prefetcher.requests if p.startswith("/d") and p > "/d1") == ["/d2"]
        assert ops._ahead is not None and set(ops._ahead.pending) == {nodes[2]}

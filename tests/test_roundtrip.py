"""Property tests: generated trees -> archive (tarfile ustar/gnu/pax, GNU tar gnu/pax) -> what
ratarmount shows (Python API and a real FUSE mount) == what ``tar -x`` extracts.

The trees have nested and empty directories, files with random bytes (empty ones and sizes around
block boundaries), names above 100 bytes and paths above 255 bytes, non-ASCII and non-UTF-8
names, symlinks (dangling, absolute, long, non-UTF-8 targets), hard links, files with holes
(archived sparse by GNU tar), odd permissions (0o000, setuid, sticky, ...), large owners and
varied (also fractional and negative) mtimes.
"""

from __future__ import annotations

import functools
import os
import stat
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import pytest
from conftest import fuse_available, lazy_unmount, run_ratarmount
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tarcompare import (
    FRESH,
    IS_ROOT,
    compare_trees,
    gnu_tar_create,
    implicit_dirs_of,
    snapshot_dir,
    snapshot_source,
    tar_extract,
)

import ratarmountcore
from ratarmountcore.index import dirents
from ratarmountcore.sources.base import MountSource

# The reference is tar -x restoring owners, modes (setuid, 0o000 files readable) and devices:
# that needs root.
pytestmark = pytest.mark.skipif(not IS_ROOT, reason="comparing with tar -x needs root")

settings.register_profile(
    "roundtrip-api",
    max_examples=int(os.environ.get("ROUNDTRIP_EXAMPLES", "35")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile(
    "roundtrip-fuse",
    max_examples=int(os.environ.get("ROUNDTRIP_FUSE_EXAMPLES", "8")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)

# --- tree generation -------------------------------------------------------------------------------

# "\udcXX" are undecodable bytes (surrogateescape): they make names that are not UTF-8.
NAME_CHARS = list("abcxyzABC0129_-.,+=~ #'%@") + [
    "é",
    "ß",
    "ü",
    "日",
    "本",
    "Ω",
    "\U0001f600",
    "\udcff",
    "\udc80",
    "\udce9",
    "\udcfe",
]
FILE_MODES = [0o644, 0o600, 0o640, 0o755, 0o000, 0o444, 0o4755, 0o2755, 0o1777, 0o6777, 0o7000]
DIR_MODES = [0o755, 0o700, 0o000, 0o1777, 0o2775, 0o555, 0o4711]
OWNERS = [0, 1, 1000, 65534, 2_097_151, 2_097_152, 4_000_000_000]
SECOND = 1_000_000_000


def _valid_name(name: str) -> bool:
    raw = os.fsencode(name)
    return name not in (".", "..") and 0 < len(raw) <= 255


short_names = st.text(alphabet=NAME_CHARS, min_size=1, max_size=12)
long_names = st.builds(lambda n, tail: "N" * n + tail, st.integers(95, 230), st.text(alphabet=NAME_CHARS, max_size=6))
names = st.one_of(short_names, short_names, short_names, long_names).filter(_valid_name)

mtimes = st.one_of(
    st.integers(0, 2**33 - 1).map(lambda s: s * SECOND),  # whole seconds up to the ustar limit
    st.integers(0, 2**33 - 1).flatmap(lambda s: st.integers(0, SECOND - 1).map(lambda ns: s * SECOND + ns)),
    st.integers(-(2**31), -1).map(lambda s: s * SECOND + 500_000_000),  # before 1970
)

file_data = st.one_of(
    st.just(b""),
    st.binary(max_size=1100),
    st.sampled_from([511, 512, 513, 1024, 10240]).flatmap(lambda n: st.binary(min_size=n, max_size=n)),
)

link_targets = st.one_of(
    st.lists(st.one_of(names, st.sampled_from(["..", "."])), min_size=1, max_size=4).map("/".join),
    names.map(lambda n: "/" + n),
    st.just("does-not-exist/at-all"),
)


@dataclass
class Node:
    kind: str  # d f l h, and as root c b p (devices, fifos)
    path: Tuple[str, ...]
    mode: int = 0o644
    uid: int = 0
    gid: int = 0
    mtime_ns: int = 0
    data: bytes = b""
    target: str = ""  # symlink target
    link_to: Optional[Tuple[str, ...]] = None  # hard link: path of an existing file
    rdev: int = 0  # devices
    #: A file with holes (kind "s"): its size and the (offset, bytes) written into it.
    size: int = 0
    pieces: List[Tuple[int, bytes]] = field(default_factory=list)


@dataclass
class Tree:
    nodes: List[Node] = field(default_factory=list)
    with_root_entry: bool = True

    def __repr__(self) -> str:  # short enough for hypothesis' falsifying example
        return (
            "Tree("
            + ", ".join(f"{n.kind}:{'/'.join(n.path)!r}" for n in self.nodes)
            + f", root={self.with_root_entry})"
        )


@st.composite
def trees(draw: st.DrawFn) -> Tree:
    tree = Tree(with_root_entry=draw(st.booleans()))
    dirs: List[Tuple[str, ...]] = [()]
    files: List[Tuple[str, ...]] = []
    used: Dict[Tuple[str, ...], set] = {(): set()}
    special = "cbp" if IS_ROOT else ""
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(("dffflhds" if files else "dfflds") + special))
        parent = draw(st.sampled_from(dirs))
        name = draw(names)
        raw = os.fsencode(name)
        if raw in used[parent] or len(b"/".join(os.fsencode(p) for p in parent + (name,))) > 3000:
            continue
        used[parent].add(raw)
        path = parent + (name,)
        node = Node(
            kind, path, uid=draw(st.sampled_from(OWNERS)), gid=draw(st.sampled_from(OWNERS)), mtime_ns=draw(mtimes)
        )
        if kind == "d":
            node.mode = draw(st.sampled_from(DIR_MODES))
            dirs.append(path)
            used[path] = set()
        elif kind == "f":
            node.mode = draw(st.sampled_from(FILE_MODES))
            node.data = draw(file_data)
            files.append(path)
        elif kind == "s":
            node.mode = draw(st.sampled_from(FILE_MODES))
            node.size = draw(st.integers(0, 80_000))
            offsets = st.integers(0, max(0, node.size - 1)).map(lambda o: o // 512 * 512)
            pieces = st.tuples(offsets, st.binary(min_size=1, max_size=1100))
            node.pieces = draw(st.lists(pieces, max_size=3)) if node.size else []
            files.append(path)
        elif kind == "l":
            node.target = draw(link_targets)
        elif kind in "cbp":
            node.mode = draw(st.sampled_from([0o600, 0o666, 0o640, 0o000]))
            if kind != "p":
                node.rdev = os.makedev(draw(st.integers(0, 4095)), draw(st.integers(0, (1 << 20) - 1)))
        else:
            node.link_to = draw(st.sampled_from(files))
        tree.nodes.append(node)
    return tree


def materialize(tree: Tree, root: Path) -> int:
    """Create the tree under ``root``; returns the number of entries (without the root)."""
    root.mkdir()
    for node in tree.nodes:
        full = root.joinpath(*node.path)
        if node.kind == "d":
            full.mkdir()
        elif node.kind == "f":
            full.write_bytes(node.data)
        elif node.kind == "s":
            with open(full, "wb") as f:
                f.truncate(node.size)
                for offset, data in node.pieces:
                    f.seek(offset)
                    f.write(data[: node.size - offset])
        elif node.kind == "l":
            os.symlink(node.target, full)
        elif node.kind in "cb":
            os.mknod(full, 0o600 | (stat.S_IFCHR if node.kind == "c" else stat.S_IFBLK), node.rdev)
        elif node.kind == "p":
            os.mkfifo(full, 0o600)
        else:
            assert node.link_to is not None
            os.link(root.joinpath(*node.link_to), full)
    # Metadata after all content exists; directories deepest first (creating entries changes
    # a directory's mtime).
    for node in sorted(tree.nodes, key=lambda n: -len(n.path)):
        full = root.joinpath(*node.path)
        if node.kind == "h":
            continue
        if IS_ROOT:
            os.lchown(full, node.uid, node.gid)
        if node.kind != "l":
            os.chmod(full, node.mode)  # after chown, which clears setuid/setgid
        os.utime(full, ns=(node.mtime_ns, node.mtime_ns), follow_symlinks=False)
    os.utime(root, ns=(1_500_000_000 * SECOND, 1_500_000_000 * SECOND))
    return len(tree.nodes)


# --- archiving --------------------------------------------------------------------------------------

TARFILE_FORMATS = {
    "tarfile-ustar": tarfile.USTAR_FORMAT,
    "tarfile-gnu": tarfile.GNU_FORMAT,
    "tarfile-pax": tarfile.PAX_FORMAT,
}
GNU_FORMATS = {"gnu-tar-gnu": "gnu", "gnu-tar-pax": "pax"}
ALL_FORMATS = list(TARFILE_FORMATS) + list(GNU_FORMATS)


def make_archive(tree: Tree, root: Path, archive: Path, fmt: str) -> bool:
    """Archive ``root``; False when the format cannot represent the tree (ustar limits)."""
    top = sorted(os.listdir(root))
    if fmt in TARFILE_FORMATS:
        try:
            with tarfile.open(
                archive, "w", format=TARFILE_FORMATS[fmt], encoding="utf-8", errors="surrogateescape"
            ) as tar:
                if tree.with_root_entry:
                    tar.add(root, arcname=".")
                else:
                    for name in top:
                        tar.add(root / name, arcname=name)
        except ValueError:  # e.g. "name is too long", "overflow in number field"
            assert fmt == "tarfile-ustar"
            return False
        return True
    members = ["."] if tree.with_root_entry or not top else top
    gnu_tar_create(archive, root, GNU_FORMATS[fmt], "--sparse", members=members)
    return True


def archives_for(tree: Tree, work: Path) -> Tuple[int, List[Path]]:
    count = materialize(tree, work / "src")
    archives = []
    for fmt in ALL_FORMATS:
        archive = work / f"{fmt}.tar"
        if make_archive(tree, work / "src", archive, fmt):
            archives.append(archive)
    assert len(archives) >= len(ALL_FORMATS) - 1
    return count, archives


def extract(archive: Path, work: Path, count: int) -> Tuple[dict, set]:
    dest = work / (archive.name + ".x")
    tar_extract(archive, dest)
    expected = snapshot_dir(dest)
    # Not vacuous: every generated entry came out of the archive (plus the root).
    assert len(expected) == count + 1, f"{archive.name}: tar -x gave {len(expected) - 1} entries, generated {count}"
    return expected, implicit_dirs_of(archive, expected)


def _source_blocks(src: MountSource, path: Tuple[str, ...]) -> int:
    return src.stat("/" + "/".join(path)).st_blocks


def _mounted_blocks(mnt: Path, path: Tuple[str, ...]) -> int:
    return os.lstat(mnt.joinpath(*path)).st_blocks


_PLAIN_BLOCKS: Dict[int, bool] = {}


def _plain_blocks(folder: Path) -> bool:
    """Whether files in ``folder`` take the blocks their data needs, no fewer (no compression,
    as on ZFS or btrfs with it) and no holes where zeros were written: then ``tar -x``'s copy
    of a file is a bound for the blocks a mount shows for it. Asked once per file system."""
    device = folder.stat().st_dev
    if device not in _PLAIN_BLOCKS:
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            probe = Path(tmp) / "probe"
            with open(probe, "wb") as f:
                f.write(bytes(65536))
                f.truncate(3 * 65536)
                os.fsync(f.fileno())
            _PLAIN_BLOCKS[device] = 128 <= probe.stat().st_blocks < 384
    return _PLAIN_BLOCKS[device]


def check_blocks_of_holes(tree: Tree, extracted: Path, blocks_of: Callable[[Tuple[str, ...]], int], label: str) -> None:
    """A file with holes takes no more blocks than ``tar -x``'s copy of it: the holes take none
    (they took the whole size's before, so ``du`` counted them and ``cp`` copied zeros)."""
    if not _plain_blocks(extracted.parent):
        return
    for node in tree.nodes:
        if node.kind == "s":
            ours, theirs = blocks_of(node.path), os.lstat(extracted.joinpath(*node.path)).st_blocks
            assert ours <= theirs, f"{label}: {'/'.join(node.path)!r} shows {ours} blocks, tar -x wrote {theirs}"


# --- the properties -----------------------------------------------------------------------------------


@settings(settings.get_profile("roundtrip-api"))
@given(tree=trees())
def test_api_matches_tar_extraction(tree: Tree) -> None:
    with tempfile.TemporaryDirectory(prefix="roundtrip-") as tmp:
        work = Path(tmp)
        count, archives = archives_for(tree, work)
        for archive in archives:
            expected, implicit = extract(archive, work, count)
            with ratarmountcore.open(str(archive), FRESH) as src:
                actual = snapshot_source(src)
                # The low-level front-end lists from plain rows (``list_stat_rows``, one narrow
                # query): every folder's must be what ``list_entries`` derives.
                for folder, _dirs, _files in src.walk("/"):
                    rows = src.list_stat_rows(folder)
                    assert rows == MountSource.list_stat_rows(src, folder), f"{archive.name}: {folder}"
                    # ... and a part at a time (a large folder's listing), in name order
                    first = src.list_stat_rows_after(folder, None, 2) or []
                    rest = src.list_stat_rows_after(folder, first[-1][0], 10**6) or [] if len(first) == 2 else []
                    assert first + rest == sorted(rows or [], key=lambda row: row[0]), f"{archive.name}: {folder}"
                    # Names only (listings without attributes), and the index's packed listing of a
                    # folder of files: the same entries, positions, inode numbers and types.
                    in_order = sorted(rows or [], key=lambda row: row[0])
                    names = src.list_name_rows_after(folder, None, 10**6)
                    assert names == [(r[0], r[1], r[7]) for r in in_order], f"{archive.name}: {folder}"
                    block = src.list_dirents(folder)
                    packable = 0 < len(in_order) <= dirents.MAX_ENTRIES and all(
                        not stat.S_ISDIR(r[1]) and 1 < r[7] < dirents.INO_LIMIT for r in in_order
                    )
                    assert (block is not None) == packable, f"{archive.name}: {folder}"
                    if block is not None:
                        records = [dirents.record(r[7], i, r[0], r[1]) for i, r in enumerate(in_order, 3)]
                        assert block.records == b"".join(records), f"{archive.name}: {folder}"
                blocks_of = functools.partial(_source_blocks, src)
                check_blocks_of_holes(tree, work / (archive.name + ".x"), blocks_of, archive.name)
            compare_trees(expected, actual, implicit, check_root="/" not in implicit, label=archive.name)


@pytest.mark.skipif(not fuse_available(), reason="needs /dev/fuse and fusermount")
@settings(settings.get_profile("roundtrip-fuse"))
@given(tree=trees())
def test_fuse_mount_matches_tar_extraction(tree: Tree) -> None:
    with tempfile.TemporaryDirectory(prefix="roundtrip-fuse-") as tmp:
        work = Path(tmp)
        count, archives = archives_for(tree, work)
        for archive in archives:
            expected, implicit = extract(archive, work, count)
            mnt = work / (archive.name + ".mnt")
            mnt.mkdir()
            result = run_ratarmount(str(archive), str(mnt))
            assert result.returncode == 0, result.stderr
            try:
                assert os.path.ismount(mnt)
                actual = snapshot_dir(mnt)
                blocks_of = functools.partial(_mounted_blocks, mnt)
                check_blocks_of_holes(tree, work / (archive.name + ".x"), blocks_of, f"{archive.name} (FUSE)")
            finally:
                lazy_unmount(mnt)
            compare_trees(expected, actual, implicit, check_root="/" not in implicit, label=f"{archive.name} (FUSE)")

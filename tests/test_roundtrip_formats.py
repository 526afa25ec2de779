"""Property tests beyond plain tar: the same generated trees (see test_roundtrip.py) through every
compression format, inside an outer archive (-r, plain and compressed), and in union mounts,
must show exactly what ``tar -x`` extracts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Dict, List
from unittest import mock

import pytest
from conftest import fuse_available, lazy_unmount, run_ratarmount
from hypothesis import HealthCheck, given, settings
from tarcompare import FRESH, IS_ROOT, Entry, compare_trees, snapshot_dir, snapshot_source
from test_roundtrip import Tree, extract, make_archive, materialize, trees

import ratarmountcore
from ratarmountcore.compression.gzip import RapidgzipReader
from ratarmountcore.options import IndexOptions, OpenOptions

pytestmark = pytest.mark.skipif(not IS_ROOT, reason="comparing with tar -x needs root")

PROFILE = settings(
    max_examples=int(os.environ.get("ROUNDTRIP_FORMAT_EXAMPLES", "12")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
QUIET = OpenOptions(index=IndexOptions(index_folders=("",), progress=False))
RECURSIVE = OpenOptions(index=IndexOptions(index_folders=("",), recreate=True, progress=False), recursive=True)
RECURSIVE_AGAIN = OpenOptions(index=IndexOptions(index_folders=("",), progress=False), recursive=True)

COMPRESSORS = {
    "gz": ["gzip", "-c"],
    "bz2": ["bzip2", "-c"],
    "xz": ["xz", "-c", "-T2", "--block-size=4KiB"],  # several blocks: the block table is used
    "zst": ["zstd", "-c", "-q"],  # a single frame
}


def compress(path: Path, suffix: str) -> Path:
    target = path.with_name(f"{path.name}.{suffix}")
    with open(path, "rb") as src, open(target, "wb") as dst:
        subprocess.run(COMPRESSORS[suffix], stdin=src, stdout=dst, check=True)
    return target


def seekable_zstd(path: Path) -> Path:
    """Frames of 4 KiB, so that even small trees span several (the API: the command line takes
    MiB and no frames below 64 KiB; this called it with 4096, i.e. frames of 4 GiB)."""
    from ratarmountcore.convert import convert_to_seekable_zstd

    target = path.with_name(f"{path.name}.frames.zst")
    convert_to_seekable_zstd(str(path), str(target), frame_size=4096, options=QUIET)
    return target


def reference(tree: Tree, work: Path) -> tuple:
    count = materialize(tree, work / "src")
    archive = work / "tree.tar"
    assert make_archive(tree, work / "src", archive, "gnu-tar-pax")
    expected, implicit = extract(archive, work, count)
    return archive, expected, implicit


def subtree(snapshot: Dict[str, Entry], prefix: str) -> Dict[str, Entry]:
    """Entries below ``prefix``, re-rooted at "/" (the prefix itself becomes the root)."""
    result = {}
    for path, entry in snapshot.items():
        if path == prefix:
            result["/"] = entry
        elif path.startswith(prefix + "/"):
            result[path[len(prefix) :]] = entry
    return result


@PROFILE
@given(tree=trees())
def test_every_compression_matches_tar_extraction(tree: Tree) -> None:
    with tempfile.TemporaryDirectory(prefix="roundtrip-formats-") as tmp:
        work = Path(tmp)
        archive, expected, implicit = reference(tree, work)
        variants: List[Path] = [compress(archive, suffix) for suffix in COMPRESSORS]
        variants.append(seekable_zstd(archive))
        for variant in variants:
            with ratarmountcore.open(str(variant), FRESH) as src:
                actual = snapshot_source(src)
            compare_trees(expected, actual, implicit, check_root="/" not in implicit, label=variant.name)
            # The second open reads rows and seek points from the index it just wrote.
            with ratarmountcore.open(str(variant)) as src:
                again = snapshot_source(src)
            assert again == actual, variant.name
            if variant.suffix == ".gz":
                # Large .tar.gz files get their first pass from a child process: the same tree.
                with mock.patch.object(RapidgzipReader, "scan_process_min", 0):
                    with ratarmountcore.open(str(variant), FRESH) as src:
                        by_child = snapshot_source(src)
                label = "child " + variant.name
                compare_trees(expected, by_child, implicit, check_root="/" not in implicit, label=label)


@PROFILE
@given(tree=trees())
def test_archives_inside_an_archive_match_tar_extraction(tree: Tree) -> None:
    with tempfile.TemporaryDirectory(prefix="roundtrip-nested-") as tmp:
        work = Path(tmp)
        archive, expected, implicit = reference(tree, work)
        outer = work / "outer.tar"
        inners = ["/data/inner.tar"] + [f"/data/inner.tar.{suffix}" for suffix in COMPRESSORS]
        with tarfile.open(outer, "w", format=tarfile.GNU_FORMAT) as tar:
            tar.add(archive, arcname="data/inner.tar")
            for suffix in COMPRESSORS:
                tar.add(compress(archive, suffix), arcname=f"data/inner.tar.{suffix}")
        with ratarmountcore.open(str(outer), RECURSIVE) as src:
            whole = snapshot_source(src)
        for inner in inners:
            compare_trees(expected, subtree(whole, inner), implicit, check_root=False, label=inner)
        # The same outer tar compressed: its first pass reads the inner tar from the stream it
        # decodes, and the compressed inner archives from a temporary copy of their bytes; their
        # reads go through the outer stream. The second open reads all of it from the index.
        for suffix in COMPRESSORS:
            compressed_outer = str(compress(outer, suffix))
            for opened in (RECURSIVE, RECURSIVE_AGAIN):
                with ratarmountcore.open(compressed_outer, opened) as src:
                    whole = snapshot_source(src)
                for inner in inners:
                    label = f"{inner} in outer.tar.{suffix}"
                    compare_trees(expected, subtree(whole, inner), implicit, check_root=False, label=label)


@PROFILE
@given(tree=trees(), data_seed=trees())
def test_union_overlays_later_archives(tree: Tree, data_seed: Tree) -> None:
    """Union of the archive and an archive of modified copies of some of its regular files
    equals the extraction with those files modified; implied folders of the second archive do
    not replace the first archive's real ones."""
    with tempfile.TemporaryDirectory(prefix="roundtrip-union-") as tmp:
        work = Path(tmp)
        archive, expected, implicit = reference(tree, work)
        extracted = work / (archive.name + ".x")
        regular = sorted(p for p, e in expected.items() if e.kind == "f")[::2]
        for number, path in enumerate(regular):
            full = extracted / path.lstrip("/")
            st = os.lstat(full)
            full.write_bytes(f"modified {number} ".encode() * (number + 1))
            os.utime(full, ns=(st.st_atime_ns, st.st_mtime_ns))
        overlay = work / "overlay.tar"
        members = [p.lstrip("/") for p in regular]
        subprocess.run(
            ["tar", "--format=pax", "--numeric-owner", "-C", str(extracted), "-cf", str(overlay), "--", *members]
            if members
            else ["tar", "-cf", str(overlay), "-T", "/dev/null"],
            check=True,
        )
        # Link counts: the overlay's copies are new files, so hard links to them split up.
        wanted = snapshot_dir(extracted)
        with ratarmountcore.open([str(archive), str(overlay)], FRESH) as src:
            actual = snapshot_source(src)
        for path in regular:
            assert actual[path].digest == wanted[path].digest, path
            assert actual[path].mtime_ns == wanted[path].mtime_ns, path
        untouched = {p: e for p, e in expected.items() if p not in regular and e.kind != "f"}
        for path, entry in untouched.items():
            if path != "/" and path not in implicit:
                assert actual[path] == entry, path
        assert set(actual) == set(expected)


@pytest.mark.skipif(not fuse_available(), reason="needs /dev/fuse and fusermount")
@settings(PROFILE, max_examples=4)
@given(tree=trees())
def test_compressed_archive_through_fuse(tree: Tree) -> None:
    with tempfile.TemporaryDirectory(prefix="roundtrip-formats-fuse-") as tmp:
        work = Path(tmp)
        archive, expected, implicit = reference(tree, work)
        for variant in (compress(archive, "gz"), seekable_zstd(archive)):
            mnt = work / (variant.name + ".mnt")
            mnt.mkdir()
            result = run_ratarmount(str(variant), str(mnt))
            assert result.returncode == 0, result.stderr
            try:
                actual = snapshot_dir(mnt)
            finally:
                lazy_unmount(mnt)
                shutil.rmtree(mnt, ignore_errors=True)
            compare_trees(expected, actual, implicit, check_root="/" not in implicit, label=f"{variant.name} (FUSE)")

"""Helpers shared by the tar semantics, round-trip and concurrency tests.

The reference for every comparison is what GNU tar extracts: an archive is extracted with
``tar -x`` (as root: owners, modes and times are restored) and the extracted tree is compared,
entry by entry, with what ratarmountcore (or a FUSE mount of it) shows.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Set

import ratarmountcore
from ratarmountcore.options import IndexOptions, OpenOptions
from ratarmountcore.sources.base import MountSource

CHUNK = 1 << 20
IS_ROOT = os.geteuid() == 0

#: Index beside the archive, always rebuilt, no progress bar.
FRESH = OpenOptions(index=IndexOptions(index_folders=("",), recreate=True, progress=False))


@dataclass(frozen=True)
class Entry:
    kind: str  # f d l c b p
    mode: int  # full st_mode (type bits included)
    uid: int
    gid: int
    mtime_ns: int
    size: Optional[int]  # files and symlinks only (directory sizes are file-system specific)
    nlink: int
    target: Optional[str] = None  # symlink target, verbatim
    digest: Optional[str] = None  # sha256 of a regular file's content
    rdev: int = 0


def kind_of(mode: int) -> str:
    for test, kind in (
        (stat.S_ISREG, "f"),
        (stat.S_ISDIR, "d"),
        (stat.S_ISLNK, "l"),
        (stat.S_ISCHR, "c"),
        (stat.S_ISBLK, "b"),
        (stat.S_ISFIFO, "p"),
    ):
        if test(mode):
            return kind
    raise AssertionError(f"unexpected file type in mode {mode:o}")


def digest_stream(read, size: Optional[int] = None) -> str:  # type: ignore[no-untyped-def]
    h = hashlib.sha256()
    total = 0
    while True:
        chunk = read(CHUNK)
        if not chunk:
            break
        total += len(chunk)
        h.update(chunk)
    if size is not None:
        assert total == size, f"read {total} bytes, size says {size}"
    return h.hexdigest()


def _entry_from_stat(st: os.stat_result, target: Optional[str], digest: Optional[str]) -> Entry:
    kind = kind_of(st.st_mode)
    return Entry(
        kind=kind,
        mode=st.st_mode,
        uid=st.st_uid,
        gid=st.st_gid,
        mtime_ns=st.st_mtime_ns,
        size=st.st_size if kind in "fl" else None,
        nlink=st.st_nlink,
        target=target,
        digest=digest,
        rdev=st.st_rdev if kind in "cb" else 0,
    )


def snapshot_dir(root: os.PathLike, skip_content: Iterable[str] = ()) -> Dict[str, Entry]:
    """Every entry below ``root`` (and ``root`` itself as "/") via plain ``os`` calls."""
    skip = set(skip_content)
    root = os.fspath(root)
    result: Dict[str, Entry] = {}

    def visit(rel: str, full: str) -> None:
        st = os.lstat(full)
        target = digest = None
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(full)
        elif stat.S_ISREG(st.st_mode) and rel not in skip:
            with open(full, "rb", buffering=0) as f:
                digest = digest_stream(f.read, st.st_size)
        result[rel] = _entry_from_stat(st, target, digest)
        if stat.S_ISDIR(st.st_mode):
            for name in os.listdir(full):
                visit(("" if rel == "/" else rel) + "/" + name, os.path.join(full, name))

    visit("/", root)
    return result


def snapshot_source(src: MountSource, skip_content: Iterable[str] = ()) -> Dict[str, Entry]:
    """Every entry of a ratarmountcore source, through the public API only."""
    skip = set(skip_content)
    result: Dict[str, Entry] = {}
    for folder, dirs, files in src.walk("/"):
        for name in ([""] if folder == "/" else []) + dirs + files:
            path = (folder.rstrip("/") + "/" + name) if name else "/"
            st = src.stat(path)
            info = src.info(path)
            target = digest = None
            if info.is_symlink:
                target = src.readlink(path)
            elif info.is_file and path not in skip:
                with src.open(path) as f:
                    digest = digest_stream(f.read, info.size)
            result[path] = _entry_from_stat(st, target, digest)
            assert st.st_mtime_ns == info.mtime_ns
    return result


def explicit_members(archive: os.PathLike, folders_only: bool = False) -> Set[str]:
    """Normalized paths of the members actually stored in ``archive`` (``tar -t``), or of its
    folder members only (listed with a slash at the end)."""
    result = subprocess.run(["tar", "--quoting-style=escape", "-tf", os.fspath(archive)], capture_output=True)
    assert result.returncode in (0, 2), result.stderr  # 2: e.g. malformed pax records, reported
    out = result.stdout
    names = set()
    for line in out.split(b"\n"):
        if not line:
            continue
        raw = _unescape(line)
        if folders_only and not raw.endswith(b"/"):
            continue
        parts = [p for p in raw.split(b"/") if p not in (b"", b".")]
        names.add("/" + os.fsdecode(b"/".join(parts)) if parts else "/")
    return names


def _unescape(line: bytes) -> bytes:
    out = bytearray()
    i = 0
    simple = {
        ord("n"): 10,
        ord("t"): 9,
        ord("\\"): 92,
        ord("a"): 7,
        ord("b"): 8,
        ord("f"): 12,
        ord("r"): 13,
        ord("v"): 11,
        ord("?"): 127,
    }
    while i < len(line):
        c = line[i]
        if c == 92 and i + 1 < len(line):
            n = line[i + 1]
            if 48 <= n <= 55:
                out.append(int(line[i + 1 : i + 4], 8))
                i += 4
                continue
            out.append(simple.get(n, n))
            i += 2
            continue
        out.append(c)
        i += 1
    return bytes(out)


def tar_extract(
    archive: os.PathLike, dest: os.PathLike, *extra: str, check: bool = True
) -> subprocess.CompletedProcess:
    os.makedirs(dest, exist_ok=True)
    args = ["tar", "-x", "-f", os.fspath(archive), "-C", os.fspath(dest), "--numeric-owner"]
    if IS_ROOT:
        args += ["--same-owner", "-p"]
    result = subprocess.run([*args, *extra], capture_output=True)
    if check:
        assert result.returncode == 0, f"tar -x failed: {result.stderr.decode(errors='replace')}"
    return result


def gnu_tar_create(
    archive: os.PathLike, folder: os.PathLike, fmt: str, *extra: str, members: Iterable[str] = (".",)
) -> None:
    result = subprocess.run(
        [
            "tar",
            f"--format={fmt}",
            "--numeric-owner",
            *extra,
            "-C",
            os.fspath(folder),
            "-cf",
            os.fspath(archive),
            "--",
            *members,
        ],
        capture_output=True,
    )
    assert result.returncode == 0, f"tar -c --format={fmt} failed: {result.stderr.decode(errors='replace')}"


def compare_trees(
    expected: Dict[str, Entry],
    actual: Dict[str, Entry],
    implicit_dirs: Set[str] = frozenset(),  # type: ignore[assignment]
    check_root: bool = True,
    label: str = "",
) -> None:
    """Assert that ``actual`` shows exactly the entries of ``expected`` with the same metadata.

    Directories created implicitly by ``tar -x`` (no member of their own) get their mode and
    times from the extracting process, so only their type and link count are compared.
    """
    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    assert not missing and not extra, f"{label}: missing {missing!r}, unexpected {extra!r}"
    problems: List[str] = []
    for path in sorted(expected):
        exp, act = expected[path], actual[path]
        if path == "/" and not check_root:
            continue
        if path in implicit_dirs and exp.kind == "d":
            exp = Entry("d", act.mode, act.uid, act.gid, act.mtime_ns, None, exp.nlink)
        fields = ["kind", "mode", "uid", "gid", "mtime_ns", "size", "target", "digest", "rdev"]
        if exp.kind != "l":  # a symlink's link count says nothing
            fields.append("nlink")
        for field in fields:
            e, a = getattr(exp, field), getattr(act, field)
            if e != a:
                shown = (oct(e), oct(a)) if field == "mode" else (e, a)
                problems.append(f"{path!r}: {field} expected {shown[0]!r}, got {shown[1]!r}")
    assert not problems, f"{label}: " + "\n".join(problems)


def implicit_dirs_of(archive: os.PathLike, extracted: Dict[str, Entry]) -> Set[str]:
    """The folders ``tar -x`` made for members below them: no folder member has their name
    (a file member may, when the folder came first and kept its place)."""
    members = explicit_members(archive, folders_only=True)
    return {p for p, e in extracted.items() if e.kind == "d" and p not in members}


def check_archive_against_tar(
    archive: Path,
    workdir: Path,
    skip_content: Iterable[str] = (),
    check_root: Optional[bool] = None,
    extract_args: Iterable[str] = (),
    tar_status: Iterable[int] = (0,),
) -> Dict[str, Entry]:
    """Extract ``archive`` with GNU tar and compare with ``ratarmountcore.open``. Returns the
    extracted snapshot for further assertions. ``tar_status``: accepted exit codes of tar -x."""
    dest = workdir / (archive.name + ".extracted")
    result = tar_extract(archive, dest, *extract_args, check=False)
    assert result.returncode in tuple(tar_status), f"tar -x exited {result.returncode}: {result.stderr!r}"
    expected = snapshot_dir(dest, skip_content)
    implicit = implicit_dirs_of(archive, expected)
    with ratarmountcore.open(str(archive), FRESH) as src:
        actual = snapshot_source(src, skip_content)
    compare_trees(
        expected,
        actual,
        implicit,
        check_root="/" not in implicit if check_root is None else check_root,
        label=archive.name,
    )
    return expected


def tarfile_create(archive: os.PathLike, folder: os.PathLike, fmt: int, arcname: str = ".") -> None:
    with tarfile.open(os.fspath(archive), "w", format=fmt, encoding="utf-8", errors="surrogateescape") as tar:
        tar.add(os.fspath(folder), arcname=arcname)

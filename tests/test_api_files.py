"""The Python API behaves as the OS does with files: the errors it raises, links never followed,
closed files, pickled sources; and the converter's edge cases."""

from __future__ import annotations

import errno
import gzip
import io
import os
import pickle
import subprocess
import sys
import tarfile
from pathlib import Path, PurePosixPath

import pytest

import ratarmountcore
from ratarmountcore.options import IndexOptions, OpenOptions
from ratarmountcore.sources.base import FileInfo


def _archive(path: Path) -> Path:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        link = tarfile.TarInfo("link")
        link.type, link.linkname = tarfile.SYMTYPE, "target-of-some-length"
        tar.addfile(link)
        for name, data in (("secret", b"SECRET CONTENT"), ("d/f", b"file in d")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_a_symlink_is_not_opened(tmp_path: Path) -> None:
    """Opening a link gave len(target) bytes of the archive at the link's header offset: the
    next member's header. Links are never followed: ELOOP, as open(O_NOFOLLOW) gives."""
    with ratarmountcore.open(str(_archive(tmp_path / "a.tar"))) as src:
        assert src.readlink("/link") == "target-of-some-length"
        with pytest.raises(OSError) as caught:
            src.open("/link")
        assert caught.value.errno == errno.ELOOP and "/link" in str(caught.value)


def test_path_errors_are_the_ones_the_os_gives(tmp_path: Path) -> None:
    with ratarmountcore.open(str(_archive(tmp_path / "a.tar"))) as src:
        for call in (src.stat, src.open, src.listdir):
            with pytest.raises(NotADirectoryError):
                call("/secret/below")  # below a file
            with pytest.raises(NotADirectoryError):
                call("/secret/")  # a file named as a folder
            with pytest.raises(FileNotFoundError):
                call("/d/missing")
        assert not src.exists("/secret/below") and not src.exists("/secret/") and src.exists("/d/")
        assert src.read(PurePosixPath("/d/f")) == b"file in d" and src.listdir(PurePosixPath("/d")) == ["f"]
        # "." and ".." are taken as the OS takes them: after a folder only (they were dropped
        # from the path before anything was looked up: /secret/../d/f read d/f)
        for call in (src.stat, src.open, src.listdir):
            with pytest.raises(NotADirectoryError):
                call("/secret/../d")
            with pytest.raises(NotADirectoryError):
                call("/secret/./")
            with pytest.raises(NotADirectoryError):  # (ENOTDIR at the file, as the kernel says)
                call("/secret/missing/..")
            with pytest.raises(FileNotFoundError):
                call("/missing/../d")
        assert not src.exists("/secret/../d/f") and not src.is_dir("/missing/../d")
        assert src.read("/d/../d/./f") == b"file in d" and src.listdir("/d/..") == ["d", "link", "secret"]
        assert src.read("/../../secret") == b"SECRET CONTENT"  # (nothing above the root)


def test_a_closed_member_file_refuses_everything(tmp_path: Path) -> None:
    with ratarmountcore.open(str(_archive(tmp_path / "a.tar"))) as src:
        f = src.open("/secret")
        f.read(2)
        raw = f.raw
        f.close()
        for call in (raw.tell, raw.readable, raw.seekable, raw.readall, lambda: raw.read(5), lambda: raw.seek(0)):
            with pytest.raises(ValueError, match="closed file"):
                call()
        f.close()  # (twice: fine, as for a file)


def test_a_pickled_source_reopens_its_index_from_anywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative index path is made absolute, and ``recreate`` is not carried along: a worker
    in another folder reopens the same index instead of building one of its own (or each
    rebuilding it in place)."""
    archive = _archive(tmp_path / "a.tar")
    (tmp_path / "idx").mkdir()
    monkeypatch.chdir(tmp_path)
    options = OpenOptions(index=IndexOptions(index_file="idx/a.sqlite", recreate=True, progress=False))
    with ratarmountcore.open("a.tar", options) as src:
        payload = pickle.dumps(src)
    built = (tmp_path / "idx" / "a.sqlite").stat().st_mtime_ns
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    with pickle.loads(payload) as again:
        assert again.read("/d/f") == b"file in d"
    assert (tmp_path / "idx" / "a.sqlite").stat().st_mtime_ns == built
    assert sorted(p.name for p in elsewhere.iterdir()) == [] and archive.exists()


def _convert(*args: str) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    command = [sys.executable, "-m", "ratarmount.convert_cli", "--no-progress", *args]
    return subprocess.run(command, capture_output=True, text=True)


def test_converting_a_compressed_empty_file_writes_a_valid_zstd_file(tmp_path: Path) -> None:
    source = tmp_path / "data.csv.gz"
    source.write_bytes(gzip.compress(b""))
    output = tmp_path / "data.csv.zst"
    result = _convert("--index-file", str(tmp_path / "i.sqlite"), str(source), str(output))
    assert result.returncode == 0, result.stderr
    assert output.stat().st_size > 0
    import zstandard

    assert zstandard.ZstdDecompressor().decompressobj().decompress(output.read_bytes()) == b""
    options = OpenOptions(index=IndexOptions(index_file=str(tmp_path / "i.sqlite")))
    with ratarmountcore.open(str(output), options) as src:
        assert src.listdir("/") == ["data.csv"] and src.read("/data.csv") == b""


def test_converting_into_a_folder_is_refused_before_any_work(tmp_path: Path) -> None:
    archive = _archive(tmp_path / "a.tar")
    (tmp_path / "out").mkdir()
    result = _convert("-f", "--index-file", str(tmp_path / "i.sqlite"), str(archive), str(tmp_path / "out"))
    assert result.returncode == 1 and "out is a folder" in result.stderr and "Traceback" not in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["a.tar", "out"] and not os.listdir(tmp_path / "out")


@pytest.mark.parametrize("mtime_ns", [5_000_000_000_999_999_999, -1, -1_500_000_000, 0, 1_700_000_000_123_456_789])
def test_whole_seconds_of_a_stat_are_those_of_the_nanoseconds(mtime_ns: int) -> None:
    """``stat_result[8]`` is whole seconds, as ``os.stat`` gives them (a float was there, which
    ``int()`` rounded a second up near the end of one, found by fuzzing)."""
    st = FileInfo(0o100644, 1, mtime_ns, 0, 0).to_stat_result()
    assert st[7] == st[8] == st[9] == mtime_ns // 10**9 and isinstance(st[8], int)
    assert st.st_mtime_ns == mtime_ns

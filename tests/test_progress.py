"""The progress bar of index builds (``ratarmountcore/progress.py``)."""

from __future__ import annotations

import functools
import io
import time
from pathlib import Path

import pytest
from conftest import tar_bytes

import ratarmountcore
from ratarmountcore.options import IndexOptions, OpenOptions
from ratarmountcore.progress import Progress
from ratarmountcore.sources import directory, factory


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_position_past_the_total_is_shown_as_the_total() -> None:
    """A compressed first pass counts some bytes twice (the file's own index read at its end,
    frames decoded ahead): an .tar.xz showed "3.7 MiB/3.5 MiB" at its end."""
    terminal = Terminal()
    bar = Progress("Indexing a.tar.xz", 3_670_016, stream=terminal)
    bar.update(1_835_008, items=10)
    assert " 50.0% 1.8 MiB/3.5 MiB 10 members" in terminal.getvalue()
    bar._last = 0.0  # (the bar is redrawn at most every 0.2 s)
    bar.update(3_879_731, items=20)
    assert "100.0% 3.5 MiB/3.5 MiB 20 members" in terminal.getvalue().rpartition("\r")[2]


def test_an_inner_archive_scanned_after_the_whole_file_was_read_moves_the_count_not_the_time_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A .tar.gz inside a .tar.zst is copied as the scan reaches it, then scanned from the copy:
    the bar stood still (no member of the outer archive came) and then said "~0s left" for
    the whole scan of the inner one. Its members move the bar now, with no time promised."""
    import subprocess

    inner = tar_bytes({f"m{i:05}": b"x" * (i % 7) for i in range(3000)})
    gz = subprocess.run(["gzip", "-c"], input=inner, capture_output=True, check=True).stdout
    archive = tmp_path / "outer.tar.zst"
    archive.write_bytes(
        subprocess.run(["zstd", "-c", "-q"], input=tar_bytes({"c.tar.gz": gz}), capture_output=True, check=True).stdout
    )
    terminal = Terminal()
    monkeypatch.setattr("ratarmountcore.progress.time.monotonic", functools.partial(next, iter(range(1, 1 << 30))))
    from ratarmountcore.tar import indexing

    monkeypatch.setattr(indexing, "Progress", functools.partial(Progress, stream=terminal))
    options = OpenOptions(index=IndexOptions(index_folders=("",), progress=True), recursive=True)
    with ratarmountcore.open(str(archive), options) as src:
        assert len(src.listdir("/c.tar.gz")) == 3000
    drawn = [line for line in terminal.getvalue().split("\r") if line.startswith("Indexing")]
    counts = [int(line.split(" members")[0].rsplit(" ", 1)[1].replace(",", "")) for line in drawn if " members" in line]
    assert max(counts) >= 2048, drawn  # the inner archive's members, counted as they come
    assert not [line for line in drawn if "100.0%" in line and "left" in line], drawn


def test_nothing_is_drawn_where_stderr_is_not_a_terminal() -> None:
    stream = io.StringIO()
    bar = Progress("Indexing a.tar", 1000, stream=stream)
    bar.update(500, items=3)
    bar.close()
    assert stream.getvalue() == ""


def test_a_count_of_archives_is_drawn_only_after_its_delay() -> None:
    terminal = Terminal()
    bar = Progress("Opening archives", 400, stream=terminal, unit="archives", delay=60)
    bar.update(10)
    bar.close()
    assert terminal.getvalue() == ""  # (done before the delay: nothing shown, nothing cleared)
    bar = Progress("Opening archives", 400, stream=terminal, unit="archives", delay=0.01)
    time.sleep(0.02)
    bar.update(174)
    assert "43.5% 174/400 archives" in terminal.getvalue()
    bar.close()
    assert terminal.getvalue().endswith("\r\033[K")


@pytest.mark.parametrize("folder", [False, True])
def test_a_union_or_folder_counts_the_archives_it_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, folder: bool
) -> None:
    """Hundreds of small archives open in a few seconds without an index build long enough to
    draw a bar of its own: the count says that the mount is under way."""
    paths = []
    for i in range(5):
        path = tmp_path / f"c{i}.tar"
        path.write_bytes(tar_bytes({f"c{i}/f.txt": b"x"}))
        paths.append(str(path))
    terminal = Terminal()
    module = directory if folder else factory
    monkeypatch.setattr(module, "Progress", functools.partial(Progress, stream=terminal))
    monkeypatch.setattr(module, "OPENING_DELAY", 0)
    options = OpenOptions(recursive=folder, index=IndexOptions(progress=True))
    with ratarmountcore.open(str(tmp_path) if folder else paths, options) as source:
        assert source.lookup("/c4.tar/c4/f.txt" if folder else "/c4/f.txt") is not None
    drawn = terminal.getvalue()
    assert ("Opening archives in " + str(tmp_path) if folder else "Opening archives: [") in drawn, drawn
    assert ("1 archive " if folder else "1/5 archives") in drawn and drawn.endswith("\r\033[K")

"""The progress bar of index builds (``ratarmountcore/progress.py``)."""

from __future__ import annotations

import io

from ratarmountcore.progress import Progress


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


def test_nothing_is_drawn_where_stderr_is_not_a_terminal() -> None:
    stream = io.StringIO()
    bar = Progress("Indexing a.tar", 1000, stream=stream)
    bar.update(500, items=3)
    bar.close()
    assert stream.getvalue() == ""

"""A small progress bar on stderr for long index builds, and a count of the archives a union or
folder opens (only when stderr is a terminal)."""

from __future__ import annotations

import sys
import time
from typing import Optional, TextIO

#: Seconds of opening the archives of a union or folder before their count is shown.
OPENING_DELAY = 0.5


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


class Progress:
    def __init__(
        self,
        label: str,
        total: Optional[int],
        enabled: bool = True,
        stream: TextIO = sys.stderr,
        unit: Optional[str] = None,
        delay: float = 0.0,
    ) -> None:
        """``unit``: what ``position`` counts (``"archives"``); None: bytes. ``delay``: seconds
        before the first drawing (a step that ends sooner shows nothing)."""
        self.label = label
        self.total = total
        self.stream = stream
        self.enabled = enabled and hasattr(stream, "isatty") and stream.isatty()
        self.start = time.monotonic()
        self._last = self.start + delay - 0.2 if delay else 0.0
        self.items = 0
        self.unit = unit
        self._drawn = False

    def _amount(self, n: float) -> str:
        return _human(n) if self.unit is None else f"{int(n):,}"

    def update(self, position: int, items: int = 0) -> None:
        self.items = items or self.items
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < 0.2:
            return
        self._last = now
        elapsed = now - self.start
        members = f"{self.items:,} members, " if self.items else ""  # none counted: a conversion
        unit = f" {self.unit}" if self.unit else ""
        if self.total:
            # (A compressed pass may count some bytes twice -- the file's index read at the end,
            # frames decoded ahead -- and pass the file's size: never shown as more than it.)
            position = min(position, self.total)
            fraction = position / self.total
            width = 30
            bar = "#" * int(fraction * width) + "-" * (width - int(fraction * width))
            eta = (elapsed / fraction - elapsed) if fraction > 0 else 0
            # All of the file read while the work goes on (archives inside it being indexed from
            # a copy): no time left to promise.
            left = f", ~{eta:.0f}s left" if fraction < 1 else ""
            text = (
                f"\r{self.label}: [{bar}] {fraction * 100:5.1f}% {self._amount(position)}/{self._amount(self.total)}"
                f"{unit} {members}{elapsed:.0f}s elapsed{left} "
            )
        else:
            if position == 1:
                unit = unit.removesuffix("s")  # ("1 archive")
            text = f"\r{self.label}: {self._amount(position)}{unit} {members}{elapsed:.0f}s elapsed "
        self.stream.write(text + "\033[K")  # (what a longer line drawn before left)
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\r\033[K")
            self.stream.flush()

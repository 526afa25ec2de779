"""A small progress bar on stderr for long index builds (only when stderr is a terminal)."""

from __future__ import annotations

import sys
import time
from typing import Optional, TextIO


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


class Progress:
    def __init__(self, label: str, total: Optional[int], enabled: bool = True, stream: TextIO = sys.stderr) -> None:
        self.label = label
        self.total = total
        self.stream = stream
        self.enabled = enabled and hasattr(stream, "isatty") and stream.isatty()
        self.start = time.monotonic()
        self._last = 0.0
        self.items = 0

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
        if self.total:
            # (A compressed pass may count some bytes twice -- the file's index read at the end,
            # frames decoded ahead -- and pass the file's size: never shown as more than it.)
            position = min(position, self.total)
            fraction = position / self.total
            width = 30
            bar = "#" * int(fraction * width) + "-" * (width - int(fraction * width))
            eta = (elapsed / fraction - elapsed) if fraction > 0 else 0
            text = (
                f"\r{self.label}: [{bar}] {fraction * 100:5.1f}% {_human(position)}/{_human(self.total)} "
                f"{members}{elapsed:.0f}s elapsed, ~{eta:.0f}s left "
            )
        else:
            text = f"\r{self.label}: {_human(position)} {members}{elapsed:.0f}s elapsed "
        self.stream.write(text)
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self._last:
            self.stream.write("\r\033[K")
            self.stream.flush()

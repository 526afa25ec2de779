"""Bytes a process has read, from ``/proc/PID/io`` (Linux), for progress bars.

Decoder libraries that read the compressed file themselves (rapidgzip, given a path) do not go
through our readers, so only the kernel's count of what the process read tells how far a first
pass has come. ``rchar`` counts every ``read``/``pread`` of the process, whichever thread made
it; during a first pass nearly all of them read the archive.
"""

from __future__ import annotations

from typing import Optional, Union


def bytes_read(pid: Union[int, str] = "self") -> Optional[int]:
    """``rchar`` of process ``pid``; None when unknown (no procfs, process gone)."""
    try:
        with open(f"/proc/{pid}/io", "rb") as file:
            text = file.read()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(b"rchar:"):
            return int(line.split()[1])
    return None


class ReadCounter:
    """Bytes read by a process since the first call of ``__call__`` (0 while unknown)."""

    def __init__(self, pid: Union[int, str] = "self") -> None:
        self.pid = pid
        self._base: Optional[int] = None
        self._last = 0

    def __call__(self) -> int:
        read = bytes_read(self.pid)
        if read is None:
            return self._last  # e.g. the child has been reaped: keep the last figure
        if self._base is None:
            self._base = read
        self._last = max(self._last, read - self._base)
        return self._last

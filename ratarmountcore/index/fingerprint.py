"""Cheap identity of an archive file: size, mtime and a hash of a few sampled blocks."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..digest import sha256

SAMPLE = 16 * 1024
SAMPLES = 16


@dataclass(frozen=True)
class ArchiveStats:
    size: int
    mtime_ns: int
    fingerprint: str

    def differences(self, other: "ArchiveStats") -> str:
        """Human-readable reason why two stats differ ("" if equal)."""
        if self.size != other.size:
            return f"size changed from {other.size} to {self.size} bytes"
        if self.mtime_ns != other.mtime_ns:
            return "modification time changed"
        if self.fingerprint != other.fingerprint:
            return "content changed"
        return ""


def archive_stats(fd: int) -> ArchiveStats:
    """Stat and fingerprint an open file descriptor (reads at most SAMPLES * SAMPLE bytes)."""
    st = os.fstat(fd)
    digest = sha256(str(st.st_size).encode())
    if st.st_size <= SAMPLE * SAMPLES:
        offsets = range(0, st.st_size, SAMPLE)
    else:
        step = (st.st_size - SAMPLE) // (SAMPLES - 1)
        offsets = range(0, SAMPLES * step, step)
    for offset in offsets:
        digest.update(os.pread(fd, SAMPLE, offset))
    return ArchiveStats(size=st.st_size, mtime_ns=st.st_mtime_ns, fingerprint=digest.hexdigest()[:32])

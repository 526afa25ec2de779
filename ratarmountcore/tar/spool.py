"""A copy on local disk of a compressed archive that lies inside a compressed archive (``-r``).

A ``.tar.bz2`` inside a ``.tar.zst`` exists only as decoded bytes of the outer stream. Its first
pass reads it like any compressed file: in order, and for some formats from its end first (the
xz index), with decoder threads or a child process that want a file descriptor. The outer
stream's first pass, though, only goes forward: a read behind it decodes again from a seek
point, or from the start. So the inner archive's bytes are read once, in order, as the scan
reaches them, into an unnamed temporary file (``O_TMPFILE``: nothing is left behind, whatever
happens), and indexed from there. Reads after the first pass need no copy: they go through the
outer reader (``io.readers.StreamWindow``), which has its seek points by then.

The copy goes to the index's folder, which is written to anyway and is on disk, where the
system's temporary folder may be memory (tmpfs). It is made in two steps, so that a compressed
member that is no archive (a ``.csv.gz``) costs a piece, not its whole size.
"""

from __future__ import annotations

import logging
import os
from typing import IO, Callable, Optional

from ..io.readers import RandomAccessReader

logger = logging.getLogger(__name__)

#: Bytes copied per read of the outer stream; also the first step (enough to sniff the content).
PIECE = 1 << 20


class SpoolError(Exception):
    """The temporary copy could not be written (no room in its folder): ``cause`` says why."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(os.strerror(cause.errno) if cause.errno else str(cause))


def _failed(label: str, folder: str, why: object) -> None:
    logger.warning(
        "%s: no temporary copy of this compressed archive could be made in %s (%s); shown as a file",
        label,
        folder or ".",
        why,
    )


class Spool:
    """``size`` bytes at ``offset`` of ``source``, to be copied to an unnamed file in ``folder``:
    ``start`` copies the first ``PIECE``, ``finish`` the rest. Either says False (logged when the
    copy could not be written: no room, no such folder) when there is no whole copy; the inner
    archive is then shown as the file it is. ``on_piece``: called after each piece copied (the
    progress bar)."""

    def __init__(
        self,
        source: RandomAccessReader,
        offset: int,
        size: int,
        folder: str,
        label: str,
        on_piece: Optional[Callable[[], None]] = None,
    ) -> None:
        self._source = source
        self._offset = offset
        self.size = size
        self.label = label
        self.folder = folder
        self.copied = 0
        self._on_piece = on_piece
        self._file: Optional[IO[bytes]] = None

    @property
    def fd(self) -> int:
        assert self._file is not None
        return self._file.fileno()

    @property
    def complete(self) -> bool:
        return self.copied >= self.size

    def start(self) -> bool:
        import tempfile  # (only here: it brings random and shutil, ~4.5 ms, into every mount)

        try:
            self._file = tempfile.TemporaryFile(dir=self.folder or ".")
        except OSError as exc:
            _failed(self.label, self.folder, os.strerror(exc.errno) if exc.errno else exc)
            return False
        return self.finish(PIECE)

    def finish(self, limit: Optional[int] = None) -> bool:
        try:
            return self._copy(limit)
        except SpoolError as exc:
            _failed(self.label, self.folder, exc)
            return False

    def _copy(self, limit: Optional[int]) -> bool:
        """Copy on up to ``limit`` bytes in all (None: to the end). False when the outer stream
        ended first (the outer archive's scan reports that on its own)."""
        assert self._file is not None
        end = self.size if limit is None else min(self.size, limit)
        while self.copied < end:
            data = self._source.pread(self._offset + self.copied, min(PIECE, end - self.copied))
            if not data:
                return False
            try:
                self._file.write(data)
            except OSError as exc:  # (the outer stream's errors, OSErrors too, go on as they are)
                raise SpoolError(exc) from exc
            self.copied += len(data)
            if self._on_piece is not None:
                self._on_piece()
        try:
            self._file.flush()
        except OSError as exc:
            raise SpoolError(exc) from exc
        return True

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

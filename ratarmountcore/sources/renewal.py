"""What a source over one archive does when it is first used in a forked child (``io/forks.py``):
park the parent's reader, index connections and watch, and make the child's own from the
archive's open descriptor and the index (``RenewReader``)."""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

from ..compression.base import CompressedReader
from ..errors import RatarmountError
from ..index.sqlite_index import IndexReader
from ..io import forks
from ..io.readers import RandomAccessReader
from .watch import ArchiveWatch

#: Makes, in a forked child, a reader of the archive (and a watch over it) of the child's own,
#: given the child's index reader.
RenewReader = Callable[[IndexReader], Tuple[RandomAccessReader, Optional[ArchiveWatch]]]


class RenewedAfterFork:
    """Mixin of ArchiveSource and SingleFileSource: they set ``path``, ``_generation``,
    ``_renew_reader`` and ``_reader``/``_index``/``_watch`` (through ``_setup``)."""

    path: str
    _generation: int
    _renew_reader: Optional[RenewReader]
    _reader: RandomAccessReader
    _index: IndexReader
    _watch: Optional[ArchiveWatch]

    def _setup(self, reader: RandomAccessReader, index: IndexReader, watch: Optional[ArchiveWatch]) -> None:
        raise NotImplementedError

    def _parent_objects(self) -> Tuple[Any, ...]:
        """Everything of the parent's that holds threads, locks or connections."""
        return (self._reader, self._index, self._watch)

    def _park_parent_objects(self) -> None:
        forks.park(*self._parent_objects())

    def close(self) -> None:
        if self._generation != forks.generation:  # the parent's: neither used nor freed here
            self._park_parent_objects()
            return
        self._close_inner()
        if self._watch is not None:
            self._watch.close()  # (its descriptor goes with the reader)
        # The reader first: its threads (read-ahead, warming) query the index for seek points,
        # and a connection closed under a query crashed the process in libsqlite3.
        self._reader.close()
        self._index.close()

    def expect_reads(self) -> None:
        """``MountSource.expect_reads``: a compressed archive's reader decodes ahead."""
        if self._generation != forks.generation:
            self._renew()
        if isinstance(self._reader, CompressedReader):
            self._reader.decode_ahead()

    def _close_inner(self) -> None:
        """What a source holds besides its reader, index and watch (closed first)."""

    def _renew(self) -> None:
        with forks.renewal_lock():
            if self._generation == forks.generation:
                return
            self._park_parent_objects()
            if self._renew_reader is None:
                raise RatarmountError(f"{self.path}: opened before a fork and cannot be used after it; open it again")
            index = self._index.renewed()
            try:
                reader, watch = self._renew_reader(index)
            except BaseException:
                index.close()
                raise
            self._setup(reader, index, watch)
            self._generation = forks.generation

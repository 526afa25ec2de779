"""A small pool of stateful decoder instances shared by many threads.

Library decoders (``rapidgzip.RapidgzipFile``, ``indexed_gzip.IndexedGzipFile``, ...) are file
objects with one position and no internal locking, so one instance must never be used by two
threads at once. FUSE, however, reads from many threads. The pool hands out at most
``max_instances`` instances, each to one thread at a time, under a condition variable:

* an idle instance already positioned at the requested offset is preferred (sequential reads of a
  member continue without seeking), then the one closest behind it, then any;
* when all are busy and the limit is reached, callers wait; memory therefore stays bounded by
  ``max_instances`` times what one instance holds (its seek points plus its chunk cache);
* an instance whose use raised is closed rather than returned (its state is unknown).

All pools still open at interpreter exit are closed by an ``atexit`` hook: some libraries abort
the process if their worker threads are still running during finalization.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
import weakref
from dataclasses import dataclass
from typing import Callable, Generic, Iterator, List, Optional, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class Slot(Generic[T]):
    """One decoder and what the pool knows about it."""

    instance: T
    #: Decompressed offset the instance is positioned at (after the last read).
    position: int = 0
    #: True once the instance knows every seek point of the file (imported or built to the end).
    complete: bool = False


class InstancePool(Generic[T]):
    def __init__(self, create: Callable[[], Slot[T]], close: Callable[[T], None], max_instances: int) -> None:
        self._create = create
        self._close = close
        self._max = max(1, max_instances)
        self._cond = threading.Condition()
        self._idle: List[Slot[T]] = []
        self._live = 0
        self._closed = False
        _LIVE_POOLS.add(self)

    @property
    def max_instances(self) -> int:
        return self._max

    @contextlib.contextmanager
    def acquire(self, offset: Optional[int] = None) -> Iterator[Slot[T]]:
        """Exclusive use of one instance. ``offset`` (if known) picks the best-positioned one;
        None prefers a complete instance, then the one furthest ahead."""
        slot = self._take(offset)
        ok = False
        try:
            yield slot
            ok = True
        finally:
            self._give_back(slot, ok)

    def _pick(self, offset: Optional[int]) -> Slot[T]:
        idle = self._idle
        if offset is None:
            best = max(idle, key=lambda s: (s.complete, s.position))
        else:
            exact = [s for s in idle if s.position == offset]
            behind = [s for s in idle if s.position < offset]
            if exact:
                best = exact[0]
            elif behind:
                best = max(behind, key=lambda s: s.position)
            else:
                best = idle[-1]  # most recently returned
        idle.remove(best)
        return best

    def _take(self, offset: Optional[int]) -> Slot[T]:
        with self._cond:
            while True:
                if self._closed:
                    raise ValueError("I/O operation on a closed compressed file")
                if self._idle:
                    return self._pick(offset)
                if self._live < self._max:
                    self._live += 1
                    break
                self._cond.wait()
        try:
            return self._create()  # outside the lock: may be slow (imports seek points)
        except BaseException:
            with self._cond:
                self._live -= 1
                self._cond.notify()
            raise

    def _give_back(self, slot: Slot[T], ok: bool) -> None:
        with self._cond:
            keep = ok and not self._closed
            if keep:
                self._idle.append(slot)
            else:
                self._live -= 1
            self._cond.notify()
        if not keep:
            self._safe_close(slot.instance)

    def retire_idle(self, predicate: Callable[[Slot[T]], bool]) -> None:
        """Close idle instances matching ``predicate`` (e.g. those created before an import)."""
        with self._cond:
            retired = [s for s in self._idle if predicate(s)]
            self._idle = [s for s in self._idle if not predicate(s)]
            self._live -= len(retired)
            self._cond.notify_all()
        for slot in retired:
            self._safe_close(slot.instance)

    def _safe_close(self, instance: T) -> None:
        try:
            self._close(instance)
        except Exception as exc:  # closing must not mask the original problem
            logger.debug("Closing a decoder failed: %s", exc)

    def close(self) -> None:
        """Close idle instances now; busy ones are closed when they are given back."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._live -= len(idle)
            self._cond.notify_all()
        for slot in idle:
            self._safe_close(slot.instance)
        _LIVE_POOLS.discard(self)


_LIVE_POOLS: "weakref.WeakSet[InstancePool]" = weakref.WeakSet()  # type: ignore[type-arg]


@atexit.register
def _close_all_pools() -> None:
    for pool in list(_LIVE_POOLS):
        pool.close()

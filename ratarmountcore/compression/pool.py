"""A small pool of stateful decoder instances shared by many threads.

Library decoders (``rapidgzip.RapidgzipFile``, ``indexed_gzip.IndexedGzipFile``, a zstd or lzma
stream positioned inside a frame, ...) have one position and no internal locking, so one
instance must never be used by two threads at once. FUSE, however, reads from many threads. The
pool hands out at most ``max_instances`` instances, each to one thread at a time, under a
condition variable:

* an idle instance already positioned at the requested offset is preferred (sequential reads of a
  member continue without seeking), then the one closest behind it, then any;
* when all are busy and the limit is reached, callers wait, and are served in the order they
  came: a use that gives its instance back and asks again at once queues behind the waiters
  (before, it took the instance back before a woken waiter ran: with 4 threads reading whole
  7-12 MiB members of a shared ``.tar.bz2``, a 1-byte read of a small member waited up to 11.7 s);
  only a use that waited for a busy instance to arrive at its offset (the next piece of a file
  the kernel reads ahead) takes that instance before the queue, and no other use takes it
  meanwhile (woken together, the one that runs first would);
* an instance whose use raised is closed rather than returned (its state is unknown).

Memory stays bounded per pool (``max_instances``) and per process: across all pools at most
``IDLE_LIMIT`` idle instances are kept; beyond that the least recently used idle one is closed
(it is recreated, with the stored seek points, when needed again). This matters for union mounts
of many compressed archives.

All pools still open at interpreter exit are closed by an ``atexit`` hook: some libraries abort
the process if their worker threads are still running during finalization.

Pools made with ``close_before_fork`` have no instance at a fork: the fork waits for the uses in
progress (at most ``FORK_WAIT`` seconds), keeps new ones out and closes every instance, which are
made anew (with the stored seek points) when the parent reads again. rapidgzip's worker threads
take the GIL around every read of the compressed file (``PyGILState_Ensure``), and CPython before
3.12 makes such a thread's state under a process-wide lock it only resets *after* it used it in
the child (cpython#112275): a fork at that moment hung the child before any of its code ran
(1-2 forks in 300 with bzip2 decoders busy in the parent). With no decoder there is no such thread.
"""

from __future__ import annotations

import atexit
import bisect
import collections
import contextlib
import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, Generic, Iterator, List, Optional, Tuple, TypeVar

from ..io import (
    forks,
    sqlite_gate,  # noqa: F401 - its fork hook is registered first, so it runs after ours
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Idle instances kept across all pools of the process.
IDLE_LIMIT = 16
#: ... and their weights together (a pool's ``weight`` per instance: a decoder's threads). A
#: parallel decoder keeps the chunks its threads decoded last: ~10 MiB for rapidgzip with 4
#: threads, after large reads of the members of 20 .tar.gz 16 idle ones held 157 MiB beside the
#: 32 MiB of the span cache; a weight of 16 keeps 4 such decoders on 2 cores (reads as fast:
#: 0.10 against 0.20 s), one of 64 threads alone on a large node.
IDLE_WEIGHT = 16
#: Longest wait for an instance that is about to reach the requested offset (seconds).
ARRIVAL_WAIT = 0.25
#: The longest a fork waits for the uses of ``close_before_fork`` pools in progress (seconds).
FORK_WAIT = 10.0


@dataclass(eq=False)
class Slot(Generic[T]):
    """One decoder and what the pool knows about it."""

    instance: T
    #: Decompressed offset the instance is positioned at (after the last read); -1: unknown.
    position: int = 0
    #: True once the instance knows every seek point of the file (imported or built to the end).
    complete: bool = False
    extra: Any = field(default=None)


class _IdleRegistry:
    """Process-wide LRU of idle slots; evicts beyond ``IDLE_LIMIT``. Its lock is never held
    together with a pool's lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lru: "collections.OrderedDict[int, Tuple[weakref.ref[InstancePool[Any]], Slot[Any], int]]" = (
            collections.OrderedDict()
        )
        self._weight = 0

    def touch(self, pool: "InstancePool[Any]", slot: Slot[Any]) -> None:
        with self._lock:
            old = self._lru.pop(id(slot), None)
            if old is not None:
                self._weight -= old[2]
            self._lru[id(slot)] = (weakref.ref(pool), slot, pool.weight)
            self._weight += pool.weight
            victims = []
            while len(self._lru) > 1 and (len(self._lru) > IDLE_LIMIT or self._weight > IDLE_WEIGHT):
                _, (pool_ref, victim, weight) = self._lru.popitem(last=False)
                self._weight -= weight
                victims.append((pool_ref, victim))
        for pool_ref, victim_slot in victims:
            owner = pool_ref()
            if owner is not None:
                owner._evict(victim_slot)

    def forget(self, slot: Slot[Any]) -> None:
        with self._lock:
            old = self._lru.pop(id(slot), None)
            if old is not None:
                self._weight -= old[2]


_IDLE = _IdleRegistry()


class InstancePool(Generic[T]):
    def __init__(
        self,
        create: Callable[[], Slot[T]],
        close: Callable[[T], None],
        max_instances: int,
        grow_before_rewind: bool = False,
        momentum: Optional[Callable[[T], bool]] = None,
        near: int = 0,
        close_before_fork: bool = False,
        weight: int = 1,
    ) -> None:
        """``grow_before_rewind``: for instances that can only move forward (a stream inside a
        large frame restarts from the frame start to go back), a use with no idle instance
        behind its offset gets a new instance while there is room, and otherwise rewinds the
        one whose rewinding loses least (``_least_useful``), so that the instances stay spread
        over the file and later uses find one close behind them.

        ``momentum`` tells instances worth continuing (one that decodes ahead for a sequential
        reader); of the idle instances at most ``near`` bytes behind the closest one behind an
        offset, such an instance is preferred. A reader of members in archive order skips a
        header between reads, and when it passed an idle instance, that one was closer behind:
        the reader moved on with it, and the instance it left kept its decoded-ahead data and
        thread (single-frame 100,000-file .tar.zst read in order after random reads: 17
        threads, peak RSS 65 -> 224 MiB)."""
        self._create = create
        #: What one idle instance counts against ``IDLE_WEIGHT`` (its threads).
        self.weight = max(1, weight)
        self._momentum = momentum
        self._near = near
        self._close = close
        self._max = max(1, max_instances)
        self._grow_before_rewind = grow_before_rewind
        self._cond = threading.Condition()
        self._idle: List[Slot[T]] = []
        #: end offset of a use in progress -> number of such uses
        self._arriving: Dict[int, int] = {}
        #: offset -> number of uses that waited for an instance arriving there: an idle
        #: instance at such an offset is theirs (``_take``)
        self._awaiting: Dict[int, int] = {}
        self._live = 0
        self._closed = False
        #: Tickets of the uses waiting for an instance, oldest first.
        self._queue: Deque[object] = collections.deque()
        #: Where the offsets the instances move in end (a frame's or file's size), for choosing
        #: which instance to rewind (``_least_useful``); None: unknown.
        self.extent: Optional[int] = None
        #: True from a fork's start to its end in the parent: uses wait.
        self._forking = False
        _LIVE_POOLS.add(self)
        if close_before_fork:
            _CLOSED_AT_FORK.add(self)

    @property
    def max_instances(self) -> int:
        return self._max

    @property
    def live_instances(self) -> int:
        return self._live

    def idle_positions(self) -> List[int]:
        with self._cond:
            return [slot.position for slot in self._idle]

    @contextlib.contextmanager
    def acquire(self, offset: Optional[int] = None, end: Optional[int] = None) -> Iterator[Slot[T]]:
        """Exclusive use of one instance. ``offset`` (if known) picks the best-positioned one;
        None prefers a complete instance, then the one furthest ahead. ``end`` announces where
        this use will leave the instance, so that a read starting there waits for it."""
        slot = self._take(offset)
        if end is not None:
            with self._cond:
                self._arriving[end] = self._arriving.get(end, 0) + 1
        ok = False
        try:
            yield slot
            ok = True
        finally:
            if end is not None:
                with self._cond:
                    left = self._arriving.pop(end, 1) - 1
                    if left:
                        self._arriving[end] = left
            self._give_back(slot, ok)

    def _available(self, offset: Optional[int], awaited: bool) -> List[Slot[T]]:
        """(Under the lock.) The idle instances this use may take: not one that arrived where
        another use waited for it (woken together, the use of another offset could otherwise
        run first and move it away)."""
        awaiting = self._awaiting
        if not awaiting:
            return self._idle
        return [s for s in self._idle if s.position not in awaiting or (awaited and s.position == offset)]

    def _pick(self, offset: Optional[int], idle: List[Slot[T]]) -> Slot[T]:
        if offset is None:
            best = max(idle, key=lambda s: (s.complete, s.position))
        else:
            # Positioned at the offset, else the closest behind it (first of equals: the one
            # idle longest) ...
            behind = [s for s in idle if 0 <= s.position <= offset]
            if behind:
                best = max(behind, key=lambda s: s.position)
                momentum = self._momentum
                if momentum is not None and not momentum(best.instance):
                    # ... unless one with momentum is nearly as close.
                    close = [s for s in behind if best.position - s.position <= self._near and momentum(s.instance)]
                    if close:
                        best = max(close, key=lambda s: s.position)
            elif self._grow_before_rewind:
                best = self._least_useful(idle)
            else:
                best = idle[-1]  # most recently returned
        self._idle.remove(best)
        return best

    def _least_useful(self, idle: List[Slot[T]]) -> Slot[T]:
        """(Under the lock.) The idle instance whose rewinding loses the least. Reads continue
        the instance closest behind them, so each instance serves the offsets between it and
        the next one ahead; without it, those reads would continue from the one behind it. For
        offsets spread evenly, the extra work is (its distance to the one behind) x (its
        distance to the one ahead). The earlier rule, rewinding the instance that had come least
        far, left the instances bunched at the end of a single-frame file, all moving forward:
        simulated with 8 instances and random offsets, 0.32 of the frame decoded per read,
        0.09 with this rule (2 instances: 0.33 -> 0.24)."""
        positions = sorted(s.position for s in idle if s.position >= 0)
        # Without a known end, the instance furthest ahead serves all that lies beyond it.
        end = float("inf") if self.extent is None else max(self.extent, positions[-1] if positions else 0)

        def loss(slot: Slot[T]) -> float:
            if slot.position < 0:
                return -1  # nowhere known: rewinding it loses nothing
            i = bisect.bisect_left(positions, slot.position)
            gap = slot.position - (positions[i - 1] if i > 0 else 0)
            ahead = positions[i + 1] if i + 1 < len(positions) else end
            return gap * (ahead - slot.position) if gap else 0  # (never 0 x infinity)

        return min(idle, key=loss)

    def _grow_here(self, offset: Optional[int], idle: List[Slot[T]]) -> bool:
        """(Under the lock.) Whether this use should get a new instance although some are idle."""
        return (
            self._grow_before_rewind
            and offset is not None
            and self._live < self._max
            and not any(0 <= s.position <= offset for s in idle)
        )

    def _take(self, offset: Optional[int]) -> Slot[T]:
        slot: Optional[Slot[T]] = None
        with self._cond:
            # Sequential readers (the kernel's read-ahead sends several reads of one file at once)
            # should continue on the instance that is about to arrive at their offset rather
            # than make another one decompress the same data again. Bounded: never a deadlock.
            deadline = time.monotonic() + ARRIVAL_WAIT
            awaited = False
            ticket: Optional[object] = None
            try:
                while (
                    offset is not None
                    and offset in self._arriving
                    and not any(s.position == offset for s in self._idle)
                    and not self._closed
                ):
                    if not awaited:
                        awaited = True
                        self._awaiting[offset] = self._awaiting.get(offset, 0) + 1
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                while True:
                    if self._closed:
                        raise ValueError("I/O operation on a closed compressed file")
                    if self._forking:
                        self._cond.wait()
                        continue
                    # A use that waited for the instance arriving at its offset takes it before
                    # the queue: a use of another offset queued meanwhile would move it away.
                    if (
                        not self._queue
                        or self._queue[0] is ticket
                        or (awaited and any(s.position == offset for s in self._idle))
                    ):
                        idle = self._available(offset, awaited)
                        if idle and not self._grow_here(offset, idle):
                            slot = self._pick(offset, idle)
                            break
                        if self._live < self._max:
                            self._live += 1
                            break
                    if ticket is None:
                        ticket = object()
                        self._queue.append(ticket)
                    self._cond.wait()
            finally:
                if awaited:
                    assert offset is not None
                    left = self._awaiting.pop(offset) - 1
                    if left:
                        self._awaiting[offset] = left
                    elif self._queue:
                        self._cond.notify_all()  # an instance kept for this use is free again
                if ticket is not None:
                    self._queue.remove(ticket)
                    if self._queue:
                        self._cond.notify_all()  # the next in line may be served too
        if slot is not None:
            _IDLE.forget(slot)
            return slot
        try:
            return self._create()  # outside the lock: may be slow (imports seek points)
        except BaseException:
            with self._cond:
                self._live -= 1
                self._wake()
            raise

    def _give_back(self, slot: Slot[T], ok: bool) -> None:
        with self._cond:
            keep = ok and not self._closed
            if keep:
                self._idle.append(slot)
            else:
                self._live -= 1
            self._wake()
        if keep:
            _IDLE.touch(self, slot)
        else:
            self._safe_close(slot.instance)

    def _wake(self) -> None:
        """(Under the lock.) An instance is free: wake a use waiting for one; all waiters when
        they queue (only the first in line may take it), when a use waits for an instance to
        arrive at its offset (only that one may take it) or during a fork (which waits among
        the uses it keeps out)."""
        if self._forking or self._queue or self._awaiting:
            self._cond.notify_all()
        else:
            self._cond.notify()

    def _evict(self, slot: Slot[T]) -> None:
        """Close ``slot`` if it is still idle here (called by the process-wide idle limit)."""
        with self._cond:
            if slot not in self._idle:
                return
            self._idle.remove(slot)
            self._live -= 1
            self._wake()
        self._safe_close(slot.instance)

    def retire_idle(self, predicate: Callable[[Slot[T]], bool]) -> None:
        """Close idle instances matching ``predicate`` (e.g. those created before an import)."""
        with self._cond:
            retired = [s for s in self._idle if predicate(s)]
            self._idle = [s for s in self._idle if not predicate(s)]
            self._live -= len(retired)
            self._cond.notify_all()
        for slot in retired:
            _IDLE.forget(slot)
            self._safe_close(slot.instance)

    def _safe_close(self, instance: T) -> None:
        try:
            self._close(instance)
        except Exception as exc:  # closing must not mask the original problem
            logger.debug("Closing a decoder failed: %s", exc)

    def _empty_for_fork(self, deadline: float) -> None:
        """Keep new uses out, wait (until ``deadline``) for those in progress, close every
        instance. ``_resume_after_fork`` lets uses in again."""
        with self._cond:
            self._forking = True
            while self._live > len(self._idle):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    logger.debug("forking while %d decoder(s) are in use", self._live - len(self._idle))
                    break
                self._cond.wait(remaining)
            idle, self._idle = self._idle, []
            self._live -= len(idle)
        for slot in idle:
            _IDLE.forget(slot)
            self._safe_close(slot.instance)

    def _resume_after_fork(self) -> None:
        with self._cond:
            self._forking = False
            self._cond.notify_all()

    def close(self) -> None:
        """Close idle instances now; busy ones are closed when they are given back."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._live -= len(idle)
            self._cond.notify_all()
        for slot in idle:
            _IDLE.forget(slot)
            self._safe_close(slot.instance)
        _LIVE_POOLS.discard(self)
        _CLOSED_AT_FORK.discard(self)


_LIVE_POOLS: "weakref.WeakSet[InstancePool[Any]]" = weakref.WeakSet()
#: The pools made with ``close_before_fork``.
_CLOSED_AT_FORK: "weakref.WeakSet[InstancePool[Any]]" = weakref.WeakSet()


def _new_registries_in_child() -> None:
    """The parent's pools hold decoders whose threads are not in a child: they are parked
    (io/forks.py), never evicted, used or closed there (not at exit either)."""
    global _IDLE, _LIVE_POOLS, _CLOSED_AT_FORK
    _IDLE = _IdleRegistry()
    _LIVE_POOLS = weakref.WeakSet()
    _CLOSED_AT_FORK = weakref.WeakSet()


forks.in_child(_new_registries_in_child)


def _before_fork() -> None:
    deadline = time.monotonic() + FORK_WAIT
    for pool in list(_CLOSED_AT_FORK):
        pool._empty_for_fork(deadline)


def _after_fork_in_parent() -> None:
    for pool in list(_CLOSED_AT_FORK):
        pool._resume_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent)


@atexit.register
def _close_all_pools() -> None:
    for pool in list(_LIVE_POOLS):
        pool.close()

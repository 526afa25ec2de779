"""The decoder pool: a read that starts where another read will end waits for that decoder."""

from __future__ import annotations

import itertools
import threading
import time

import pytest
from conftest import timed_fork

from ratarmountcore.compression import pool as pool_module
from ratarmountcore.compression.pool import InstancePool, Slot


@pytest.fixture(autouse=True)
def patient_arrival_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """A read waits up to ``ARRIVAL_WAIT`` (0.25 s) for a busy decoder to arrive at its offset.
    On a loaded CI machine the threads of these tests can take longer than that to line up, and
    the wait ran out before the decoder was given back (CI: the read of another offset got it
    first). The tests decide when the decoder arrives, so the wait must not end by itself."""
    monkeypatch.setattr(pool_module, "ARRIVAL_WAIT", 30.0)


def make_pool(max_instances: int = 4) -> tuple:
    counter = itertools.count()
    created: list = []

    def create() -> Slot:
        slot: Slot = Slot(instance=next(counter))
        created.append(slot.instance)
        return slot

    return InstancePool(create, lambda instance: None, max_instances), created


def test_read_continuing_a_busy_decoder_waits_for_it() -> None:
    pool, created = make_pool()
    started = threading.Event()

    def first_read() -> None:
        with pool.acquire(0, end=100) as slot:
            started.set()
            time.sleep(0.05)
            slot.position = 100

    thread = threading.Thread(target=first_read)
    thread.start()
    started.wait()
    with pool.acquire(100, end=200) as slot:
        assert slot.position == 100  # the same decoder, already where this read starts
    thread.join()
    assert created == [0]  # no second decoder had to decompress the same data again


def test_unrelated_reads_do_not_wait() -> None:
    pool, created = make_pool()
    started = threading.Event()
    release = threading.Event()

    def long_read() -> None:
        with pool.acquire(0, end=100):
            started.set()
            release.wait(5)

    thread = threading.Thread(target=long_read)
    thread.start()
    started.wait()
    begin = time.monotonic()
    with pool.acquire(5000, end=5100):
        pass
    assert time.monotonic() - begin < 10  # (waiting would take ARRIVAL_WAIT, 30 s)
    release.set()
    thread.join()
    assert created == [0, 1]


def _wait_until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def _waiting(pool: InstancePool) -> int:
    """Threads blocked on the pool's condition (CPython's ``Condition`` keeps one lock each)."""
    return len(pool._cond._waiters)  # type: ignore[attr-defined]


def test_waiters_are_served_in_the_order_they_came() -> None:
    """A thread that gives its instance back and asks again at once queues behind the threads
    already waiting (before, it took the instance back before the woken waiter ran: a small read
    of a shared .tar.bz2 source waited up to 11.7 s behind threads reading whole members)."""
    pool, created = make_pool(max_instances=1)
    order: list = []

    def waiter(name: str) -> None:
        with pool.acquire(0):
            order.append(name)

    first = pool._take(0)
    threads = []
    for number, name in enumerate(("first waiter", "second waiter")):
        threads.append(threading.Thread(target=waiter, args=(name,)))
        threads[-1].start()
        _wait_until(lambda count=number + 1: _waiting(pool) == count)
    pool._give_back(first, True)
    with pool.acquire(0):  # the giver asks again at once: it comes last
        order.append("giver again")
    for thread in threads:
        thread.join(5)
    assert order == ["first waiter", "second waiter", "giver again"]
    assert created == [0] and not pool._queue


def test_a_read_waiting_for_its_decoder_to_arrive_goes_before_the_queue() -> None:
    """The kernel's read-ahead sends the next pieces of a file at once: the read that starts
    where the busy decoder will stop gets that decoder when it arrives, also when a read of
    another offset queued meanwhile (which would otherwise take it and move it away)."""
    pool, created = make_pool(max_instances=1)
    order: list = []
    held = pool._take(0)

    def read(offset: int) -> None:
        with pool.acquire(offset, end=offset + 100) as slot:
            order.append((offset, slot.position))
            slot.position = offset + 100

    pool._arriving[100] = 1  # (as ``acquire(0, end=100)`` announces it)
    continuing = threading.Thread(target=read, args=(100,))
    continuing.start()
    _wait_until(lambda: _waiting(pool) == 1)
    other = threading.Thread(target=read, args=(5000,))
    other.start()
    _wait_until(lambda: _waiting(pool) == 2)
    del pool._arriving[100]
    held.position = 100
    pool._give_back(held, True)
    for thread in (continuing, other):
        thread.join(5)
    assert order == [(100, 100), (5000, 200)]
    assert created == [0]


def test_an_instance_that_arrived_where_a_use_waits_is_kept_for_it() -> None:
    """Woken together with the use that waited for it, a use of another offset that runs first
    must not take the instance (CI, on a loaded machine: it took it and moved it away). Here the
    waiting use is stood for by its mark, so that the other use always comes first."""
    pool, created = make_pool(max_instances=1)
    held = pool._take(0)
    held.position = 100
    pool._awaiting[100] = 1  # (a use of offset 100 waited for it and is about to run)
    pool._give_back(held, True)
    got: list = []
    other = threading.Thread(target=lambda: got.append(pool._take(5000)))
    other.start()
    _wait_until(lambda: _waiting(pool) == 1)
    assert not got  # it waits: the only instance is kept for the use of offset 100
    with pool._cond:  # that use has taken it, used it and given it back
        del pool._awaiting[100]
        pool._wake()
    other.join(5)
    assert got == [held] and created == [0]


def test_a_waiter_that_gives_up_lets_the_next_one_in() -> None:
    """A queued use whose pool is closed leaves the queue; a queued use behind a new instance's
    failed creation is woken and served."""
    attempts = itertools.count()

    def create() -> Slot:
        if next(attempts) == 1:
            raise OSError("cannot open the decoder")
        return Slot(instance="decoder")

    pool: InstancePool = InstancePool(create, lambda _instance: None, 1)
    held = pool._take(0)
    got: list = []

    def use() -> None:
        try:
            with pool.acquire(0) as slot:
                got.append(slot.instance)
        except OSError as exc:
            got.append(str(exc))

    threads = [threading.Thread(target=use) for _ in range(2)]
    for number, thread in enumerate(threads):
        thread.start()
        _wait_until(lambda count=number + 1: _waiting(pool) == count)
    pool._give_back(held, False)  # a failed use: the instance is closed, room for a new one
    for thread in threads:
        thread.join(5)
    assert sorted(got) == ["cannot open the decoder", "decoder"]
    assert not pool._queue and pool.live_instances == 1


def test_forward_only_instances_spread_instead_of_rewinding() -> None:
    """With ``grow_before_rewind`` a use with nothing idle behind its offset gets a new instance
    (up to the limit); beyond it, the instance whose rewinding loses the least is rewound (with
    no known end, never the one furthest ahead)."""
    made: list = []

    def create() -> "Slot[int]":
        made.append(len(made))
        return Slot(made[-1], position=-1)

    pool: InstancePool[int] = InstancePool(create, lambda _i: None, 3, grow_before_rewind=True)
    for offset in (900, 500, 100):  # each lies before every idle instance: three instances
        with pool.acquire(offset) as slot:
            slot.position = offset + 10
    assert len(made) == 3
    with pool.acquire(700) as slot:  # behind it: the one at 510
        assert slot.position == 510
        slot.position = 710
    with pool.acquire(50) as slot:  # nothing behind, no room: 110 loses 110 x 600, 710 600 x 200
        assert slot.position == 110
    assert len(made) == 3
    plain: InstancePool[int] = InstancePool(create, lambda _i: None, 3)
    with plain.acquire(900) as slot:
        slot.position = 910
    with plain.acquire(100) as slot:  # without the option an idle instance is taken
        assert slot.position == 910


def test_the_instance_rewound_is_the_one_whose_territory_is_smallest() -> None:
    """Reads continue the instance closest behind them, so an instance is worth the offsets
    between it and the next one ahead times how far back the one behind it is. Two instances
    side by side near the end: one of them is rewound, not the lone one that serves the first
    part of the file (the instance that had come least far, the earlier rule, left all of them
    bunched at the end)."""
    pool: InstancePool[int] = InstancePool(lambda: Slot(0, position=-1), lambda _i: None, 3, grow_before_rewind=True)
    pool.extent = 1000
    slots = []
    for _ in range(3):
        slots.append(pool._take(None))  # three instances, placed by hand
    for slot, position in zip(slots, (100, 800, 805)):
        slot.position = position
        pool._give_back(slot, True)
    with pool.acquire(50) as slot:  # nothing behind: 100 loses 100 x 700, 800 700 x 5, 805 5 x 195
        assert slot.position == 805
        slot.position = 50
    with pool.acquire(90) as slot:  # behind it now: the one at 50
        assert slot.position == 50


def test_an_instance_with_momentum_is_preferred_when_nearly_as_close() -> None:
    """A reader of members in archive order skips a header between reads; when it reaches an
    idle instance left there by a random read, it keeps the instance that decodes ahead for it
    (``momentum``) if that one is at most ``near`` bytes further behind."""
    for momentum, expected in ((lambda instance: instance == "ahead", 1000), (None, 1010)):
        pool: InstancePool[str] = InstancePool(
            lambda: Slot("", position=-1), lambda _i: None, 2, grow_before_rewind=True, momentum=momentum, near=64
        )
        first, second = pool._take(None), pool._take(None)
        first.instance, first.position = "ahead", 1000
        second.instance, second.position = "plain", 1010
        pool._give_back(first, True)
        pool._give_back(second, True)
        with pool.acquire(1010) as slot:
            assert slot.position == expected
            slot.position = 2000
        with pool.acquire(2100) as slot:  # more than ``near`` apart: the closest, momentum or not
            assert slot.position == 2000


def test_a_fork_waits_for_uses_and_closes_every_instance_first() -> None:
    """Pools whose instances run threads that call into Python hold none at a fork (see
    pool.py): the fork waits for the use in progress, keeps other uses out until it is done,
    closes the instances, and the parent makes new ones afterwards."""
    counter = itertools.count()
    closed: list = []
    pool: InstancePool = InstancePool(lambda: Slot(instance=next(counter)), closed.append, 1, close_before_fork=True)
    busy = threading.Event()
    events: list = []

    def long_use() -> None:
        with pool.acquire(None):  # instance 0, busy when the fork starts
            busy.set()
            time.sleep(1.0)
            events.append("use ended")

    def waiting_use() -> None:
        with pool.acquire(None) as slot:  # waits for the only instance, from before the fork
            events.append(("waiting use", slot.instance))

    threads = [threading.Thread(target=long_use), threading.Thread(target=waiting_use)]
    threads[0].start()
    busy.wait(10)
    threads[1].start()
    time.sleep(0.1)
    waited = timed_fork()
    for thread in threads:
        thread.join()
    # (The use given back must wake the fork, not only the use waiting before it.)
    assert 0.3 <= waited < 5, waited
    assert closed == [0]
    assert events == ["use ended", ("waiting use", 1)]  # after the fork, on a new instance
    pool.close()

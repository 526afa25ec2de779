"""The decoder pool: a read that starts where another read will end waits for that decoder."""

from __future__ import annotations

import itertools
import threading
import time

from ratarmountcore.compression.pool import InstancePool, Slot


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
    assert time.monotonic() - begin < 0.2
    release.set()
    thread.join()
    assert created == [0, 1]

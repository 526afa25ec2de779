"""READ requests answered off libfuse's worker threads once all but one of them are reading.

The loop has one worker per core (``workers.py``). A read may wait long: a bzip2 block
decoded, an xz block decoded from its start, a cold read on a parallel file system. Reads like
that could take every worker, and each lookup, stat and listing then waited behind them. On 2
cores, with 4 threads reading large members of a .tar.bz2, a ``listdir`` or ``lstat`` took 0.73
s (median; up to 2.8 s) with the 2 default workers, 0.25 s with 4, 0.1 ms with 16 (session 33).
So a READ that would leave no worker free is handed to a thread of a pool of our own, which
replies from there (libfuse lets any thread reply to a request), and the worker goes back to
the queue for the next request. Reads that leave a worker free, such as a single reader's, stay
on the worker: a hand-off costs a thread switch.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

logger = logging.getLogger(__name__)


class ReadHandOff:
    """Runs READ answers on the calling worker while at least one other worker is free
    (``workers`` in all), else on one of ``threads`` threads of its own (made when first needed)."""

    def __init__(self, workers: int, threads: int) -> None:
        self._inline_max = max(0, workers - 1)
        self._threads = max(1, threads)
        self._inline = 0
        self._lock = threading.Lock()
        self._executor: Optional[ThreadPoolExecutor] = None
        self.handed_off = 0  #: answers run by the pool so far (for tests and the debug log)

    def run(self, answer: Callable[..., None], *args: Any) -> None:
        """Run ``answer(*args)`` (which replies to its request and raises nothing) here or in
        the pool."""
        with self._lock:
            inline = self._inline < self._inline_max
            if inline:
                self._inline += 1
            else:
                self.handed_off += 1
                executor = self._executor or self._make_executor()
        if not inline:
            executor.submit(answer, *args)
            return
        try:
            answer(*args)
        finally:
            with self._lock:
                self._inline -= 1

    def _make_executor(self) -> ThreadPoolExecutor:
        # (under the lock) Imported only here: most mounts never need the pool.
        from concurrent.futures import ThreadPoolExecutor

        logger.debug("the workers are all reading: further reads go to %d threads of their own", self._threads)
        self._executor = ThreadPoolExecutor(max_workers=self._threads, thread_name_prefix="ratarmount-read")
        return self._executor

    def close(self) -> None:
        """Wait for the reads handed off to be answered (before the session is destroyed: a
        reply needs it)."""
        with self._lock:
            executor = self._executor
        if executor is not None:
            executor.shutdown(wait=True)

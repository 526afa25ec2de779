"""Worker threads of libfuse's multi-threaded loop: how many, from ``-o max_threads=N``.

Kept apart from ``lowlevel.py`` so that the CLI can check the options before it opens (and
maybe indexes) an archive, without loading libfuse.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Tuple

from ratarmountcore.errors import RatarmountError

#: ``-o`` options of libfuse's multi-threaded loop (``fuse_loop_config``).
LOOP_OPTIONS = ("max_threads", "max_idle_threads")
#: At most this many worker threads by default, however many cores there are.
MAX_THREADS_CAP = 16


def default_max_threads() -> int:
    """One worker thread per usable core (at least 2, at most ``MAX_THREADS_CAP``).

    Python runs one thread at a time, and every worker woken by a request wants the GIL at
    once; more workers than cores only queue for it, handing it over at every ``pread`` and
    SQLite call. Measured on 2 cores, 8 processes reading 4,000 random files from a fresh
    mount (median of 4, interleaved): 2 threads 0.73 s, 3: 0.78 s, 4: 0.86 s, 8: 1.05 s, 32
    (libfuse's usual setting): 1.14-1.16 s; one reader, a stat of every file and ``find`` did
    not change. A second thread is needed: one lookup may wait for the listing that another
    worker serves (``lowlevel_ops``). Storage with long latencies (a cold parallel file
    system) may want more reads in flight: ``-o max_threads=N``."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 2
    return max(2, min(cores, MAX_THREADS_CAP))


def loop_threads(fuse_options: Dict[str, Any]) -> Tuple[int, int]:
    """``-o max_threads=N,max_idle_threads=M``: the loop's worker threads at most (default
    ``default_max_threads``), and idle ones kept (default: all of them). libfuse 3.12+ takes
    them through ``fuse_loop_config``, not ``fuse_session_new``."""
    values: List[int] = []
    for key in LOOP_OPTIONS:
        text = fuse_options.get(key, values[0] if values else default_max_threads())
        try:
            value = int(text)
        except (TypeError, ValueError):
            value = -1
        if value < 1:
            raise RatarmountError(f"-o {key}={text}: expected a whole number of threads, at least 1")
        values.append(value)
    return values[0], values[1]

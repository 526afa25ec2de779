"""Sources used on both sides of a ``fork``: a PyTorch DataLoader's workers, multiprocessing.

A source opened before a fork holds decompressors whose worker threads exist only in the parent
(rapidgzip's thread pools, our read-ahead threads), locks that one of those threads may have held
at the moment of the fork, and SQLite connections, which must not be used on both sides. In the
child, none of that may be used -- a read would wait forever for a thread that is not there -- and
none of it may be freed either: rapidgzip's destructor joins its threads and aborts the process
when they are missing.

So every fork bumps a generation number (``os.register_at_fork``; cheap: the child may be about to
``exec``), and a source checks it on each use: made in an older generation, it first makes its
decompressors, index connections and locks anew from the archive's open descriptor and its index
(no re-indexing), and ``park``s the old ones, which are kept referenced for the rest of the process
so that nothing frees them.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, List

#: Bumped in the child after every fork; compare with ``generation`` (a plain int: cheap).
generation = 0

_parked: List[Any] = []
_lock = threading.Lock()
_child_hooks: List[Callable[[], None]] = []


def _after_fork_in_child() -> None:
    global generation, _lock
    generation += 1
    _lock = threading.Lock()  # (another thread of the parent may have held it)
    for hook in _child_hooks:
        hook()


def in_child(hook: Callable[[], None]) -> None:
    """Run ``hook`` in every child right after a fork (to replace a module's process-wide objects:
    registries, their locks). It must not block, and must not use what it replaces."""
    _child_hooks.append(hook)


def renewal_lock() -> threading.Lock:
    """A lock of this process for making things anew after a fork."""
    return _lock


def park(*objects: Any) -> None:
    """Keep ``objects`` alive for the rest of this process: they came from the parent and must be
    neither used nor freed here. Their reference counts are raised once more, so even the
    interpreter's shutdown does not free them."""
    try:
        import ctypes

        incref = ctypes.pythonapi.Py_IncRef
    except (ImportError, AttributeError):  # (kept in the list, at least until the shutdown)
        incref = None
    for obj in objects:
        if obj is not None:
            if incref is not None:
                incref(ctypes.py_object(obj))
            _parked.append(obj)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

"""File descriptors: a union of many archives needs one per archive and one per connection to
an index (idle ones are closed when few descriptors are left: ``index/pool.make_room``; more
while threads read at once), and 1,024 -- the soft limit most
distributions set -- is reached by a union of ImageNet's 1,000 class tars. The mount raises its
soft limit to the hard one (which a process may always do), and running out is reported as that,
not as whatever the failed open was about to do."""

from __future__ import annotations

import errno
import logging
import os
from typing import Tuple

from ..errors import TooManyOpenFilesError

logger = logging.getLogger(__name__)


def limits() -> Tuple[int, int]:
    """The soft and hard RLIMIT_NOFILE (-1 each where there is none to read)."""
    try:
        import resource

        return resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return -1, -1


def raise_soft_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; the soft limit in effect afterwards."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard > soft:
            target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            logger.debug("Open files: soft limit %d -> %d", soft, target)
            return target
        return soft
    except (ImportError, OSError, ValueError) as exc:
        logger.debug("Cannot raise the open-file limit: %s", exc)
        return limits()[0]


#: Descriptors an open may need at once (SQLite: the database, its journal, a temporary file).
HEADROOM = 4


def too_many(what: str) -> TooManyOpenFilesError:
    """The error for running out of descriptors while doing ``what``, with the limit and the
    remedy."""
    soft, _hard = limits()
    return TooManyOpenFilesError(
        errno.EMFILE,
        f"{what}: too many open files (this process may open {soft}); "
        "raise the limit with `ulimit -n` or mount fewer archives together",
    )


def raise_if_exhausted(exc: OSError, what: str) -> None:
    """Re-raise ``exc`` as TooManyOpenFilesError when it says the process (EMFILE) or the system
    (ENFILE) ran out of descriptors. For the callers that turn a failed open into an answer --
    "no such file", "not an archive", an empty folder -- which would then be a wrong one."""
    if isinstance(exc, TooManyOpenFilesError):
        raise exc
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        raise too_many(what) from None


def check_left(what: str, need: int = HEADROOM) -> None:
    """Raise TooManyOpenFilesError naming ``what`` when this process has fewer than ``need``
    descriptors left -- called after an open failed for a reason the failing library did not
    say (SQLite's "unable to open database file"; the failed call may have freed what it had
    opened, hence the look for ``HEADROOM`` descriptors rather than for one), and before a mount
    starts serving with what it opened."""
    opened = []
    try:
        for _ in range(need):
            opened.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
    except OSError as exc:
        raise_if_exhausted(exc, what)
    finally:
        for fd in opened:
            os.close(fd)


def scarce(reserve: int, fraction: int) -> bool:
    """Whether at most ``reserve`` descriptors and a ``fraction``-th of the limit may be left
    (cheap: one open and close). The lowest free descriptor number counts the open ones below
    it, so this never misses a process that opened descriptors one after another up to near its
    limit; one whose free numbers are holes left by closes has that many spare anyway."""
    soft, _hard = limits()
    if soft <= 0:
        return False
    try:
        fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return True
    os.close(fd)
    return soft - fd <= reserve + soft // fraction

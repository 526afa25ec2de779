"""File descriptors: a union of many archives needs about two per archive (the archive, one
connection to its index; more while threads read at once), and 1,024 -- the soft limit most
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


def check_left(what: str) -> None:
    """Raise TooManyOpenFilesError naming ``what`` when this process has (almost) no descriptor
    left -- called after an open failed for a reason the failing library did not say (SQLite's
    "unable to open database file"). The failed call may have freed what it had opened, hence
    the look for ``HEADROOM`` descriptors rather than for one."""
    opened = []
    try:
        for _ in range(HEADROOM):
            opened.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            soft, _hard = limits()
            raise TooManyOpenFilesError(
                errno.EMFILE,
                f"{what}: too many open files (this process may open {soft}); "
                "raise the limit with `ulimit -n` or mount fewer archives together",
            ) from None
    finally:
        for fd in opened:
            os.close(fd)

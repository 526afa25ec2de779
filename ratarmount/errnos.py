"""The errno a failed FUSE request answers with (shared by both front-ends)."""

from __future__ import annotations

import errno

from ratarmountcore.errors import RatarmountError


def errno_of(exc: BaseException) -> int:
    """Our errors carry their errno; OSErrors theirs; anything unexpected is EIO."""
    if isinstance(exc, RatarmountError):
        return exc.errno_code
    if isinstance(exc, OSError) and exc.errno:
        return exc.errno
    return errno.EIO

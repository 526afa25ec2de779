"""ratarmountcore: read-only file trees over archives, usable from Python without FUSE.

>>> import ratarmountcore
>>> with ratarmountcore.open("train.tar") as src:      # doctest: +SKIP
...     names = src.listdir("/")
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

from .errors import RatarmountError
from .options import CompressionOptions, IndexOptions, OpenOptions
from .sources.base import FileInfo, MountSource

__version__ = "0.1.0"

__all__ = [
    "CompressionOptions",
    "FileInfo",
    "IndexOptions",
    "MountSource",
    "OpenOptions",
    "RatarmountError",
    "__version__",
    "open",
]


def open(  # noqa: A001 - the natural name for the entry point
    source: Union[str, Sequence[str]], options: Optional[OpenOptions] = None
) -> MountSource:
    """Open an archive (or a list of them, union-mounted; later ones win) as a ``MountSource``."""
    from .sources.factory import open_source

    return open_source(source, options or OpenOptions())

"""Typed option objects built once by the CLI (or a Python caller) and passed down as is."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional, Tuple


@dataclass(frozen=True)
class IndexOptions:
    #: Explicit index path; overrides the folder search.
    index_file: Optional[str] = None
    #: Folders to look for / write the index in, in order. "" means "beside the archive".
    #: The default is beside the archive, then ~/.cache/ratarmount.
    index_folders: Tuple[str, ...] = ("", "~/.cache/ratarmount")
    #: Rebuild even when a valid index exists.
    recreate: bool = False
    #: Show a progress bar on stderr while indexing (only when stderr is a terminal).
    progress: bool = True


@dataclass(frozen=True)
class CompressionOptions:
    #: Threads for parallel decompression; 0 means all cores.
    parallelization: int = 0
    #: Preferred gzip backend: "rapidgzip" or "indexed_gzip" (None: best available).
    gzip_backend: Optional[str] = None
    #: Spacing of gzip seek points in bytes (rapidgzip: of compressed data; indexed_gzip: of
    #: decompressed data). None: the backend's default, and an index built with any spacing is
    #: used as it is; a value given here rebuilds an index built with another.
    seek_point_spacing: Optional[int] = None
    #: Decoded data kept (bytes; one bound for all compressed files of the process) so that reads
    #: near each other decode once;
    #: 0 disables the cache.
    cache_size: int = 32 * 1024 * 1024

    def threads(self) -> int:
        return self.parallelization if self.parallelization > 0 else (os.cpu_count() or 1)


@dataclass(frozen=True)
class OpenOptions:
    index: IndexOptions = field(default_factory=IndexOptions)
    compression: CompressionOptions = field(default_factory=CompressionOptions)
    #: Mount archives found inside archives as directories.
    recursive: bool = False
    #: With ``recursive``, open (and index) the archives in a folder source when first used
    #: instead of when the folder is opened (thousands of archives, few of them read).
    lazy: bool = False
    #: With ``recursive``, show an archive ``NAME.tar`` (inside an archive, or in a folder source)
    #: as the folder ``NAME``: ImageNet's class tars as folders named by their class alone.
    strip_tar_extension: bool = False

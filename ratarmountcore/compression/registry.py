"""Which library opens which compression: a table, consulted in order.

Backends are referenced as ``"module:attribute"`` strings and imported only when a file of their
format is opened, so importing ratarmountcore never imports a decompression library. A missing
library gives one line saying what to install.
"""

from __future__ import annotations

import importlib
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple, cast

from ..errors import MissingBackendError, UnsupportedFormatError
from ..formats import FormatId
from ..options import CompressionOptions
from .base import CompressedReader, PlainFile, gzip_zero_padded

logger = logging.getLogger(__name__)

OpenFunction = Callable[[str, PlainFile, CompressionOptions], CompressedReader]


@dataclass(frozen=True)
class BackendInfo:
    name: str
    formats: Tuple[FormatId, ...]
    #: Python modules that must be importable.
    required_modules: Tuple[str, ...]
    #: ``"module:attribute"`` of the ``CompressedReader`` class (relative to this package).
    open: str
    #: What to tell a user who lacks ``required_modules``.
    install_hint: str

    def missing_modules(self) -> List[str]:
        missing = []
        for module in self.required_modules:
            try:
                importlib.import_module(module)
            except ImportError:
                missing.append(module)
        return missing

    def is_available(self) -> bool:
        return not self.missing_modules()

    def reader_class(self) -> "type[CompressedReader]":
        module_name, _, attribute = self.open.partition(":")
        module = importlib.import_module(module_name, __package__)
        return cast("type[CompressedReader]", getattr(module, attribute))


#: Preference order within a format: the first available backend wins.
BACKENDS: "OrderedDict[str, BackendInfo]" = OrderedDict(
    (info.name, info)
    for info in (
        BackendInfo("rapidgzip", (FormatId.GZIP,), ("rapidgzip",), ".gzip:RapidgzipReader", "pip install rapidgzip"),
        BackendInfo(
            "indexed_gzip", (FormatId.GZIP,), ("indexed_gzip",), ".gzip:IndexedGzipReader", "pip install indexed_gzip"
        ),
        BackendInfo(
            "rapidgzip_bzip2", (FormatId.BZIP2,), ("rapidgzip",), ".bzip2:Bzip2Reader", "pip install rapidgzip"
        ),
        BackendInfo("zstandard", (FormatId.ZSTD,), ("zstandard",), ".zstd:ZstdReader", "pip install zstandard"),
        BackendInfo("python_xz", (FormatId.XZ,), ("xz",), ".xz:XzReader", "pip install python-xz"),
    )
)

#: ``CompressionOptions.gzip_backend`` values and the backend they select.
GZIP_BACKEND_CHOICES: Dict[str, str] = {"rapidgzip": "rapidgzip", "indexed_gzip": "indexed_gzip"}


def candidates(fmt: FormatId, options: CompressionOptions) -> List[BackendInfo]:
    """Backends for ``fmt`` in the order they are tried."""
    found = [info for info in BACKENDS.values() if fmt in info.formats]
    if fmt is FormatId.GZIP and options.gzip_backend:
        wanted = GZIP_BACKEND_CHOICES.get(options.gzip_backend)
        if wanted is None:
            choices = ", ".join(sorted(GZIP_BACKEND_CHOICES))
            raise ValueError(f"unknown gzip backend {options.gzip_backend!r}; choose one of {choices}")
        found = [info for info in found if info.name == wanted]  # an explicit choice is not overridden
    return found


def select_backend(fmt: FormatId, options: CompressionOptions, path: str = "") -> BackendInfo:
    tried = candidates(fmt, options)
    if not tried:
        raise UnsupportedFormatError(f"{path + ': ' if path else ''}{fmt.value}-compressed files are not supported")
    for info in tried:
        missing = info.missing_modules()
        if not missing:
            return info
        logger.debug("Backend %s unavailable (missing %s)", info.name, ", ".join(missing))
    hints = " or ".join(f"`{info.install_hint}`" for info in tried)
    raise MissingBackendError(
        f"{path + ': ' if path else ''}reading {fmt.value}-compressed archives needs a library that is not "
        f"installed: {hints}"
    )


def open_compressed(
    path: str,
    raw: PlainFile,
    fmt: FormatId,
    options: CompressionOptions,
    backend: Optional[str] = None,
) -> CompressedReader:
    """A ``CompressedReader`` for ``raw`` (an open ``PlainFileReader``, which it takes over), with
    ``backend`` (a name of ``BACKENDS``), else the first installed one for ``fmt``: for gzip,
    indexed_gzip when the file is padded with zeros (``_zero_padded``), which rapidgzip refuses."""
    info = BACKENDS[backend] if backend else select_backend(fmt, options, path)
    if backend and not info.is_available():
        raise MissingBackendError(f"{path}: backend {backend} is not installed: `{info.install_hint}`")
    if not backend and info.name == "rapidgzip" and not options.gzip_backend and _zero_padded(path, raw):
        info = BACKENDS["indexed_gzip"]
    reader = info.reader_class()(path, raw, options)
    logger.debug("Opened %s with backend %s", path, info.name)
    return reader


def _zero_padded(path: str, raw: PlainFile) -> bool:
    """Whether a gzip file ends with zero-byte padding (as tape tools write; gzip(1) ignores
    it), which rapidgzip refuses: then indexed_gzip, which reads past it, decodes the file (one
    thread, where rapidgzip would use all cores), when it is installed."""
    if not gzip_zero_padded(raw) or not BACKENDS["indexed_gzip"].is_available():
        return False
    logger.warning(
        "%s ends with zero bytes after its gzip data (padding, as tape tools write), which rapidgzip does not "
        "accept: decoding it with indexed_gzip (one thread)",
        path,
    )
    return True


def available_backends() -> Dict[str, bool]:
    """Backend name -> importable (imports the libraries)."""
    return {name: info.is_available() for name, info in BACKENDS.items()}

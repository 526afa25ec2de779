"""Compression backends (placeholder until issue 3 lands: only plain tar is supported)."""

from __future__ import annotations

from typing import Any

from ..errors import UnsupportedFormatError
from ..formats import FormatId
from ..options import CompressionOptions


def open_compressed(path: str, raw: Any, fmt: FormatId, options: CompressionOptions) -> Any:
    raise UnsupportedFormatError(f"{fmt.value}-compressed archives are not supported yet")

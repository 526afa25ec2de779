"""Argument types of the command lines: sizes in MiB and counts, checked when parsed (``inf`` or
``nan`` went on to ``int()`` and ended in a traceback)."""

from __future__ import annotations

import argparse
import math

#: The largest size an option takes, in MiB (1 TiB).
MAX_MIB = float(1 << 20)


def _mib(text: str, *, zero: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero) or value > MAX_MIB:
        wanted = "0 or more" if zero else "more than 0"
        raise argparse.ArgumentTypeError(f"{text!r}: a size in MiB, {wanted} and at most {MAX_MIB:.0f}")
    return value


def positive_mib(text: str) -> float:
    """A size in MiB above 0."""
    return _mib(text, zero=False)


#: The smallest frame ``ratarmount-convert`` writes, in MiB (64 KiB): smaller frames read no
#: faster (a frame of 64 KiB decodes in ~0.1 ms) but compress worse and grow the index (frames of
#: one byte, from ``--frame-size 0.0000001``, made a 300 KB tar a 4.3 MB file with a 13.6 MB
#: index: found by fuzzing).
MIN_FRAME_MIB = 1 / 16


def frame_mib(text: str) -> float:
    """A zstd frame size in MiB, at least ``MIN_FRAME_MIB``."""
    value = _mib(text, zero=False)
    if value < MIN_FRAME_MIB:
        raise argparse.ArgumentTypeError(f"{text!r}: frames of at least {MIN_FRAME_MIB} MiB (64 KiB)")
    return value


def mib(text: str) -> float:
    """A size in MiB, 0 or more."""
    return _mib(text, zero=True)


def threads(text: str) -> int:
    """A number of threads: 0 (the usable cores, at most 16) or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: 0 (the usable cores) or more")
    return value


#: zstd's compression levels: 1 (fast) to 22 (small); negative levels trade ratio for speed.
ZSTD_LEVELS = (-(1 << 17), 22)


def zstd_level(text: str) -> int:
    """A zstd compression level (0 is zstd's default, 3)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    low, high = ZSTD_LEVELS
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"{text!r}: a zstd level, 1 to {high} (or negative, faster)")
    return value

"""ratarmount: command line and FUSE front-end over ratarmountcore."""

from ratarmountcore import __version__

__all__ = ["__version__"]

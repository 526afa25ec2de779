from .entry import ratarmount

raise SystemExit(ratarmount())

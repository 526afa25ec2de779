"""Which folders are listed ahead of a walk, and which lookups wait for those listings
(``ratarmount/folder_readahead.py``; through the mount: ``test_cli.py``)."""

from __future__ import annotations

import stat
from typing import List, Optional, Tuple

from ratarmount.folder_readahead import DEPTH, FolderReadAhead

FOLDER = stat.S_IFDIR | 0o755
FILE = stat.S_IFREG | 0o644


class Tree:
    """A parent's entries in listing order: folders d00..d09 with a file among them, and what
    was asked for."""

    def __init__(self) -> None:
        self.rows: List[Tuple[bytes, int, int]] = []
        for i in range(10):
            self.rows.append((f"d{i:02d}".encode(), FOLDER, 100 + i))
            if i == 4:
                self.rows.append((b"d04.txt", FILE, 200))  # (not a folder: never listed ahead)
        self.asked: List[Tuple[str, bytes, int]] = []

    def names_after(self, parent: str, after: bytes, limit: int) -> Optional[List[Tuple[bytes, int, int]]]:
        self.asked.append((parent, after, limit))
        return [row for row in self.rows if row[0] > after][:limit]


def test_a_walk_is_followed_once_it_goes_from_one_folder_to_the_next() -> None:
    tree = Tree()
    ahead = FolderReadAhead(tree.names_after, depth=3)
    assert ahead.after_run("/top/d00") == []  # a first run: nothing known about a walk yet
    assert ahead.after_run("/top/d05") == []  # not the folder after d00: a random one
    # The folder after d05: a walk. The next three folders go ahead of it, the file skipped.
    assert ahead.after_run("/top/d06") == [("/top/d07", 107), ("/top/d08", 108), ("/top/d09", 109)]
    assert ahead.after_hit("/top/d07") == []  # d08, d09 were handed over already, no d10
    assert ahead.after_run("/top/d09") == []  # never twice


def test_the_window_moves_with_the_lookups_in_folders_listed_ahead() -> None:
    tree = Tree()
    ahead = FolderReadAhead(tree.names_after, depth=2)
    ahead.after_run("/top/d01")
    assert ahead.after_run("/top/d02") == [("/top/d03", 103), ("/top/d04", 104)]
    assert ahead.after_hit("/top/d03") == [("/top/d05", 105)]  # (d04.txt is a file)
    # A walk faster than the listings finds d04 and d05 listed and looks nothing up there: its
    # next run, in d06, is where the window would go next, and it goes on from there.
    assert ahead.after_run("/top/d06") == [("/top/d07", 107), ("/top/d08", 108)]
    # The parent's entries were read once, then found again among those read.
    assert [asked[:2] for asked in tree.asked] == [("/top", b"d01")]


def test_folders_of_the_root_are_followed_too() -> None:
    tree = Tree()
    ahead = FolderReadAhead(tree.names_after)
    assert ahead.after_run("/") == []
    ahead.after_run("/d00")
    assert ahead.after_run("/d01") == [(f"/d{i:02d}", 100 + i) for i in range(2, 2 + DEPTH)]
    assert tree.asked[0][0] == "/"


def test_a_lookup_waits_only_until_the_listing_is_made() -> None:
    """Names looked up before the prefetcher's listing is made are left out of it (their lookups
    wait for it); once it is made, a lookup must not wait, and one that comes after the folder
    was listed is an ordinary lookup."""
    ahead = FolderReadAhead(Tree().names_after)
    assert ahead.join(7, b"x") is None  # not handed over
    pending = ahead.add(7, "/top/d07")
    joined = ahead.join(7, b"f1")
    assert joined is pending and not pending.built
    assert ahead.join(7, b"f2") is pending  # (another process's lookup, at the same time)
    assert ahead.claim(7) == {b"f1", b"f2"} and pending.built
    ahead.drop(7)
    assert ahead.claim(7) == frozenset() and ahead.join(7, b"f3") is None

    late = ahead.add(8, "/top/d08")
    assert ahead.claim(8) == frozenset()
    assert ahead.join(8, b"f1") is late and late.built and late.names == frozenset()
    assert 8 not in ahead.pending  # (the walk is there: nothing left to wait for)

    listed = ahead.add(9, "/top/d09")
    listed.done.set()
    assert ahead.join(9, b"f1") is None and 9 not in ahead.pending


def test_the_listing_counts_as_linked_once_the_kernel_asks_past_its_end() -> None:
    """The kernel asks for the page after the last one only once it linked every entry: the
    lookups waiting for the listing need not wait for that page's answer."""
    ahead = FolderReadAhead(Tree().names_after)
    pending = ahead.add(5, "/top/d05")
    ahead.linked(5, 3)  # (rows not read yet: the end is not known)
    assert not pending.done.is_set()
    pending.end = 2 + 60
    ahead.linked(5, 62)  # (not made yet: a request of another process, from its cache)
    assert not pending.done.is_set()
    ahead.claim(5)
    ahead.linked(5, 40)  # the first page's entries only
    assert not pending.done.is_set()
    ahead.linked(5, 62)
    assert pending.done.is_set()
    ahead.linked(6, 62)  # (not handed over: nothing to do)

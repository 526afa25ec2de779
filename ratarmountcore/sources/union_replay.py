"""What ``tar -x`` of a union's sources, one after the other into an empty folder, leaves at a
path: the rule a union with folder sources applies name by name, from the top of the path down.

The union table keeps one winner per name, which is enough for archives alone (the table drops
what a later archive's file replaces while it is built). With folder sources, whose trees may
change while mounted, what a name was before each archive is known only at lookup time, so the
table also keeps every archive's kind of entry at the names some archive has as a folder
(``kinds``), and a lookup settles each name of the path from those claims and the folder
sources' entries as they are now:

- a file, link or device replaces whatever was there; nothing below the name from it or from
  the sources before it stays (the *floor* rises to it); except a folder that holds something,
  which tar cannot remove ("File exists"): the file is refused, and the folder stays as it is;
- a folder replaces a file (and starts empty: the floor stays at that file) or merges with a
  folder (the later one's attributes);
- a folder only implied by an archive's member paths creates the folder where there is nothing,
  changes nothing where there is a folder, and where there is a file tar refuses every member of
  that archive below the name ("Not a directory"): the archive is *excluded* from the levels
  below.
"""

from __future__ import annotations

from typing import Callable, FrozenSet, Iterable, List, NamedTuple, Optional

from .base import FileInfo

#: Kinds of claims (the union table's ``kinds.kind``).
FILE, FOLDER, IMPLIED = 0, 1, 2


class Claim(NamedTuple):
    source: int
    kind: int
    #: The entry, when the claim came with it (a folder source's); None: looked up when needed.
    info: Optional[FileInfo] = None


class Settled(NamedTuple):
    """A name after every source: who has it, and what the names below it may come from."""

    owner: Claim
    #: Sources up to this one have nothing below the name (-1: none).
    floor: int
    #: Sources whose members below the name tar refused.
    excluded: FrozenSet[int]

    @property
    def is_dir(self) -> bool:
        return self.owner.kind != FILE


#: The root: every source's members count.
ROOT = Settled(Claim(-1, FOLDER), -1, frozenset())


def settle(
    claims: Iterable[Claim], above: Settled, holds: Callable[[Claim], bool] = lambda claim: claim.kind == IMPLIED
) -> Optional[Settled]:
    """The name that ``claims`` (each source's entry of that name, any order) make below the
    folder ``above``; None when no source it lets through has the name. Claims of sources at or
    below ``above.floor`` or excluded above are ignored. ``holds``: whether a folder claim's
    source has something below the name (asked only where a later file meets the folder)."""
    owner: Optional[Claim] = None
    floor = above.floor
    excluded = above.excluded
    folders: List[Claim] = []  # the folder claims merged since the last file: what the folder holds
    for claim in sorted(c for c in claims if c.source > above.floor and c.source not in above.excluded):
        if claim.kind == FILE:
            if owner is not None and owner.kind != FILE and any(holds(c) for c in folders):
                continue  # tar -x cannot remove a folder that is not empty: "File exists"
            owner, floor = claim, claim.source
            folders = []
        elif claim.kind == FOLDER:
            owner = claim
            folders.append(claim)
        elif owner is None:
            owner = claim
            folders.append(claim)
        elif owner.kind == FILE:
            excluded = excluded | {claim.source}
        else:
            folders.append(claim)
    return None if owner is None else Settled(owner, floor, excluded)

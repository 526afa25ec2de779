-- ratarmount index, format version recorded in metadata('format_version').
-- Paths are stored as BLOBs (UTF-8 with surrogateescape) so that non-UTF-8 member names
-- survive byte for byte. Idempotent: safe to run on an existing database.

-- Marks the file as ours (the bytes "RMix" in the database header), so that an index another
-- program wrote under the same name is recognized and never overwritten.
PRAGMA application_id = 1380804984;

CREATE TABLE IF NOT EXISTS metadata (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- One row per archive member (and per implicit directory). "id" is the order of appearance,
-- so among rows with the same (parent, name) the largest id is the version a user sees and
-- ascending ids enumerate PATH.versions/1, 2, ...
CREATE TABLE IF NOT EXISTS files (
    id            INTEGER PRIMARY KEY,
    parent        BLOB    NOT NULL,   -- "/a/b" for "/a/b/c"; "/" for top-level; "" for the root itself
    name          BLOB    NOT NULL,
    kind          TEXT    NOT NULL,   -- f d l c b p (hard links are resolved to their target's kind)
    mode          INTEGER NOT NULL,   -- st_mode including the type bits
    size          INTEGER NOT NULL,
    mtime_ns      INTEGER NOT NULL,
    uid           INTEGER NOT NULL,
    gid           INTEGER NOT NULL,
    nlink         INTEGER NOT NULL DEFAULT 1,
    ino           INTEGER NOT NULL DEFAULT 0,   -- shared by hard links to the same data
    linkname      BLOB    NOT NULL DEFAULT x'',
    offset_header INTEGER NOT NULL,   -- -1 for folders only implied by member paths
    offset_data   INTEGER NOT NULL,
    sparse        BLOB,                         -- packed (offset, length) int64 pairs, or NULL
    rdev          INTEGER NOT NULL DEFAULT 0,
    latest        INTEGER NOT NULL DEFAULT 1,   -- 0 for versions overwritten by later members
    is_hardlink   INTEGER NOT NULL DEFAULT 0,
    source        INTEGER NOT NULL DEFAULT 0    -- recursive mounts: id of the containing archive row
);

-- Decompressor seek points (gzip windows, bzip2 block offsets, zstd frames, xz blocks),
-- one row per blob so that large tables can be loaded lazily.
CREATE TABLE IF NOT EXISTS seek_points (
    backend TEXT    NOT NULL,
    part    INTEGER NOT NULL,
    data    BLOB    NOT NULL,
    PRIMARY KEY (backend, part)
);

-- Compressed archives inside an uncompressed archive (-r): the folder row "id" stands for the
-- archive stored at [offset, offset + size) of the outer file. Rows with files.source = id have
-- offsets into that archive's decompressed stream; its seek points are stored under
-- seek_points.backend = '<backend>@<id>'.
CREATE TABLE IF NOT EXISTS nested_archives (
    id      INTEGER PRIMARY KEY,
    offset  INTEGER NOT NULL,
    size    INTEGER NOT NULL,
    format  TEXT    NOT NULL
);

-- Each folder's listing packed as directory records, for folders of files only (see
-- index/dirents.py): "records" is compressed; "entries" says how many records it holds.
CREATE TABLE IF NOT EXISTS dirents (
    parent  BLOB    PRIMARY KEY,
    entries INTEGER NOT NULL,
    records BLOB    NOT NULL
) WITHOUT ROWID;

-- Run once after all rows are inserted (bulk inserts are faster without the index).
-- A covering index: it holds every column a lookup or a listing reads, so that looking up a
-- name reads one B-tree (a cold lookup is one page read from disk, not two: index, then table).
CREATE INDEX IF NOT EXISTS files_by_path ON files (
    parent, name, id, latest, kind, mode, size, mtime_ns, uid, gid, nlink, ino, linkname, offset_data, sparse,
    rdev, source
);

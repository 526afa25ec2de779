-- Run once after all rows are inserted (bulk inserts are faster without the index).
CREATE INDEX IF NOT EXISTS files_by_path ON files (parent, name, id);

-- A trace's block and search terms are kept in partitions by (healthy, start), so retention
-- drops a whole partition where it deleted rows (store::partitions); summaries, one row per
-- trace, stay one table keyed by trace id. Every row first lands here in a default
-- partition; the retention pass creates partitions of a range ahead of time, so the traces
-- stored before this migration stay in the default partitions and retention deletes them
-- row by row as before.
--
-- A partitioned table's unique keys must hold its partition key: blocks are no longer
-- unique by trace id in the database; compaction checks before it inserts, under its lock.

CREATE TABLE trace_blocks_parted (
    LIKE trace_blocks INCLUDING DEFAULTS INCLUDING STORAGE,
    healthy BOOLEAN NOT NULL DEFAULT FALSE
) PARTITION BY RANGE (healthy, start_unix_nano);
CREATE TABLE trace_blocks_default PARTITION OF trace_blocks_parted DEFAULT;
ALTER TABLE trace_blocks_default ALTER COLUMN block SET STORAGE EXTERNAL;
INSERT INTO trace_blocks_parted
    SELECT b.*, COALESCE(s.flags = ',' AND s.outcome IN ('ok', 'no_budget'), FALSE)
    FROM trace_blocks b LEFT JOIN trace_summaries s ON s.trace_id = b.trace_id;

CREATE TABLE trace_terms_parted (
    LIKE trace_terms INCLUDING DEFAULTS INCLUDING STORAGE,
    healthy BOOLEAN NOT NULL DEFAULT FALSE
) PARTITION BY RANGE (healthy, start_unix_nano);
CREATE TABLE trace_terms_default PARTITION OF trace_terms_parted DEFAULT;
INSERT INTO trace_terms_parted
    SELECT t.*, COALESCE(s.flags = ',' AND s.outcome IN ('ok', 'no_budget'), FALSE)
    FROM trace_terms t LEFT JOIN trace_summaries s ON s.trace_id = t.trace_id;

DROP TABLE trace_blocks;
DROP TABLE trace_terms;
ALTER TABLE trace_blocks_parted RENAME TO trace_blocks;
ALTER TABLE trace_terms_parted RENAME TO trace_terms;

CREATE INDEX trace_blocks_by_trace ON trace_blocks (trace_id);
CREATE INDEX trace_blocks_by_start ON trace_blocks (start_unix_nano);
ALTER TABLE trace_terms ADD CONSTRAINT trace_terms_pkey
    PRIMARY KEY (term_id, start_unix_nano, trace_id, healthy);

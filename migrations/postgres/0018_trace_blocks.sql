-- An analysed trace's spans as one compressed block (src/store/blocks.rs): the analyzer
-- moves a summarised trace's rows out of `spans` into its block; reads take both.
-- `generation` grows with each rewrite, so a rewrite from a stale read changes nothing.
-- `text_bytes` is the text of the rows it holds (what a read of it reserves in memory).
CREATE TABLE trace_blocks (
    trace_id        BYTEA   PRIMARY KEY,
    start_unix_nano BIGINT  NOT NULL,
    span_count      BIGINT  NOT NULL,
    text_bytes      BIGINT  NOT NULL,
    generation      BIGINT  NOT NULL,
    block           BYTEA   NOT NULL
);
-- Retention deletes by start time.
CREATE INDEX trace_blocks_by_start ON trace_blocks (start_unix_nano);
-- Blocks are compressed already: TOAST stores them without trying again.
ALTER TABLE trace_blocks ALTER COLUMN block SET STORAGE EXTERNAL;

-- The start-time index keys on a ~1.07 s bucket of the start (2^30 ns) instead of the start
-- itself. Within a bucket, entries follow the rowid, which grows as spans arrive, so an
-- insert lands at the right edge of its bucket: a batch of spans that started over the last
-- minute touches one index page per bucket (~60) instead of one random page per span. At
-- ~2,000 spans per group commit the old index was most of what each commit wrote to the
-- WAL (BENCHMARKS.md, "The start index"). Queries by start range name the same expression
-- (`start_unix_nano >> 30`) so that SQLite can use this index, then test the exact start.
DROP INDEX spans_by_start;
CREATE INDEX spans_by_start_bucket ON spans (start_unix_nano >> 30);

-- How long the edge hop took to answer (NULL without an edge hop, or for a trace summarised
-- before this column existed), and the origin hops of an exceeded request as
-- "\nSERVICE\tNAME\n…", the form of `operations` (src/analyze/summary.rs).
ALTER TABLE trace_summaries ADD COLUMN answer_ms REAL;
ALTER TABLE trace_summaries ADD COLUMN origins TEXT NOT NULL DEFAULT '';

-- Exceeded requests whose budget ran out at this hop (hops::COUNTED). Rows written before
-- this column existed count none.
ALTER TABLE hop_rollups ADD COLUMN origin INTEGER NOT NULL DEFAULT 0;
ALTER TABLE hop_rollups_hourly ADD COLUMN origin INTEGER NOT NULL DEFAULT 0;

-- Index terms are found by their trace only to replace a re-analysed trace's terms, which
-- the analyzer now computes from the trace's old summary and deletes by primary key; the
-- index by trace id, written at a random place for every term, goes. Retention deletes
-- terms by start time, which an index in arrival order serves cheaply.
DROP INDEX trace_terms_by_trace;
CREATE INDEX trace_terms_by_start ON trace_terms (start_unix_nano);

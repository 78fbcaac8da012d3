-- An inverted index over trace summaries: one row per (term, trace), where a term is
-- "service:NAME", "op:SERVICE<TAB>NAME", "opname:NAME", "flag:NAME" or "outcome:NAME"
-- (store/query.rs). A search drives from its most selective term, newest first, through
-- the primary key and stops at its limit, however rare the term is.
CREATE TABLE trace_terms (
    term            TEXT NOT NULL,
    start_unix_nano BIGINT NOT NULL,
    trace_id        BYTEA NOT NULL,
    PRIMARY KEY (term, start_unix_nano, trace_id)
);
CREATE INDEX trace_terms_by_trace ON trace_terms (trace_id);

-- Search terms are deleted by their key, found from each trace's summary
-- (store/summaries.rs, delete_terms): no index by trace is kept for them.
DROP INDEX IF EXISTS trace_terms_by_trace;

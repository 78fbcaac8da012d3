-- Traces that received spans since they were last summarised. Ingest upserts a row in the
-- same transaction as the spans; the background analyzer summarises traces quiet for
-- --quiet-period and deletes the row only if no span arrived meanwhile.
CREATE TABLE dirty_traces (
    trace_id           BLOB    PRIMARY KEY,
    received_unix_nano INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX dirty_traces_by_time ON dirty_traces (received_unix_nano);

-- One row per analysed trace, for search (src/analyze/summary.rs).
CREATE TABLE trace_summaries (
    trace_id        BLOB PRIMARY KEY,
    root_service    TEXT NOT NULL,
    root_name       TEXT NOT NULL,
    start_unix_nano INTEGER NOT NULL,
    duration_ms     REAL NOT NULL,
    budget_ms       REAL,
    outcome         TEXT NOT NULL,
    burner_service  TEXT,
    burner_name     TEXT,
    burner_self_ms  REAL,
    -- {"inflated": 1, …}
    flag_counts     TEXT NOT NULL,
    -- ",inflated,overspent," so one flag is found with a substring test.
    flags           TEXT NOT NULL,
    span_count      INTEGER NOT NULL,
    -- "\nedge\ninventory\n": services, newline-delimited, for substring tests.
    services        TEXT NOT NULL,
    -- "\nedge\tGET /checkout\n…": (service TAB name) of hops and roots.
    operations      TEXT NOT NULL
);
CREATE INDEX trace_summaries_by_start ON trace_summaries (start_unix_nano DESC, trace_id DESC);

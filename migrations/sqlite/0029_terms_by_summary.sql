-- A summary gets an id of its own (never reused, and unlike a bare rowid kept by VACUUM),
-- and a trace's index terms name it by that id and the second it
-- started instead of by trace id and start: new rows then land at the end of each term's
-- second, where a key on the exact start took the analyzer's inserts at random places
-- within a few seconds of export delay, and each row is about half as long
-- (store::search::TermLayout).
CREATE TABLE trace_summaries_by_id (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    trace_id        BLOB    NOT NULL UNIQUE,
    root_service    TEXT    NOT NULL,
    root_name       TEXT    NOT NULL,
    start_unix_nano INTEGER NOT NULL,
    duration_ms     REAL    NOT NULL,
    budget_ms       REAL,
    outcome         TEXT    NOT NULL,
    burner_service  TEXT,
    burner_name     TEXT,
    burner_self_ms  REAL,
    flag_counts     TEXT    NOT NULL,
    flags           TEXT    NOT NULL,
    span_count      INTEGER NOT NULL,
    services        TEXT    NOT NULL,
    operations      TEXT    NOT NULL,
    answer_ms       REAL,
    origins         TEXT    NOT NULL DEFAULT '',
    hops            TEXT    NOT NULL DEFAULT '[]',
    rules_version   INTEGER NOT NULL DEFAULT 0,
    tolerance_ms    REAL    NOT NULL DEFAULT 0,
    packed_hops     BLOB,
    packed_detail   BLOB
);
INSERT INTO trace_summaries_by_id
    SELECT rowid, trace_id, root_service, root_name, start_unix_nano, duration_ms, budget_ms,
        outcome, burner_service, burner_name, burner_self_ms, flag_counts, flags, span_count,
        services, operations, answer_ms, origins, hops, rules_version, tolerance_ms,
        packed_hops, packed_detail
    FROM trace_summaries;

CREATE TABLE trace_terms_by_summary (
    term_id      INTEGER NOT NULL,
    start_second INTEGER NOT NULL,
    summary_id   INTEGER NOT NULL,
    PRIMARY KEY (term_id, start_second, summary_id)
) WITHOUT ROWID;
INSERT INTO trace_terms_by_summary (term_id, start_second, summary_id)
    SELECT t.term_id, t.start_unix_nano / 1000000000, s.id
    FROM trace_terms t JOIN trace_summaries_by_id s ON s.trace_id = t.trace_id;

DROP TABLE trace_terms;
ALTER TABLE trace_terms_by_summary RENAME TO trace_terms;
DROP TABLE trace_summaries;
ALTER TABLE trace_summaries_by_id RENAME TO trace_summaries;
CREATE INDEX trace_summaries_by_start ON trace_summaries (start_unix_nano DESC, trace_id DESC);

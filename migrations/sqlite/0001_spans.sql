-- Spans as budgetscope keeps them. Timestamps are unix nanoseconds.
-- attributes/resource/details hold JSON text (see src/codec.rs).
CREATE TABLE spans (
    trace_id        BLOB    NOT NULL,
    span_id         BLOB    NOT NULL,
    parent_span_id  BLOB,
    service         TEXT    NOT NULL,
    name            TEXT    NOT NULL,
    kind            INTEGER NOT NULL,
    start_unix_nano INTEGER NOT NULL,
    end_unix_nano   INTEGER NOT NULL,
    status_code     INTEGER NOT NULL,
    status_message  TEXT    NOT NULL,
    budget_ms       REAL,
    budget_source   TEXT,
    attributes      TEXT    NOT NULL,
    resource        TEXT    NOT NULL,
    details         TEXT    NOT NULL,
    PRIMARY KEY (trace_id, span_id)
);

-- Retention deletes by start time.
CREATE INDEX spans_by_start ON spans (start_unix_nano);

-- The services and operations seen, kept small so listing them never scans spans.
CREATE TABLE operations (
    service             TEXT    NOT NULL,
    name                TEXT    NOT NULL,
    kind                INTEGER NOT NULL,
    last_seen_unix_nano INTEGER NOT NULL,
    PRIMARY KEY (service, name, kind)
) WITHOUT ROWID;

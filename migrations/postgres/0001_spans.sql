-- Spans as budgetscope keeps them. Timestamps are unix nanoseconds.
-- attributes/resource/details hold JSON text (see src/codec.rs).
CREATE TABLE spans (
    trace_id        BYTEA            NOT NULL,
    span_id         BYTEA            NOT NULL,
    parent_span_id  BYTEA,
    service         TEXT             NOT NULL,
    name            TEXT             NOT NULL,
    kind            SMALLINT         NOT NULL,
    start_unix_nano BIGINT           NOT NULL,
    end_unix_nano   BIGINT           NOT NULL,
    status_code     SMALLINT         NOT NULL,
    status_message  TEXT             NOT NULL,
    budget_ms       DOUBLE PRECISION,
    budget_source   TEXT,
    attributes      TEXT             NOT NULL,
    resource        TEXT             NOT NULL,
    details         TEXT             NOT NULL,
    PRIMARY KEY (trace_id, span_id)
);

-- Retention deletes by start time.
CREATE INDEX spans_by_start ON spans (start_unix_nano);

-- The services and operations seen, kept small so listing them never scans spans.
CREATE TABLE operations (
    service             TEXT     NOT NULL,
    name                TEXT     NOT NULL,
    kind                SMALLINT NOT NULL,
    last_seen_unix_nano BIGINT   NOT NULL,
    PRIMARY KEY (service, name, kind)
);

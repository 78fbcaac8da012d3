-- What each hop of each summarised trace contributed to hop_rollups, so a re-analysed
-- trace (a late span) can take its old contribution back out (src/analyze/hops.rs).
CREATE TABLE trace_hops (
    trace_id        BYTEA NOT NULL,
    service         TEXT NOT NULL,
    operation       TEXT NOT NULL,
    start_unix_nano BIGINT NOT NULL,
    budget_ms       DOUBLE PRECISION,
    burn            DOUBLE PRECISION,
    self_ms         DOUBLE PRECISION NOT NULL,
    -- Comma-separated counts in the order of hops::COUNTED.
    counts          TEXT NOT NULL,
    wasted_ms       DOUBLE PRECISION NOT NULL
);
CREATE INDEX trace_hops_by_trace ON trace_hops (trace_id);
CREATE INDEX trace_hops_by_start ON trace_hops (start_unix_nano);

-- Per hop identity (service + hop span name) and minute. Histograms are sparse log-bucket
-- maps "key:count,…" (hops::Histogram).
CREATE TABLE hop_rollups (
    service          TEXT NOT NULL,
    operation        TEXT NOT NULL,
    minute_unix_nano BIGINT NOT NULL,
    requests         BIGINT NOT NULL,
    inherited_exceed BIGINT NOT NULL,
    local_exceed     BIGINT NOT NULL,
    overspent        BIGINT NOT NULL,
    inflated         BIGINT NOT NULL,
    dropped          BIGINT NOT NULL,
    doomed           BIGINT NOT NULL,
    refused          BIGINT NOT NULL,
    retry            BIGINT NOT NULL,
    wasted_ms        DOUBLE PRECISION NOT NULL,
    budget_hist      TEXT NOT NULL,
    burn_hist        TEXT NOT NULL,
    self_hist        TEXT NOT NULL,
    PRIMARY KEY (service, operation, minute_unix_nano)
);
CREATE INDEX hop_rollups_by_minute ON hop_rollups (minute_unix_nano);

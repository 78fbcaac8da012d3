-- What each hop of each summarised trace contributed to hop_rollups, so a re-analysed
-- trace (a late span) can take its old contribution back out (src/analyze/hops.rs).
CREATE TABLE trace_hops (
    trace_id        BLOB NOT NULL,
    service         TEXT NOT NULL,
    operation       TEXT NOT NULL,
    start_unix_nano INTEGER NOT NULL,
    budget_ms       REAL,
    burn            REAL,
    self_ms         REAL NOT NULL,
    -- Comma-separated counts in the order of hops::COUNTED.
    counts          TEXT NOT NULL,
    wasted_ms       REAL NOT NULL
);
CREATE INDEX trace_hops_by_trace ON trace_hops (trace_id);
CREATE INDEX trace_hops_by_start ON trace_hops (start_unix_nano);

-- Per hop identity (service + hop span name) and minute. Histograms are sparse log-bucket
-- maps "key:count,…" (hops::Histogram).
CREATE TABLE hop_rollups (
    service          TEXT NOT NULL,
    operation        TEXT NOT NULL,
    minute_unix_nano INTEGER NOT NULL,
    requests         INTEGER NOT NULL,
    inherited_exceed INTEGER NOT NULL,
    local_exceed     INTEGER NOT NULL,
    overspent        INTEGER NOT NULL,
    inflated         INTEGER NOT NULL,
    dropped          INTEGER NOT NULL,
    doomed           INTEGER NOT NULL,
    refused          INTEGER NOT NULL,
    retry            INTEGER NOT NULL,
    wasted_ms        REAL NOT NULL,
    budget_hist      TEXT NOT NULL,
    burn_hist        TEXT NOT NULL,
    self_hist        TEXT NOT NULL,
    PRIMARY KEY (service, operation, minute_unix_nano)
) WITHOUT ROWID;
CREATE INDEX hop_rollups_by_minute ON hop_rollups (minute_unix_nano);

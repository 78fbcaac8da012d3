-- The rollup tables become rowid tables keyed by a unique index: a row of a WITHOUT ROWID
-- table (an index b-tree) keeps at most about 1,000 bytes on its page and spills the rest
-- to an overflow page of its own, and a rollup row with its histograms is larger, so each
-- took two pages or more (a rowid table keeps rows of up to about 4,000 bytes inline).

CREATE TABLE hop_rollups_inline (
    service           TEXT    NOT NULL,
    operation         TEXT    NOT NULL,
    minute_unix_nano  INTEGER NOT NULL,
    requests          INTEGER NOT NULL,
    inherited_exceed  INTEGER NOT NULL,
    local_exceed      INTEGER NOT NULL,
    overspent         INTEGER NOT NULL,
    inflated          INTEGER NOT NULL,
    dropped           INTEGER NOT NULL,
    doomed            INTEGER NOT NULL,
    refused           INTEGER NOT NULL,
    retry             INTEGER NOT NULL,
    wasted_ms         REAL    NOT NULL,
    budget_hist       TEXT    NOT NULL,
    burn_hist         TEXT    NOT NULL,
    self_hist         TEXT    NOT NULL,
    origin            INTEGER NOT NULL DEFAULT 0,
    critical_ms       REAL    NOT NULL DEFAULT 0,
    exceeded_requests INTEGER NOT NULL DEFAULT 0,
    critical_exceeded INTEGER NOT NULL DEFAULT 0,
    dominant_exceeded INTEGER NOT NULL DEFAULT 0,
    advice            TEXT    NOT NULL DEFAULT ''
);
INSERT INTO hop_rollups_inline SELECT * FROM hop_rollups;
DROP TABLE hop_rollups;
ALTER TABLE hop_rollups_inline RENAME TO hop_rollups;
CREATE UNIQUE INDEX hop_rollups_key ON hop_rollups (service, operation, minute_unix_nano);
CREATE INDEX hop_rollups_by_minute ON hop_rollups (minute_unix_nano);

CREATE TABLE hop_rollups_hourly_inline (
    service           TEXT    NOT NULL,
    operation         TEXT    NOT NULL,
    minute_unix_nano  INTEGER NOT NULL,
    requests          INTEGER NOT NULL,
    inherited_exceed  INTEGER NOT NULL,
    local_exceed      INTEGER NOT NULL,
    overspent         INTEGER NOT NULL,
    inflated          INTEGER NOT NULL,
    dropped           INTEGER NOT NULL,
    doomed            INTEGER NOT NULL,
    refused           INTEGER NOT NULL,
    retry             INTEGER NOT NULL,
    wasted_ms         REAL    NOT NULL,
    budget_hist       TEXT    NOT NULL,
    burn_hist         TEXT    NOT NULL,
    self_hist         TEXT    NOT NULL,
    origin            INTEGER NOT NULL DEFAULT 0,
    critical_ms       REAL    NOT NULL DEFAULT 0,
    exceeded_requests INTEGER NOT NULL DEFAULT 0,
    critical_exceeded INTEGER NOT NULL DEFAULT 0,
    dominant_exceeded INTEGER NOT NULL DEFAULT 0,
    advice            TEXT    NOT NULL DEFAULT ''
);
INSERT INTO hop_rollups_hourly_inline SELECT * FROM hop_rollups_hourly;
DROP TABLE hop_rollups_hourly;
ALTER TABLE hop_rollups_hourly_inline RENAME TO hop_rollups_hourly;
CREATE UNIQUE INDEX hop_rollups_hourly_key ON hop_rollups_hourly (service, operation, minute_unix_nano);
CREATE INDEX hop_rollups_hourly_by_hour ON hop_rollups_hourly (minute_unix_nano);

CREATE TABLE edge_rollups_inline (
    caller_service   TEXT    NOT NULL,
    caller_operation TEXT    NOT NULL,
    callee_service   TEXT    NOT NULL,
    callee_operation TEXT    NOT NULL,
    minute_unix_nano INTEGER NOT NULL,
    requests         INTEGER NOT NULL,
    data             TEXT    NOT NULL
);
INSERT INTO edge_rollups_inline SELECT * FROM edge_rollups;
DROP TABLE edge_rollups;
ALTER TABLE edge_rollups_inline RENAME TO edge_rollups;
CREATE UNIQUE INDEX edge_rollups_key ON edge_rollups (caller_service, caller_operation, callee_service, callee_operation, minute_unix_nano);
CREATE INDEX edge_rollups_by_minute ON edge_rollups (minute_unix_nano);

CREATE TABLE edge_rollups_hourly_inline (
    caller_service   TEXT    NOT NULL,
    caller_operation TEXT    NOT NULL,
    callee_service   TEXT    NOT NULL,
    callee_operation TEXT    NOT NULL,
    minute_unix_nano INTEGER NOT NULL,
    requests         INTEGER NOT NULL,
    data             TEXT    NOT NULL
);
INSERT INTO edge_rollups_hourly_inline SELECT * FROM edge_rollups_hourly;
DROP TABLE edge_rollups_hourly;
ALTER TABLE edge_rollups_hourly_inline RENAME TO edge_rollups_hourly;
CREATE UNIQUE INDEX edge_rollups_hourly_key ON edge_rollups_hourly (caller_service, caller_operation, callee_service, callee_operation, minute_unix_nano);
CREATE INDEX edge_rollups_hourly_by_minute ON edge_rollups_hourly (minute_unix_nano, requests, data);

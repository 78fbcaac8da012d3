-- Per call edge (caller hop identity -> callee) and minute, and summed per hour: the service
-- map's statistics (src/store/edges.rs). data holds the calls, counts and histograms as text.
CREATE TABLE edge_rollups (
    caller_service   TEXT NOT NULL,
    caller_operation TEXT NOT NULL,
    callee_service   TEXT NOT NULL,
    callee_operation TEXT NOT NULL,
    minute_unix_nano INTEGER NOT NULL,
    requests         INTEGER NOT NULL,
    data             TEXT NOT NULL,
    PRIMARY KEY (caller_service, caller_operation, callee_service, callee_operation, minute_unix_nano)
) WITHOUT ROWID;
CREATE INDEX edge_rollups_by_minute ON edge_rollups (minute_unix_nano);
CREATE TABLE edge_rollups_hourly (
    caller_service   TEXT NOT NULL,
    caller_operation TEXT NOT NULL,
    callee_service   TEXT NOT NULL,
    callee_operation TEXT NOT NULL,
    minute_unix_nano INTEGER NOT NULL,
    requests         INTEGER NOT NULL,
    data             TEXT NOT NULL,
    PRIMARY KEY (caller_service, caller_operation, callee_service, callee_operation, minute_unix_nano)
) WITHOUT ROWID;
CREATE INDEX edge_rollups_hourly_by_minute ON edge_rollups_hourly (minute_unix_nano);

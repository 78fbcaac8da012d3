-- hop_rollups summed per hour (minute_unix_nano holds the hour's start), so long ranges
-- read 60 times fewer rows. Maintained from the same deltas as hop_rollups.
CREATE TABLE hop_rollups_hourly (
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
CREATE INDEX hop_rollups_hourly_by_hour ON hop_rollups_hourly (minute_unix_nano);

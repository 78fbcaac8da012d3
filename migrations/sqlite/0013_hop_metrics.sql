-- The deadline metrics hops export over OTLP (src/receive/deadline_metrics.rs), per hop
-- and minute: every write adds its deltas (src/store/reported.rs). Counts cover every
-- request, where the rollups cover the sampled traces.
CREATE TABLE hop_metrics (
    service           TEXT    NOT NULL,
    operation         TEXT    NOT NULL,
    minute_unix_nano  INTEGER NOT NULL,
    local_exceeds     INTEGER NOT NULL,
    inherited_exceeds INTEGER NOT NULL,
    received_count    INTEGER NOT NULL,
    received_sum_ms   REAL    NOT NULL,
    remaining_count   INTEGER NOT NULL,
    remaining_sum_ms  REAL    NOT NULL,
    PRIMARY KEY (service, operation, minute_unix_nano)
);
CREATE INDEX hop_metrics_by_minute ON hop_metrics (minute_unix_nano);

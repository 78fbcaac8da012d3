-- The deadline metrics hops export over OTLP (src/receive/deadline_metrics.rs), per hop
-- and minute: every write adds its deltas (src/store/reported.rs). Counts cover every
-- request, where the rollups cover the sampled traces.
CREATE TABLE hop_metrics (
    service           TEXT    NOT NULL,
    operation         TEXT    NOT NULL,
    minute_unix_nano  BIGINT NOT NULL,
    local_exceeds     BIGINT NOT NULL,
    inherited_exceeds BIGINT NOT NULL,
    received_count    BIGINT NOT NULL,
    received_sum_ms   DOUBLE PRECISION NOT NULL,
    remaining_count   BIGINT NOT NULL,
    remaining_sum_ms  DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (service, operation, minute_unix_nano)
);
CREATE INDEX hop_metrics_by_minute ON hop_metrics (minute_unix_nano);

-- Alert instances: one row per (rule, hop) that is pending, firing or recently resolved
-- (src/alerts/eval.rs). An inactive instance has no row.
CREATE TABLE alert_instances (
    rule             TEXT NOT NULL,
    service          TEXT NOT NULL,
    operation        TEXT NOT NULL,
    state            TEXT NOT NULL,
    severity         TEXT NOT NULL,
    value            REAL,
    short_value      REAL,
    threshold        REAL NOT NULL,
    requests         INTEGER NOT NULL,
    active_since     INTEGER NOT NULL,
    fired_at         INTEGER,
    cleared_since    INTEGER,
    resolved_at      INTEGER,
    evaluated_at     INTEGER NOT NULL,
    PRIMARY KEY (rule, service, operation)
);

-- Every evaluation of an instance that was pending or firing: the values it used.
CREATE TABLE alert_history (
    id               INTEGER PRIMARY KEY,
    rule             TEXT NOT NULL,
    service          TEXT NOT NULL,
    operation        TEXT NOT NULL,
    state            TEXT NOT NULL,
    severity         TEXT NOT NULL,
    value            REAL,
    short_value      REAL,
    threshold        REAL NOT NULL,
    requests         INTEGER NOT NULL,
    evaluated_at     INTEGER NOT NULL
);
CREATE INDEX alert_history_by_rule ON alert_history (rule, evaluated_at);
CREATE INDEX alert_history_by_time ON alert_history (evaluated_at);

-- Notifications to deliver (an outbox written with the state change that caused them) and,
-- once delivered or given up, the delivery log.
CREATE TABLE alert_notifications (
    id                     INTEGER PRIMARY KEY,
    created_unix_nano      INTEGER NOT NULL,
    receiver               TEXT NOT NULL,
    rule                   TEXT NOT NULL,
    service                TEXT NOT NULL,
    operation              TEXT NOT NULL,
    status                 TEXT NOT NULL,
    alert                  TEXT NOT NULL,
    attempts               INTEGER NOT NULL,
    next_attempt_unix_nano INTEGER,
    delivered_unix_nano    INTEGER,
    last_error             TEXT NOT NULL
);
CREATE INDEX alert_notifications_due ON alert_notifications (next_attempt_unix_nano);

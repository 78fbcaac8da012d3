-- Alert rules created in the UI or the API (the rules file's are not stored). The
-- definition is the rule as JSON, in the rules file's field names (alerts::rules::RuleSpec).
CREATE TABLE alert_rules (
    name              TEXT PRIMARY KEY,
    definition        TEXT NOT NULL,
    updated_unix_nano INTEGER NOT NULL
);

-- Silences: while one is active, instances whose labels match all its matchers send no
-- notifications. Matchers are a JSON array of strings such as "service=inventory".
CREATE TABLE alert_silences (
    id                INTEGER PRIMARY KEY,
    matchers          TEXT NOT NULL,
    starts_unix_nano  INTEGER NOT NULL,
    ends_unix_nano    INTEGER NOT NULL,
    comment           TEXT NOT NULL,
    created_by        TEXT NOT NULL,
    created_unix_nano INTEGER NOT NULL
);

-- Whether the current firing episode of an instance was notified: a change while it is
-- silenced (or inhibited) is not, and is notified once that ends if it still fires.
ALTER TABLE alert_instances ADD COLUMN notified INTEGER NOT NULL DEFAULT 0;
-- When the episode was last notified as firing (a rule's repeat_interval counts from it).
ALTER TABLE alert_instances ADD COLUMN notified_at INTEGER;
-- The hop ("service" newline "operation") that sent this hop most of its already-spent
-- requests when the episode first fired: a firing instance there inhibits this one.
ALTER TABLE alert_instances ADD COLUMN spent_by TEXT;

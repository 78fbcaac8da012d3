-- Dirty-trace marks become an append-only log keyed by commit time. Ingest used to upsert
-- one row per trace into dirty_traces and move its entry in a second index: two writes at
-- random places in two B-trees per trace per batch. A mark keyed (received, trace) lands at
-- the right edge of one B-tree. A trace may now hold several marks; the analyzer treats
-- it as quiet only when none of its marks is recent, and clears every mark it analysed
-- (src/store/sqlite.rs, quiet_traces).
CREATE TABLE trace_marks (
    received_unix_nano INTEGER NOT NULL,
    trace_id           BLOB    NOT NULL,
    PRIMARY KEY (received_unix_nano, trace_id)
) WITHOUT ROWID;

INSERT INTO trace_marks (received_unix_nano, trace_id)
    SELECT received_unix_nano, trace_id FROM dirty_traces;
DROP TABLE dirty_traces;

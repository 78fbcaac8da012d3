-- Since when each trace waits for analysis: its first commit since it was last analysed,
-- kept while later commits move received_unix_nano. A trace that keeps receiving spans is
-- analysed once it has waited --max-trace-wait (src/pipeline/analyzer.rs).
ALTER TABLE dirty_traces ADD COLUMN waiting_since BIGINT NOT NULL DEFAULT 0;
UPDATE dirty_traces SET waiting_since = received_unix_nano;

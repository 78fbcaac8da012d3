-- Each hop's part in its requests' critical paths (src/core/analyze/hops.rs, CriticalCounts):
-- time on the path, and exceeded requests through the hop, with it on the path, and with it
-- as the critical hop. Rows written before hold zeros; the re-analysis that RULES_VERSION 3
-- starts replaces each trace's contribution, filling them in.
ALTER TABLE hop_rollups ADD COLUMN critical_ms DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE hop_rollups ADD COLUMN exceeded_requests BIGINT NOT NULL DEFAULT 0;
ALTER TABLE hop_rollups ADD COLUMN critical_exceeded BIGINT NOT NULL DEFAULT 0;
ALTER TABLE hop_rollups ADD COLUMN dominant_exceeded BIGINT NOT NULL DEFAULT 0;
ALTER TABLE hop_rollups_hourly ADD COLUMN critical_ms DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE hop_rollups_hourly ADD COLUMN exceeded_requests BIGINT NOT NULL DEFAULT 0;
ALTER TABLE hop_rollups_hourly ADD COLUMN critical_exceeded BIGINT NOT NULL DEFAULT 0;
ALTER TABLE hop_rollups_hourly ADD COLUMN dominant_exceeded BIGINT NOT NULL DEFAULT 0;

-- The rules version and tolerance (τ) each summary was analysed with (src/core/analyze/mod.rs,
-- RULES_VERSION). Summaries written before this column existed hold version 0, so a server
-- with newer rules re-analyses them in the background (src/pipeline/analyzer.rs).
ALTER TABLE trace_summaries ADD COLUMN rules_version INTEGER NOT NULL DEFAULT 0;
ALTER TABLE trace_summaries ADD COLUMN tolerance_ms REAL NOT NULL DEFAULT 0;

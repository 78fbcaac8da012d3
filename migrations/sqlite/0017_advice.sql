-- What the advisor's hop findings read (src/core/analyze/advice_stats.rs, AdviceRollup): a
-- JSON array of counts, histograms (budgets of exceeded requests, post-call work, reserve
-- kept, uncut need) and the tally of the most calls reaching one service. Rows written
-- before hold '' (nothing counted); the re-analysis that RULES_VERSION 5 starts replaces
-- each trace's contribution, filling it in.
ALTER TABLE hop_rollups ADD COLUMN advice TEXT NOT NULL DEFAULT '';
ALTER TABLE hop_rollups_hourly ADD COLUMN advice TEXT NOT NULL DEFAULT '';

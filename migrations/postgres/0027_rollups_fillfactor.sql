-- A rollup row is updated many times while its minute or hour lasts. With room left on
-- its page, the new version is written beside the old one (a HOT update: no new index
-- entries) and the page's dead versions are pruned when it fills up; on full pages every
-- update took new space at the table's end until a vacuum, and a burst left the rollup
-- tables many times their live size (BENCHMARKS.md, "Disk").
ALTER TABLE hop_rollups SET (fillfactor = 50);
ALTER TABLE hop_rollups_hourly SET (fillfactor = 50);
ALTER TABLE edge_rollups SET (fillfactor = 50);
ALTER TABLE edge_rollups_hourly SET (fillfactor = 50);

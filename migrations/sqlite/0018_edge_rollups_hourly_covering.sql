-- A range of whole hours is read from the hourly edge rows by minute: the index holds their
-- requests and data too, so the read never looks a row up by its key (a day of 10,000 edges
-- is 240,000 rows; `cargo bench --bench advisor`). The minute table keeps its narrow index:
-- only the partial hours at a range's ends are read from it.
DROP INDEX edge_rollups_hourly_by_minute;
CREATE INDEX edge_rollups_hourly_by_minute ON edge_rollups_hourly (minute_unix_nano, requests, data);

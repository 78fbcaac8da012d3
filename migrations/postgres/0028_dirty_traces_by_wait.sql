-- The analyzer takes the traces that have waited longest first, in the order of
-- least(received_unix_nano, waiting_since) (src/store/postgres.rs, `due_traces`). Ordered
-- by that expression, a pass reads only as far as its limit; by received_unix_nano alone,
-- every waiting trace was read and sorted at each pass, which made catching up on a
-- backlog slower the larger it was (`budgetscope-bench retention`). Nothing else reads
-- the marks by time in order.
DROP INDEX dirty_traces_by_time;
CREATE INDEX dirty_traces_by_wait ON dirty_traces (least(received_unix_nano, waiting_since));

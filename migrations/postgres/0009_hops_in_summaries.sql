-- Each summary keeps its trace's hop samples as a JSON array (store/rollup.rs,
-- encode_hops): one row per trace instead of one row per hop and two index entries, which
-- the analyzer wrote for every hop of every trace.
ALTER TABLE trace_summaries ADD COLUMN hops TEXT NOT NULL DEFAULT '[]';
UPDATE trace_summaries s SET hops = h.hops
FROM (SELECT trace_id,
             json_agg(json_build_array(service, operation, start_unix_nano, budget_ms, burn,
                                       self_ms, counts, wasted_ms))::text AS hops
      FROM trace_hops GROUP BY trace_id) h
WHERE s.trace_id = h.trace_id;
DROP TABLE trace_hops;

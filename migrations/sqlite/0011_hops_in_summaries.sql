-- Each summary keeps its trace's hop samples as a JSON array (store/rollup.rs,
-- encode_hops): one row per trace instead of one row per hop and two index entries, which
-- the analyzer wrote for every hop of every trace.
ALTER TABLE trace_summaries ADD COLUMN hops TEXT NOT NULL DEFAULT '[]';
UPDATE trace_summaries SET hops = (
    SELECT json_group_array(json_array(service, operation, start_unix_nano, budget_ms, burn,
                                       self_ms, counts, wasted_ms))
    FROM trace_hops h WHERE h.trace_id = trace_summaries.trace_id)
WHERE trace_id IN (SELECT trace_id FROM trace_hops);
DROP TABLE trace_hops;

-- Traces analysed whole whose span rows wait to move into their block (store/blocks.rs,
-- compact_due): written with their summary, taken oldest first by the server holding the
-- background lease, and deleted once compacted, so a restart loses none of them.
CREATE TABLE compaction_due (
    queued_unix_nano BIGINT NOT NULL,
    trace_id         BYTEA  NOT NULL,
    PRIMARY KEY (queued_unix_nano, trace_id)
);

-- Traces analysed before this table existed and still kept as rows wait too, first.
INSERT INTO compaction_due (queued_unix_nano, trace_id)
    SELECT 0, s.trace_id FROM trace_summaries s
    WHERE s.outcome <> 'too_large'
      AND EXISTS (SELECT 1 FROM spans WHERE spans.trace_id = s.trace_id);

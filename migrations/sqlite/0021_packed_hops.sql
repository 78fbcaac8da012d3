-- A summary's hop samples, compressed (store/rollup.rs, pack_hops): they were most of its
-- bytes as JSON text. Summaries written before keep their `hops` text, read as it is.
ALTER TABLE trace_summaries ADD COLUMN packed_hops BLOB;

-- A summary's names, flag counts and lists (root and burner, services, operations,
-- origins) are kept compressed in packed_detail (store::query::pack_detail); searches find
-- them through their terms. Summaries written before keep them in the text columns.
ALTER TABLE trace_summaries ADD COLUMN packed_detail BYTEA;

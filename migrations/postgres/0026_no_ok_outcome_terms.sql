-- A trace's index terms no longer hold its outcome when that is "ok", the outcome most
-- traces have: a search for it reads the summaries in time order instead
-- (store::query::terms). Those rows go, with their term's text.
-- A server of an older version still running during an upgrade may write a few more,
-- which no search reads; their time partitions take them.
DELETE FROM trace_terms
    WHERE term_id IN (SELECT id FROM search_terms WHERE term = 'outcome:ok');
DELETE FROM search_terms WHERE term = 'outcome:ok';

-- A trace's index terms no longer hold one per (service, operation): a search for one
-- finds the operation's name and the service, and checks the pair on the summaries found
-- (store::query::terms). Those rows go, with their terms' text.
-- A server of an older version still running during an upgrade may write a few more,
-- which no search reads; their time partitions take them.
DELETE FROM trace_terms
    WHERE term_id IN (SELECT id FROM search_terms WHERE substr(term, 1, 3) = 'op:');
DELETE FROM search_terms WHERE substr(term, 1, 3) = 'op:';

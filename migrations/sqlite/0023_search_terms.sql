-- Each search term's text is kept once (search_terms) and trace_terms refers to it by id:
-- the text repeated in every trace's rows was most of the index's bytes
-- (store/summaries.rs, term_ids).
CREATE TABLE search_terms (
    id   INTEGER PRIMARY KEY,
    term TEXT NOT NULL UNIQUE
);
INSERT INTO search_terms (term) SELECT DISTINCT term FROM trace_terms;

CREATE TABLE trace_terms_by_id (
    term_id         INTEGER NOT NULL,
    start_unix_nano INTEGER NOT NULL,
    trace_id        BLOB    NOT NULL,
    PRIMARY KEY (term_id, start_unix_nano, trace_id)
) WITHOUT ROWID;
INSERT INTO trace_terms_by_id (term_id, start_unix_nano, trace_id)
    SELECT s.id, t.start_unix_nano, t.trace_id
    FROM trace_terms t JOIN search_terms s ON s.term = t.term;
DROP TABLE trace_terms;
ALTER TABLE trace_terms_by_id RENAME TO trace_terms;

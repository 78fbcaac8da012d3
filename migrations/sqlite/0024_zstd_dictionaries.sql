-- The zstd dictionaries span blocks ('blocks') and summaries' hop samples ('hops') are
-- compressed with (src/store/dictionary.rs), by the id zstd's frame header names; written
-- once, never changed.
CREATE TABLE zstd_dictionaries (
    id                INTEGER PRIMARY KEY,
    kind              TEXT    NOT NULL,
    created_unix_nano INTEGER NOT NULL,
    dictionary        BLOB    NOT NULL
);

-- The zstd dictionaries span blocks are compressed with (src/store/dictionary.rs), by the
-- id zstd's frame header names; written once, never changed.
CREATE TABLE block_dictionaries (
    id                INTEGER PRIMARY KEY,
    created_unix_nano INTEGER NOT NULL,
    dictionary        BLOB    NOT NULL
);

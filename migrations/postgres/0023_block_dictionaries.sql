-- The zstd dictionaries span blocks are compressed with (src/store/dictionary.rs), by the
-- id zstd's frame header names; written once, never changed.
CREATE TABLE block_dictionaries (
    id                BIGINT PRIMARY KEY,
    created_unix_nano BIGINT NOT NULL,
    dictionary        BYTEA  NOT NULL
);

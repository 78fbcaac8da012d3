-- The zstd dictionaries span blocks ('blocks') and summaries' hop samples ('hops') are
-- compressed with (src/store/dictionary.rs), by the id zstd's frame header names; written
-- once, never changed.
CREATE TABLE zstd_dictionaries (
    id                BIGINT PRIMARY KEY,
    kind              TEXT   NOT NULL,
    created_unix_nano BIGINT NOT NULL,
    dictionary        BYTEA  NOT NULL
);

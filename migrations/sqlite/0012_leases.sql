-- Work that runs on one server at a time (retention, alert evaluation and delivery) is
-- done by the holder of a lease that has not expired (src/lease.rs). A SQLite database has
-- one server; the table keeps the rule the same on both stores.
CREATE TABLE leases (
    name              TEXT PRIMARY KEY,
    holder            TEXT NOT NULL,
    expires_unix_nano INTEGER NOT NULL
);

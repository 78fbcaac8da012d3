-- Several servers may share this database. A trace an analyzer took is claimed by it
-- (claimed_by, random per server) until claimed_until (unix nanoseconds): the others pass
-- it over (src/store/postgres.rs, quiet_traces); a new span of the trace clears the claim.
ALTER TABLE dirty_traces
    ADD COLUMN claimed_until BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN claimed_by    BIGINT NOT NULL DEFAULT 0;

-- Work that runs on one server at a time (retention, alert evaluation and delivery) is
-- done by the holder of a lease that has not expired (src/lease.rs).
CREATE TABLE leases (
    name              TEXT PRIMARY KEY,
    holder            TEXT NOT NULL,
    expires_unix_nano BIGINT NOT NULL
);

//! Postgres keeps each trace's block and search terms in partitions by (healthy, start
//! time) (migrations/postgres/0022), so retention drops a whole partition of expired
//! traces where it would delete those rows one by one (`budgetscope-bench retention`);
//! their summaries, one row per trace, stay unpartitioned so that a search finds each term's
//! summary by its key (partitioned, every lookup reads every partition's index, and Postgres
//! hashes and sorts a whole day for a page of results), and go just before, by the same
//! range and class, in batches.
//!
//! The retention pass (`Store::keep_partitions`) creates each class's partitions a little
//! ahead of time and drops those whose whole range is older than the class's retention: a
//! class's width is the widest of 1 h … 1 d that is at most an eighth of its retention, so a
//! trace is kept at most an eighth longer than its retention. Rows that fit no partition
//! (stored before the first one, a class kept under 8 h, a start far in the future) land in
//! each table's default partition, which retention deletes from row by row as before
//! (`partitioned_from` bounds those deletes to what no partition will drop).
//!
//! Architecture invariant: only the lease holder's retention pass creates or drops
//! partitions; a partition's name says its class and range, and nothing else records them.

use std::time::{Duration, UNIX_EPOCH};

use sqlx::postgres::PgPool;

use super::StoreError;
use super::query::{HEALTHY, TraceSet};

/// The partitioned tables.
const TABLES: [&str; 2] = ["trace_terms", "trace_blocks"];

/// The partition widths, in hours: each divides a day, so ranges of one width never cross
/// those of a wider one.
const WIDTHS_HOURS: [u64; 8] = [1, 2, 3, 4, 6, 8, 12, 24];

/// Partitions are created this many widths ahead of now.
const AHEAD: u64 = 2;

/// How long creating or dropping a partition waits for its lock (a long search holds one)
/// before it gives up until the next pass.
const LOCK_TIMEOUT: &str = "5s";

const HOUR_NANOS: u64 = 3_600_000_000_000;

/// What `Store::keep_partitions` keeps: each class's retention.
#[derive(Debug, Clone, Copy)]
pub struct PartitionPlan {
    /// `--retention-healthy`.
    pub healthy: Duration,
    /// `--retention`: traces with a problem.
    pub all: Duration,
}

/// What one `Store::keep_partitions` did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PartitionsKept {
    pub created: u32,
    pub dropped: u32,
    /// Healthy traces whose summaries went with their partitions.
    pub healthy_traces: u64,
}

/// Summaries deleted per statement before their partition is dropped, so that no
/// transaction holds many rows locked.
const SUMMARIES_BATCH: i64 = 5_000;

/// A class's partition width for `retention`: the widest of `WIDTHS_HOURS` at most an eighth
/// of it; None under 8 h, where the class is not partitioned.
pub fn width(retention: Duration) -> Option<u64> {
    let eighth = retention.as_nanos() / 8;
    WIDTHS_HOURS
        .iter()
        .rev()
        .map(|h| h * HOUR_NANOS)
        .find(|w| u128::from(*w) <= eighth)
}

/// One partition: its class and range of start times `[from, to)`, in Unix nanoseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    pub name: String,
    pub healthy: bool,
    pub from: u64,
    pub to: u64,
}

fn class(healthy: bool) -> &'static str {
    if healthy { "healthy" } else { "problem" }
}

/// "YYYYMMDDHH" in UTC: the hour `unix_nano` falls in.
fn hour_stamp(unix_nano: u64) -> String {
    let time = UNIX_EPOCH + Duration::from_nanos(unix_nano);
    humantime::format_rfc3339_seconds(time)
        .to_string()
        .chars()
        .filter(char::is_ascii_digit)
        .take(10)
        .collect()
}

fn parse_stamp(stamp: &str) -> Option<u64> {
    if stamp.len() != 10 || !stamp.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let text = format!(
        "{}-{}-{}T{}:00:00Z",
        &stamp[..4],
        &stamp[4..6],
        &stamp[6..8],
        &stamp[8..10]
    );
    let time = humantime::parse_rfc3339(&text).ok()?;
    u64::try_from(time.duration_since(UNIX_EPOCH).ok()?.as_nanos()).ok()
}

impl Partition {
    /// The partition of `table` for `healthy` traces over `[from, to)` (whole hours).
    pub fn new(table: &str, healthy: bool, from: u64, to: u64) -> Partition {
        Partition {
            name: format!(
                "{table}_{}_{}_{}",
                class(healthy),
                hour_stamp(from),
                hour_stamp(to)
            ),
            healthy,
            from,
            to,
        }
    }

    /// The partition `name` of `table` names, if it is one of ours.
    pub fn parse(table: &str, name: &str) -> Option<Partition> {
        let rest = name.strip_prefix(table)?.strip_prefix('_')?;
        let (class_name, range) = rest.split_once('_')?;
        let healthy = match class_name {
            "healthy" => true,
            "problem" => false,
            _ => return None,
        };
        let (from, to) = range.split_once('_')?;
        let (from, to) = (parse_stamp(from)?, parse_stamp(to)?);
        (from < to).then(|| Partition {
            name: name.to_string(),
            healthy,
            from,
            to,
        })
    }
}

/// The partitions to create so that `class`'s partitions reach `AHEAD` widths past `now`,
/// after those that exist (`existing`, of that class): from the last one's end, or from the
/// next boundary after now when there is none or it ended before now (the rows of the gap
/// stay in the default partition, so no partition is ever created over rows already stored
/// there in bulk).
pub fn to_create(
    table: &str,
    healthy: bool,
    width: u64,
    existing: &[Partition],
    now: u64,
) -> Vec<Partition> {
    let last = existing
        .iter()
        .filter(|p| p.healthy == healthy)
        .map(|p| p.to)
        .max();
    let mut end = match last {
        Some(end) if end >= now => end,
        _ => now.div_ceil(width) * width,
    };
    let mut created = Vec::new();
    while end < now.saturating_add(AHEAD * width) {
        let to = (end / width + 1) * width;
        created.push(Partition::new(table, healthy, end, to));
        end = to;
    }
    created
}

/// The partitions of `table` there are, oldest first.
async fn list(pool: &PgPool, table: &str) -> Result<Vec<Partition>, StoreError> {
    let names: Vec<(String,)> = sqlx::query_as(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
         WHERE i.inhparent = to_regclass($1)",
    )
    .bind(table)
    .fetch_all(pool)
    .await?;
    let mut partitions: Vec<Partition> = names
        .iter()
        .filter_map(|(name,)| Partition::parse(table, name))
        .collect();
    partitions.sort_by_key(|p| (p.from, p.healthy));
    Ok(partitions)
}

/// Drops the partitions whose range retention is past and creates those ahead (see the
/// module doc), table by table; a partition another statement holds locked for longer than
/// `LOCK_TIMEOUT` waits for the next pass.
pub(crate) async fn keep(
    pool: &PgPool,
    plan: PartitionPlan,
    now: u64,
) -> Result<PartitionsKept, StoreError> {
    let mut kept = PartitionsKept::default();
    let expired = |p: &Partition| {
        let retention = if p.healthy { plan.healthy } else { plan.all };
        p.to <= now.saturating_sub(u64::try_from(retention.as_nanos()).unwrap_or(u64::MAX))
    };
    // The summaries first: a summary rewritten meanwhile writes its block and terms into
    // the partition about to go, and is then deleted row by row with nothing left behind.
    for partition in list(pool, "trace_blocks").await? {
        if expired(&partition) {
            let traces = delete_summaries_in(pool, &partition).await?;
            if partition.healthy {
                kept.healthy_traces += traces;
            }
        }
    }
    for table in TABLES {
        let existing = list(pool, table).await?;
        let mut left = Vec::new();
        for partition in existing {
            if !expired(&partition) {
                left.push(partition);
                continue;
            }
            drop_partition(pool, &partition).await?;
            kept.dropped += 1;
        }
        for (healthy, retention) in [(true, plan.healthy), (false, plan.all)] {
            let Some(width) = width(retention) else {
                continue;
            };
            for partition in to_create(table, healthy, width, &left, now) {
                create(pool, table, &partition).await?;
                kept.created += 1;
            }
        }
    }
    Ok(kept)
}

/// Deletes the summaries of the traces `partition` of `trace_blocks` holds (its class and
/// range), with any of their spans still stored as rows, in batches; returns how many.
/// Their blocks and terms go with the partitions, so none is read or probed for.
async fn delete_summaries_in(pool: &PgPool, partition: &Partition) -> Result<u64, StoreError> {
    let (from, to) = (
        i64::try_from(partition.from).unwrap_or(i64::MAX),
        i64::try_from(partition.to).unwrap_or(i64::MAX),
    );
    let class = if partition.healthy {
        HEALTHY.to_string()
    } else {
        format!("NOT ({HEALTHY})")
    };
    let delete = format!(
        "DELETE FROM trace_summaries WHERE trace_id IN (SELECT trace_id FROM trace_summaries \
         WHERE start_unix_nano >= $1 AND start_unix_nano < $2 AND {class} LIMIT $3) \
         RETURNING trace_id"
    );
    let mut deleted = 0;
    loop {
        let mut tx = pool.begin().await?;
        let ids: Vec<Vec<u8>> = sqlx::query_scalar(sqlx::AssertSqlSafe(delete.as_str()))
            .bind(from)
            .bind(to)
            .bind(SUMMARIES_BATCH)
            .fetch_all(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM spans WHERE trace_id = ANY($1)")
            .bind(&ids)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        deleted += ids.len() as u64;
        if (ids.len() as i64) < SUMMARIES_BATCH {
            return Ok(deleted);
        }
    }
}

/// Drops one partition.
async fn drop_partition(pool: &PgPool, partition: &Partition) -> Result<(), StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"
    )))
    .execute(&mut *tx)
    .await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP TABLE {}",
        partition.name
    )))
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    tracing::debug!(partition = %partition.name, "dropped an expired partition");
    Ok(())
}

/// Creates one partition: a table like the parent, the rows of its range moved in from the
/// default partition (a span from a clock ahead of time), then attached.
async fn create(pool: &PgPool, table: &str, partition: &Partition) -> Result<(), StoreError> {
    let (from, to) = (
        i64::try_from(partition.from).unwrap_or(i64::MAX),
        i64::try_from(partition.to).unwrap_or(i64::MAX),
    );
    let name = &partition.name;
    let mut tx = pool.begin().await?;
    for statement in [
        format!("SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"),
        format!("CREATE TABLE {name} (LIKE {table} INCLUDING DEFAULTS INCLUDING STORAGE)"),
        format!(
            "WITH moved AS (DELETE FROM {table}_default WHERE healthy = {healthy} \
             AND start_unix_nano >= {from} AND start_unix_nano < {to} RETURNING *) \
             INSERT INTO {name} SELECT * FROM moved",
            healthy = partition.healthy
        ),
        format!(
            "ALTER TABLE {table} ATTACH PARTITION {name} \
             FOR VALUES FROM ({healthy}, {from}) TO ({healthy}, {to})",
            healthy = partition.healthy
        ),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(statement))
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    tracing::debug!(partition = %name, "created a partition");
    Ok(())
}

/// The earliest start time a partition of `set` holds, if any: retention's row deletes stop
/// there, since dropping the partition takes what is past it.
pub(crate) async fn partitioned_from(
    pool: &PgPool,
    set: TraceSet,
) -> Result<Option<u64>, StoreError> {
    Ok(list(pool, "trace_blocks")
        .await?
        .into_iter()
        .filter(|p| p.healthy || set == TraceSet::Analysed)
        .map(|p| p.from)
        .min())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn widths_are_at_most_an_eighth_of_the_retention() {
        assert_eq!(width(DAY), Some(3 * HOUR_NANOS));
        assert_eq!(width(7 * DAY), Some(12 * HOUR_NANOS));
        assert_eq!(width(30 * DAY), Some(24 * HOUR_NANOS));
        assert_eq!(width(Duration::from_secs(8 * 3600)), Some(HOUR_NANOS));
        assert_eq!(width(Duration::from_secs(8 * 3600 - 1)), None);
    }

    #[test]
    fn names_round_trip_and_foreign_names_are_ignored() {
        let from = 1_765_000_800 * 1_000_000_000 / HOUR_NANOS * HOUR_NANOS;
        let p = Partition::new("trace_blocks", true, from, from + 3 * HOUR_NANOS);
        assert!(p.name.starts_with("trace_blocks_healthy_"), "{}", p.name);
        assert_eq!(Partition::parse("trace_blocks", &p.name), Some(p.clone()));
        assert_eq!(Partition::parse("trace_terms", &p.name), None);
        for foreign in [
            "trace_blocks_default",
            "trace_blocks_healthy_x_y",
            "trace_blocks_old_2026120600_2026120603",
        ] {
            assert_eq!(Partition::parse("trace_blocks", foreign), None, "{foreign}");
        }
    }

    #[test]
    fn partitions_are_created_ahead_after_the_last_or_from_the_next_boundary() {
        let w = 3 * HOUR_NANOS;
        let now = 1_000 * w + HOUR_NANOS;
        // None yet: from the next boundary, two widths past now.
        let fresh = to_create("t", true, w, &[], now);
        let ranges: Vec<(u64, u64)> = fresh.iter().map(|p| (p.from, p.to)).collect();
        assert_eq!(ranges, [(1_001 * w, 1_002 * w), (1_002 * w, 1_003 * w)]);
        // After the last one, and only up to two widths past now.
        let existing = vec![Partition::new("t", true, 1_000 * w, 1_001 * w)];
        let next: Vec<u64> = to_create("t", true, w, &existing, now)
            .iter()
            .map(|p| p.from)
            .collect();
        assert_eq!(next, [1_001 * w, 1_002 * w]);
        // The other class's partitions do not count, and a last one long past leaves a gap.
        assert_eq!(to_create("t", false, w, &existing, now).len(), 2);
        let old = vec![Partition::new("t", true, 10 * w, 11 * w)];
        assert_eq!(to_create("t", true, w, &old, now)[0].from, 1_001 * w);
        // A wider width starts where the narrower ones ended and ends on its own boundary.
        let wide = 12 * HOUR_NANOS;
        let after = to_create(
            "t",
            true,
            wide,
            &[Partition::new(
                "t",
                true,
                now - HOUR_NANOS,
                now + 2 * HOUR_NANOS,
            )],
            now,
        );
        assert_eq!(after[0].from, now + 2 * HOUR_NANOS);
        assert_eq!(after[0].to % wide, 0);
    }
}

//! The team store, on PostgreSQL.
//!
//! A pool of connections; each batch is one transaction of one `INSERT … SELECT FROM
//! UNNEST(arrays) ON CONFLICT DO NOTHING` (one round trip, idempotent). A commit returns
//! after Postgres flushed its WAL (the server's `synchronous_commit`), so acknowledged
//! spans survive a crash of either process.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::Postgres;
use sqlx::QueryBuilder;
use sqlx::postgres::{PgPool, PgPoolOptions};

use super::backend::{Backend, Writer};
use super::partitions::{self, PartitionPlan, PartitionsKept};
use super::query::{Backlog, Cursor, DiskUsage, DueQuery, TraceSet};
use super::rows::{EncodedBatch, OperationRow, SPAN_COLUMNS, SpanRow, decode_marks};
use super::search::{SearchOrder, TermLayout};
use super::{CLAIM, StoreError};
use crate::clock::now_unix_nano;
use crate::core::model::TraceId;

const INSERT_SPANS: &str = "INSERT INTO spans (trace_id, span_id, parent_span_id, service, name, kind, \
     start_unix_nano, end_unix_nano, status_code, status_message, budget_ms, budget_source, \
     attributes, resource, details) \
     SELECT * FROM UNNEST($1::bytea[], $2::bytea[], $3::bytea[], $4::text[], $5::text[], \
     $6::int2[], $7::int8[], $8::int8[], $9::int2[], $10::text[], $11::float8[], $12::text[], \
     $13::text[], $14::text[], $15::text[]) \
     ON CONFLICT (trace_id, span_id) DO NOTHING";

const UPSERT_OPERATIONS: &str = "INSERT INTO operations (service, name, kind, last_seen_unix_nano) \
     SELECT * FROM UNNEST($1::text[], $2::text[], $3::int2[], $4::int8[]) \
     ON CONFLICT (service, name, kind) DO UPDATE SET last_seen_unix_nano = \
     GREATEST(operations.last_seen_unix_nano, excluded.last_seen_unix_nano)";

/// Traces are sorted, so concurrent writers lock their marks in one order (no deadlock). A
/// trace's wait starts with its first commit since its last analysis (`waiting_since`).
const MARK_DIRTY: &str = "INSERT INTO dirty_traces (trace_id, received_unix_nano, waiting_since) \
     SELECT t, $2, $2 FROM UNNEST($1::bytea[]) AS t \
     ON CONFLICT (trace_id) DO UPDATE SET received_unix_nano = excluded.received_unix_nano, \
     claimed_until = 0";

pub struct PostgresBackend {
    pool: PgPool,
    /// Names this store's claims on traces (`due_traces`): it takes its own back at once.
    claimant: i64,
    /// Summaries written by this process, and the count at which statistics are next
    /// refreshed (see `refresh_statistics`).
    summaries_written: std::sync::atomic::AtomicU64,
    next_analyze_at: std::sync::atomic::AtomicU64,
}

/// Why the first connection to Postgres failed, in words that say what to check.
fn first_connection(error: &sqlx::Error) -> String {
    match error {
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            "Postgres refused the connection: nothing listens at that host and port; is \
             Postgres running there?"
                .into()
        }
        sqlx::Error::Io(io) => format!("could not reach Postgres: {io}"),
        sqlx::Error::Database(db) => format!("Postgres refused the login: {}", db.message()),
        other => format!("could not connect to Postgres: {other}"),
    }
}

/// Connections per store, and how long a write waits for one.
const POOL_SIZE: u32 = 8;
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// Summaries written before the first statistics refresh.
const FIRST_ANALYZE_AT: u64 = 10_000;

impl PostgresBackend {
    /// Connects and runs migrations. The URL may choose a schema with
    /// `?options[search_path]=NAME` (the schema must exist).
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        // One connection first, because its error says why (refused, unknown host,
        // authentication) where the pool's would only say that it timed out.
        match tokio::time::timeout(
            Duration::from_secs(5),
            <sqlx::PgConnection as sqlx::Connection>::connect(url),
        )
        .await
        {
            Err(_) => {
                return Err(StoreError::Unavailable(
                    "Postgres did not answer within 5 s; check the host and port, and that \
                     nothing between here and there drops the connection"
                        .into(),
                ));
            }
            Ok(Err(error)) => return Err(StoreError::Unavailable(first_connection(&error))),
            Ok(Ok(conn)) => {
                let _ = sqlx::Connection::close(conn).await;
            }
        }
        let pool = PgPoolOptions::new()
            .max_connections(POOL_SIZE)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect(url)
            .await?;
        sqlx::migrate!("migrations/postgres").run(&pool).await?;
        Ok(PostgresBackend {
            claimant: rand::random(),
            pool,
            summaries_written: 0.into(),
            next_analyze_at: FIRST_ANALYZE_AT.into(),
        })
    }

    /// Refreshes the planner statistics of the search, rollup and queue tables once the summaries
    /// written since the last refresh reach 10 % of the total (and 10,000). Searches drive
    /// from `trace_terms` newest first and stop at their limit, but only when the planner
    /// knows a term is common: with the statistics of a smaller table it sorts every match
    /// instead (`budgetscope-bench query --db postgres://…`; tests/store_conformance.rs
    /// pins the refresh).
    /// The span rows waiting for analysis and compaction are among them: without
    /// statistics, the planner took each read of a pass's traces for most of a large
    /// backlog and scanned the table whole (`budgetscope-bench retention`, the analysis
    /// pass's `read_ms`).
    /// Autovacuum does this too when it is on, but it may be off, and it lags bulk loads.
    async fn refresh_statistics(&self, written: u64) {
        use std::sync::atomic::Ordering;
        let total = self.summaries_written.fetch_add(written, Ordering::Relaxed) + written;
        let due = self.next_analyze_at.load(Ordering::Relaxed);
        if total < due
            || self
                .next_analyze_at
                .compare_exchange(
                    due,
                    total + total / 10 + FIRST_ANALYZE_AT,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return;
        }
        let started = std::time::Instant::now();
        let result = sqlx::query(
            "ANALYZE trace_terms, trace_summaries, hop_rollups, hop_rollups_hourly, dirty_traces, spans",
        )
        .execute(&self.pool)
        .await;
        match result {
            Ok(_) => {
                tracing::debug!(total, elapsed = ?started.elapsed(), "refreshed planner statistics")
            }
            Err(error) => {
                tracing::warn!(%error, "could not refresh planner statistics; searches may be slower until autovacuum does")
            }
        }
    }

    /// A connection from the pool. When none comes in time, the error says why, which the
    /// pool's own ("pool timed out") does not: Postgres's reason for refusing a new one
    /// (too many clients, too many for the role, starting up), or that this server's
    /// connections are all in use.
    async fn connection(&self) -> Result<sqlx::pool::PoolConnection<Postgres>, StoreError> {
        match self.pool.acquire().await {
            Ok(conn) => Ok(conn),
            Err(sqlx::Error::PoolTimedOut) => {
                Err(StoreError::Unavailable(self.why_no_connection().await))
            }
            Err(error) => Err(error.into()),
        }
    }

    async fn why_no_connection(&self) -> String {
        let waited = ACQUIRE_TIMEOUT.as_secs();
        let options = self.pool.connect_options();
        let attempt = tokio::time::timeout(
            Duration::from_secs(2),
            <sqlx::PgConnection as sqlx::Connection>::connect_with(options.as_ref()),
        )
        .await;
        match attempt {
            Ok(Ok(conn)) => {
                let _ = sqlx::Connection::close(conn).await;
                format!(
                    "no database connection within {waited} s: all {POOL_SIZE} of this \
                     server's connections were in use (statements waiting on a lock or a \
                     slow database; see pg_stat_activity)"
                )
            }
            Ok(Err(sqlx::Error::Database(db))) => format!(
                "no database connection within {waited} s: Postgres refuses new ones: {} \
                 (raise its max_connections or the role's connection limit, or close \
                 other clients)",
                db.message()
            ),
            Ok(Err(error)) => format!(
                "no database connection within {waited} s: {}",
                first_connection(&error)
            ),
            Err(_) => format!(
                "no database connection within {waited} s, and Postgres did not answer a new \
                 one within 2 s; check that it is up and reachable"
            ),
        }
    }

    /// Inserts already-encoded rows in one transaction.
    pub async fn insert_rows(
        &self,
        rows: &[SpanRow],
        operations: &[OperationRow],
        traces: &[[u8; TraceId::LEN]],
    ) -> Result<(), StoreError> {
        // Columns borrow from the rows: one array per column, no copy of the values.
        fn column<'a, T>(rows: &'a [SpanRow], f: impl Fn(&'a SpanRow) -> T) -> Vec<T> {
            rows.iter().map(f).collect()
        }
        let mut conn = self.connection().await?;
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        sqlx::query(INSERT_SPANS)
            .bind(column(rows, |r| r.trace_id.as_slice()))
            .bind(column(rows, |r| r.span_id.as_slice()))
            .bind(column(rows, |r| {
                r.parent_span_id.as_ref().map(|p| p.as_slice())
            }))
            .bind(column(rows, |r| r.service.as_str()))
            .bind(column(rows, |r| r.name.as_str()))
            .bind(column(rows, |r| r.kind))
            .bind(column(rows, |r| r.start_unix_nano))
            .bind(column(rows, |r| r.end_unix_nano))
            .bind(column(rows, |r| r.status_code))
            .bind(column(rows, |r| r.status_message.as_str()))
            .bind(column(rows, |r| r.budget_ms))
            .bind(column(rows, |r| r.budget_source.as_deref()))
            .bind(column(rows, |r| r.attributes.as_str()))
            .bind(column(rows, |r| &*r.resource))
            .bind(column(rows, |r| &*r.details))
            .execute(&mut *tx)
            .await?;
        if !operations.is_empty() {
            sqlx::query(UPSERT_OPERATIONS)
                .bind(operations.iter().map(|o| o.0.as_str()).collect::<Vec<_>>())
                .bind(operations.iter().map(|o| o.1.as_str()).collect::<Vec<_>>())
                .bind(operations.iter().map(|o| o.2).collect::<Vec<_>>())
                .bind(operations.iter().map(|o| o.3).collect::<Vec<_>>())
                .execute(&mut *tx)
                .await?;
        }
        if !traces.is_empty() {
            sqlx::query(MARK_DIRTY)
                .bind(traces)
                .bind(now_unix_nano() as i64)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The benchmark's raw ceiling: the same rows through `COPY … FROM STDIN` (CSV), which
    /// cannot skip duplicates and so is no substitute for `insert_rows`.
    pub async fn copy_rows(&self, rows: &[SpanRow]) -> Result<u64, StoreError> {
        let mut csv = Vec::with_capacity(rows.len() * 512);
        for row in rows {
            write_csv_row(&mut csv, row);
        }
        let mut conn = self.pool.acquire().await?;
        let mut copy = conn
            .copy_in_raw(&format!(
                "COPY spans ({SPAN_COLUMNS}) FROM STDIN WITH (FORMAT csv)"
            ))
            .await?;
        copy.send(csv).await?;
        Ok(copy.finish().await?)
    }
}

/// Creates a schema (for isolated benchmark and test databases).
pub async fn create_schema(url: &str, schema: &str) -> Result<(), StoreError> {
    use sqlx::Connection as _;
    let mut conn = sqlx::PgConnection::connect(url).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA IF NOT EXISTS \"{schema}\""
    )))
    .execute(&mut conn)
    .await?;
    Ok(())
}

/// Drops a schema created by `create_schema`, with everything in it.
pub async fn drop_schema(url: &str, schema: &str) -> Result<(), StoreError> {
    use sqlx::Connection as _;
    let mut conn = sqlx::PgConnection::connect(url).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
    )))
    .execute(&mut conn)
    .await?;
    Ok(())
}

fn write_csv_row(out: &mut Vec<u8>, row: &SpanRow) {
    use std::io::Write as _;
    let bytea = |out: &mut Vec<u8>, bytes: &[u8]| {
        let _ = write!(out, "\\x{}", hex::encode(bytes));
    };
    let text = |out: &mut Vec<u8>, s: &str| {
        out.push(b'"');
        for b in s.bytes() {
            if b == b'"' {
                out.push(b'"');
            }
            out.push(b);
        }
        out.push(b'"');
    };
    bytea(out, &row.trace_id);
    out.push(b',');
    bytea(out, &row.span_id);
    out.push(b',');
    if let Some(parent) = &row.parent_span_id {
        bytea(out, parent);
    }
    out.push(b',');
    text(out, &row.service);
    out.push(b',');
    text(out, &row.name);
    let _ = write!(
        out,
        ",{},{},{},{},",
        row.kind, row.start_unix_nano, row.end_unix_nano, row.status_code
    );
    text(out, &row.status_message);
    out.push(b',');
    if let Some(ms) = row.budget_ms {
        let _ = write!(out, "{ms}");
    }
    out.push(b',');
    if let Some(source) = &row.budget_source {
        text(out, source);
    }
    out.push(b',');
    text(out, &row.attributes);
    out.push(b',');
    text(out, &row.resource);
    out.push(b',');
    text(out, &row.details);
    out.push(b'\n');
}

#[async_trait]
impl Backend for PostgresBackend {
    type Db = Postgres;
    type Writer<'a> = PoolWriter;

    const NAME: &'static str = "postgres";
    const MARKS: &'static str = "dirty_traces";
    const ROLLUP_CHUNK: usize = 2000;
    /// Several servers sharing the database write summaries one at a time (a lock held
    /// until the transaction ends), so none loses another's rollup counts.
    const WRITERS_LOCK: &'static str = "SELECT pg_advisory_xact_lock(7102455)";
    const RESTART_WAIT: &'static str =
        "UPDATE dirty_traces SET waiting_since = received_unix_nano WHERE trace_id IN ";
    const SUBSTRING: &'static str = "strpos";
    const JOIN_TEXT: &'static str = "string_agg(data, '|')";
    const PARTITIONED: bool = true;
    const TERMS: TermLayout = TermLayout::ByTrace;
    const COMPACTION_LOCK: &'static str = "SELECT pg_advisory_xact_lock(7102456)";

    fn rows_affected(result: &sqlx::postgres::PgQueryResult) -> u64 {
        result.rows_affected()
    }

    fn reader(&self) -> &PgPool {
        &self.pool
    }

    async fn writer(&self) -> Result<PoolWriter, StoreError> {
        Ok(PoolWriter(self.connection().await?))
    }

    async fn no_connection(&self) -> String {
        self.why_no_connection().await
    }

    async fn write_batch(
        &self,
        batch: &EncodedBatch,
        operations: &[OperationRow],
    ) -> Result<(), StoreError> {
        self.insert_rows(&batch.rows, operations, &batch.traces)
            .await
    }

    async fn delete_spans(
        conn: &mut sqlx::PgConnection,
        cutoff: i64,
        limit: u32,
    ) -> Result<u64, StoreError> {
        Ok(sqlx::query(
            "DELETE FROM spans WHERE ctid IN \
             (SELECT ctid FROM spans WHERE start_unix_nano < $1 LIMIT $2)",
        )
        .bind(cutoff)
        .bind(i64::from(limit))
        .execute(conn)
        .await?
        .rows_affected())
    }

    async fn disk_usage(&self) -> Result<DiskUsage, StoreError> {
        // This schema's tables with their indexes and TOAST: several servers (or tests) may
        // share one database in schemas of their own.
        let (bytes,): (Option<i64>,) = sqlx::query_as(
            "SELECT CAST(sum(pg_total_relation_size(c.oid)) AS BIGINT) FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(DiskUsage {
            bytes: bytes.unwrap_or(0).max(0) as u64,
            in_use_bytes: None,
        })
    }

    async fn analysis_backlog(&self, quiet_before: u64) -> Result<Backlog, StoreError> {
        // One row per trace, holding its last commit and since when it waits.
        let (traces, oldest, active): (i64, Option<i64>, i64) = sqlx::query_as(
            "SELECT count(*), min(received_unix_nano), \
             count(*) FILTER (WHERE waiting_since < $1 AND received_unix_nano >= $1) \
             FROM dirty_traces",
        )
        .bind(i64::try_from(quiet_before).unwrap_or(i64::MAX))
        .fetch_one(&self.pool)
        .await?;
        Ok(Backlog {
            traces: traces.max(0) as u64,
            oldest_commit_unix_nano: oldest.map(|t| t.max(0) as u64),
            active: active.max(0) as u64,
        })
    }

    async fn due_traces(&self, query: &DueQuery) -> Result<Vec<(TraceId, i64)>, StoreError> {
        // Claimed in one statement; a row another server is claiming is skipped, not
        // waited for. This store's own claims are taken again (a pass that failed). A trace
        // still receiving spans is due once it has waited since before `$6`.
        let now = now_unix_nano() as i64;
        let rows: Vec<(Vec<u8>, i64)> = sqlx::query_as(
            "UPDATE dirty_traces d SET claimed_until = $3, claimed_by = $5 \
             FROM (SELECT trace_id FROM dirty_traces \
                   WHERE (received_unix_nano < $1 OR waiting_since < $6) \
                   AND (claimed_until < $4 OR claimed_by = $5) \
                   ORDER BY least(received_unix_nano, waiting_since) LIMIT $2 \
                   FOR UPDATE SKIP LOCKED) q \
             WHERE d.trace_id = q.trace_id \
             RETURNING d.trace_id, d.received_unix_nano",
        )
        .bind(i64::try_from(query.quiet_before).unwrap_or(i64::MAX))
        .bind(i64::from(query.limit))
        .bind(now.saturating_add(CLAIM.as_nanos() as i64))
        .bind(now)
        .bind(self.claimant)
        .bind(i64::try_from(query.waiting_before).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await?;
        decode_marks(rows)
    }

    async fn summaries_written(&self, count: u64) {
        self.refresh_statistics(count).await;
    }

    async fn keep_partitions(
        &self,
        plan: PartitionPlan,
        now_unix_nano: u64,
    ) -> Result<PartitionsKept, StoreError> {
        partitions::keep(&self.pool, plan, now_unix_nano).await
    }

    async fn partitioned_from(&self, set: TraceSet) -> Result<Option<u64>, StoreError> {
        partitions::partitioned_from(&self.pool, set).await
    }

    fn push_after(q: &mut QueryBuilder<Postgres>, order: SearchOrder, cursor: Cursor) {
        let order = order.exact();
        let start = i64::try_from(cursor.start_unix_nano).unwrap_or(i64::MAX);
        q.push(format!(
            " AND ({order}.start_unix_nano, {order}.trace_id) < ("
        ))
        .push_bind(start)
        .push(", ")
        .push_bind(cursor.trace_id.0.to_vec())
        .push(")");
    }
}

/// A pooled connection for one write: back to the pool when dropped.
pub struct PoolWriter(sqlx::pool::PoolConnection<Postgres>);

impl std::ops::Deref for PoolWriter {
    type Target = sqlx::PgConnection;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for PoolWriter {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Writer<Postgres> for PoolWriter {
    fn done(&mut self) {}
}

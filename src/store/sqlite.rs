//! The embedded default store.
//!
//! WAL journal with `synchronous = NORMAL`: a committed transaction survives a crash of
//! the process; the last transactions before a power loss or OS crash may be lost
//! (ARCHITECTURE.md, "Durability"). All writes go through one connection (SQLite allows
//! one writer at a time); reads use their own pool and never wait for writes.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{QueryBuilder, Sqlite};

use super::{
    EncodedBatch, Operation, OperationRow, SPAN_COLUMNS, SpanRow, Store, StoreError, StoredRow,
    decode_operations, decode_rows,
};
use crate::model::{Span, TraceId};

/// Rows per INSERT statement: 15 binds each stays under SQLite's 32,766 bind limit.
const ROWS_PER_STATEMENT: usize = 1000;

/// Splits `len` rows into statement sizes from a fixed set (1000, then powers of two), so
/// that every INSERT text repeats and stays in the prepared-statement cache: preparing a
/// statement with thousands of parameters costs more than running it.
fn statement_sizes(len: usize) -> impl Iterator<Item = usize> {
    let full = std::iter::repeat_n(ROWS_PER_STATEMENT, len / ROWS_PER_STATEMENT);
    let rest = len % ROWS_PER_STATEMENT;
    let powers = (0..usize::BITS)
        .rev()
        .map(|bit| 1usize << bit)
        .filter(move |size| rest & size != 0);
    full.chain(powers)
}

/// How often the background checkpointer copies the WAL into the database file.
const CHECKPOINT_PERIOD: Duration = Duration::from_millis(500);

pub struct SqliteStore {
    writer: SqlitePool,
    reader: SqlitePool,
    /// Stops the background checkpointer when the store is dropped.
    _checkpointer: Option<tokio_util::sync::DropGuard>,
}

impl SqliteStore {
    /// Opens (creating if needed) the database and runs migrations.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::Unavailable(format!("invalid SQLite URL {url:?}: {e}")))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10))
            // 8 MiB measured best for ingest (BENCHMARKS.md): SQLite scans the page cache at
            // every commit, so 64 MiB cost more per commit than it saved in reads.
            .pragma("cache_size", "-8192")
            .pragma("temp_store", "memory");
        let in_memory = url.contains(":memory:") || url.contains("mode=memory");
        // Checkpoints run on their own connection (below), not in the writer's commits.
        let writer_options = if in_memory {
            options.clone()
        } else {
            options.clone().pragma("wal_autocheckpoint", "0")
        };
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(if in_memory { 1 } else { 0 })
            .idle_timeout(if in_memory {
                None
            } else {
                Some(Duration::from_secs(600))
            })
            .max_lifetime(if in_memory {
                None
            } else {
                Some(Duration::from_secs(3600))
            })
            .connect_with(writer_options)
            .await?;
        sqlx::migrate!("migrations/sqlite").run(&writer).await?;
        // An in-memory database exists once per connection: readers must share the writer's.
        let reader = if in_memory {
            writer.clone()
        } else {
            SqlitePoolOptions::new()
                .max_connections(4)
                .connect_with(options.clone().read_only(true))
                .await?
        };
        let checkpointer = if in_memory {
            None
        } else {
            Some(start_checkpointer(options).await?)
        };
        Ok(SqliteStore {
            writer,
            reader,
            _checkpointer: checkpointer,
        })
    }

    /// Inserts already-encoded rows in one transaction (also the benchmark's raw ceiling).
    pub(crate) async fn insert_rows(
        &self,
        rows: &[SpanRow],
        operations: &[OperationRow],
    ) -> Result<(), StoreError> {
        let mut tx = self.writer.begin().await?;
        let mut remaining = rows;
        for size in statement_sizes(rows.len()) {
            let (chunk, rest) = remaining.split_at(size);
            remaining = rest;
            let mut insert: QueryBuilder<Sqlite> =
                QueryBuilder::new(format!("INSERT INTO spans ({SPAN_COLUMNS}) "));
            insert.push_values(chunk, |mut b, row| {
                b.push_bind(row.trace_id.as_slice())
                    .push_bind(row.span_id.as_slice())
                    .push_bind(row.parent_span_id.as_deref())
                    .push_bind(row.service.as_str())
                    .push_bind(row.name.as_str())
                    .push_bind(row.kind)
                    .push_bind(row.start_unix_nano)
                    .push_bind(row.end_unix_nano)
                    .push_bind(row.status_code)
                    .push_bind(row.status_message.as_str())
                    .push_bind(row.budget_ms)
                    .push_bind(row.budget_source.as_deref())
                    .push_bind(row.attributes.as_str())
                    .push_bind(row.resource.as_str())
                    .push_bind(row.details.as_str());
            });
            insert.push(" ON CONFLICT (trace_id, span_id) DO NOTHING");
            insert.build().persistent(true).execute(&mut *tx).await?;
        }
        let mut remaining = operations;
        for size in statement_sizes(operations.len()) {
            let (chunk, rest) = remaining.split_at(size);
            remaining = rest;
            let mut upsert: QueryBuilder<Sqlite> = QueryBuilder::new(
                "INSERT INTO operations (service, name, kind, last_seen_unix_nano) ",
            );
            upsert.push_values(chunk, |mut b, (service, name, kind, last)| {
                b.push_bind(service.as_str())
                    .push_bind(name.as_str())
                    .push_bind(*kind)
                    .push_bind(*last);
            });
            upsert.push(
                " ON CONFLICT (service, name, kind) DO UPDATE SET last_seen_unix_nano = \
                 max(last_seen_unix_nano, excluded.last_seen_unix_nano)",
            );
            upsert.build().persistent(true).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

/// Copies committed WAL frames into the database file every `CHECKPOINT_PERIOD` with a
/// PASSIVE checkpoint, which never blocks the writer or readers. The writer's own
/// auto-checkpoint is off, so commits never pay for this work.
async fn start_checkpointer(
    options: SqliteConnectOptions,
) -> Result<tokio_util::sync::DropGuard, StoreError> {
    use sqlx::Connection as _;
    let mut conn = sqlx::SqliteConnection::connect_with(&options).await?;
    let stop = tokio_util::sync::CancellationToken::new();
    let stopped = stop.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stopped.cancelled() => break,
                _ = tokio::time::sleep(CHECKPOINT_PERIOD) => {}
            }
            if let Err(error) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
                .execute(&mut conn)
                .await
            {
                tracing::warn!(%error, "sqlite checkpoint failed; will try again");
            }
        }
        // A last full pass so the WAL does not outlive a clean shutdown.
        let _ = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
            .execute(&mut conn)
            .await;
        let _ = conn.close().await;
    });
    Ok(stop.drop_guard())
}

#[async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.reader).await?;
        Ok(())
    }

    async fn write_batch(&self, batch: &EncodedBatch) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        self.insert_rows(&batch.rows, &batch.operations).await
    }

    async fn trace(&self, trace_id: TraceId) -> Result<Vec<Span>, StoreError> {
        let rows: Vec<StoredRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {SPAN_COLUMNS} FROM spans WHERE trace_id = ? ORDER BY start_unix_nano, span_id"
        )))
        .bind(trace_id.0.as_slice())
        .fetch_all(&self.reader)
        .await?;
        decode_rows(rows)
    }

    async fn services(&self) -> Result<Vec<String>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT DISTINCT service FROM operations ORDER BY service")
                .fetch_all(&self.reader)
                .await?,
        )
    }

    async fn operations(&self, service: &str) -> Result<Vec<Operation>, StoreError> {
        let rows: Vec<(String, i16)> = sqlx::query_as(
            "SELECT name, kind FROM operations WHERE service = ? ORDER BY name, kind",
        )
        .bind(service)
        .fetch_all(&self.reader)
        .await?;
        Ok(decode_operations(rows))
    }

    async fn delete_before(&self, cutoff_unix_nano: u64, limit: u32) -> Result<u64, StoreError> {
        let cutoff = i64::try_from(cutoff_unix_nano).unwrap_or(i64::MAX);
        let mut tx = self.writer.begin().await?;
        let deleted = sqlx::query(
            "DELETE FROM spans WHERE rowid IN \
             (SELECT rowid FROM spans WHERE start_unix_nano < ? LIMIT ?)",
        )
        .bind(cutoff)
        .bind(i64::from(limit))
        .execute(&mut *tx)
        .await?
        .rows_affected();
        sqlx::query("DELETE FROM operations WHERE last_seen_unix_nano < ?")
            .bind(cutoff)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(deleted)
    }

    async fn span_count(&self) -> Result<u64, StoreError> {
        let count: i64 = sqlx::query_scalar("SELECT count(*) FROM spans")
            .fetch_one(&self.reader)
            .await?;
        Ok(count as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::statement_sizes;

    #[test]
    fn statement_sizes_cover_every_row_from_a_fixed_set() {
        for len in [0, 1, 7, 999, 1000, 1001, 2536, 20_000] {
            let sizes: Vec<usize> = statement_sizes(len).collect();
            assert_eq!(sizes.iter().sum::<usize>(), len, "{len}");
            assert!(
                sizes.iter().all(|s| *s == 1000 || s.is_power_of_two()),
                "{len}: {sizes:?}"
            );
        }
        assert_eq!(
            statement_sizes(2536).collect::<Vec<_>>(),
            [1000, 1000, 512, 16, 8]
        );
    }
}

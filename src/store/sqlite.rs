//! The embedded default store.
//!
//! WAL journal with `synchronous = NORMAL`: a committed transaction survives a crash of
//! the process; the last transactions before a power loss or OS crash may be lost
//! (ARCHITECTURE.md, "Durability contract"). Writes go one at a time (SQLite allows one writer)
//! through two connections behind one lock (`WriteSide`): ingest's own and sqlx's for
//! everything else. Reads use their own pool and never wait for writes.
//!
//! Ingest inserts on a rusqlite connection of its own (cached single-row statements in one
//! `BEGIN IMMEDIATE` transaction); 4 read-only connections read pages by read(2), no map.
//! The start index keys on `start_unix_nano >> 30` (~1 s buckets), so inserts land at its
//! right edge; a range query names that expression, then tests the exact start.
//! Checkpoints stay off the writer's path: a checkpointer connection copies the WAL every
//! 500 ms (PASSIVE); past 64 MiB of WAL it flushes the database file and copies again
//! until little is left (or the WAL reaches 512 MiB), then asks the writer to start the WAL
//! over between two transactions. The writers' own checkpoint at commit (past 1 GiB)
//! bounds the WAL when that falls behind.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::TryStreamExt as _;
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use sqlx::{QueryBuilder, Sqlite};

use super::StoreError;
use super::backend::{Backend, Writer};
use super::query::{Backlog, Cursor, DiskUsage, DueQuery};
use super::rows::{EncodedBatch, OperationRow, SPAN_COLUMNS, SpanRow, decode_marks};
use super::search::{SearchOrder, TermLayout};
use crate::clock::now_unix_nano;
use crate::core::model::TraceId;
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// How often the background checkpointer copies the WAL into the database file.
const CHECKPOINT_PERIOD: Duration = Duration::from_millis(500);

/// WAL frames (4 KiB pages) past which the WAL starts over. Under writes that never pause,
/// passive checkpoints never reach the last frame and SQLite never starts the WAL over by
/// itself. So the checkpointer flushes the database file and copies what was committed
/// meanwhile, round after round, until a round leaves little (`RESET_LEFT_FRAMES`), then
/// asks the writer (`WalSignals::reset_due`), which checkpoints between two transactions,
/// when nothing else commits: the next transaction starts the WAL over. Leaving the whole
/// reset to the writers' commits (`wal_autocheckpoint` alone) cost much of sustained
/// ingest's throughput (`budgetscope-bench ingest --spans 1000000`).
const WAL_RESET_FRAMES: i64 = 16_384;

/// Frames a flush-and-copy round of the checkpointer may copy and still leave the writer's
/// reset checkpoint to copy and flush what follows; more, and it flushes again: the writer
/// waits for that checkpoint between two transactions, and its wait grows with what the
/// last round left.
const RESET_LEFT_FRAMES: i64 = 256;

/// The WAL past which the checkpointer stops its rounds and leaves the rest to the writer's
/// reset, however much that is: half of `WAL_BOUND_FRAMES` (512 MiB), so that the reset
/// comes before the writers' own checkpoint at commit.
const ROUNDS_UNTIL_FRAMES: i64 = 8 * WAL_RESET_FRAMES;

/// The writers' own checkpoint at commit (SQLite's `wal_autocheckpoint`), sixteen times
/// `WAL_RESET_FRAMES` (1 GiB): it bounds the WAL only when the checkpointer falls behind the
/// writes or readers keep older snapshots past a reset, and it is retried at every commit.
/// In a burst the WAL grows past four times `WAL_RESET_FRAMES` before the checkpointer's
/// rounds catch up, and this checkpoint, copying in the writer's commit, set the export
/// p99 (BENCHMARKS.md, "Burst beside the analyzer").
const WAL_BOUND_FRAMES: &str = "262144";

pub struct SqliteBackend {
    /// The lock on `<file>.lock` that makes the file this server's (`own_file`); `None` in
    /// memory.
    _owner: Option<std::fs::File>,
    writer: SqlitePool,
    /// What the checkpointer tells the writer about the WAL.
    wal: Arc<WalSignals>,
    /// The write connections, one write at a time (`write_connection`, `insert_rows`).
    writes: tokio::sync::Mutex<WriteSide>,
    /// The database file, which the ingest writer opens itself; `None` in memory.
    file: Option<std::path::PathBuf>,
    reader: SqlitePool,
    /// Stops the background checkpointer when the store is dropped.
    _checkpointer: Option<tokio_util::sync::DropGuard>,
}

impl SqliteBackend {
    /// Opens (creating if needed) the database and runs migrations. A database file is this
    /// server's alone for the store's life (`own_file`), and a file that is not a
    /// budgetscope database is refused untouched (`check_file`).
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let base = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::Unavailable(format!("invalid SQLite URL {url:?}: {e}")))?;
        let in_memory = url.contains(":memory:") || url.contains("mode=memory");
        let owner = match in_memory {
            true => None,
            false => {
                let file = base.get_filename().to_owned();
                let owner = own_file(&file)?;
                check_file(&base, &file).await?;
                Some(owner)
            }
        };
        let options = base
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(BUSY_TIMEOUT);
        let options = CONNECTION_PRAGMAS
            .iter()
            .fold(options, |options, (name, value)| {
                options.pragma(*name, *value)
            });
        let writer_options = if in_memory {
            options.clone()
        } else {
            WRITER_PRAGMAS
                .iter()
                .fold(options.clone(), |options, (name, value)| {
                    options.pragma(*name, *value)
                })
                // Only retention and the analyzer's summaries write through sqlx on a file
                // database (the ingest writer has a connection of its own, `WriteSide`).
                .pragma("cache_size", "-2048")
                .busy_timeout(BACKGROUND_BUSY_TIMEOUT)
        };
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            // A ping before each transaction would be one more round trip to the
            // connection's worker thread; one file connection does not go stale between
            // two transactions (a failing one still fails the write that uses it).
            .test_before_acquire(false)
            // An in-memory database lives as long as its one connection.
            .min_connections(u32::from(in_memory))
            .idle_timeout((!in_memory).then(|| Duration::from_secs(600)))
            .max_lifetime((!in_memory).then(|| Duration::from_secs(3600)))
            .connect_with(writer_options)
            .await?;
        let migrating = std::time::Instant::now();
        sqlx::migrate!("migrations/sqlite").run(&writer).await?;
        if migrating.elapsed() > Duration::from_secs(1) {
            tracing::info!(
                seconds = migrating.elapsed().as_secs(),
                "the database schema is up to date"
            );
        }
        if !in_memory {
            // A write at start (the file's application id, "bdsc"): a database this server
            // may not write stops start-up here rather than failing every export later.
            sqlx::query("PRAGMA application_id = 1650750307")
                .execute(&writer)
                .await?;
        }
        // An in-memory database exists once per connection: readers must share the writer's.
        let reader = if in_memory {
            writer.clone()
        } else {
            // 2 MiB of page cache each instead of 8 lowers the peak RSS at a steady 10k
            // spans/s with the same query times (`budgetscope-bench ingest --rate 10000`,
            // `budgetscope-bench query`).
            let options = options
                .clone()
                .read_only(true)
                .pragma("cache_size", "-2048");
            SqlitePoolOptions::new()
                .max_connections(4)
                .connect_with(options)
                .await?
        };
        let file = (!in_memory).then(|| options.get_filename().to_owned());
        let wal = Arc::new(WalSignals::default());
        let checkpointer = if in_memory {
            None
        } else {
            Some(start_checkpointer(options, wal.clone()).await?)
        };
        Ok(SqliteBackend {
            _owner: owner,
            writer,
            wal,
            writes: tokio::sync::Mutex::new(WriteSide {
                sqlx: None,
                ingest: None,
            }),
            file,
            reader,
            _checkpointer: checkpointer,
        })
    }

    /// The sqlx write connection, for one transaction of retention or the analyzer (and of
    /// every write to an in-memory database). Every write first starts the WAL over when
    /// that is due.
    ///
    /// The connection stays out of the pool between writes: given back after each one, sqlx
    /// pinged it on its worker thread and the next write waited for that hand-back.
    pub(crate) async fn write_connection(&self) -> Result<WriteConnection<'_>, StoreError> {
        let mut side = self.writes.lock().await;
        if side.sqlx.is_none() {
            side.sqlx = Some(self.writer.acquire().await?);
        }
        let mut conn = WriteConnection {
            side,
            keep: false,
            in_memory: self.file.is_none(),
        };
        if self.take_wal_reset() {
            log_reset(passive_checkpoint(&mut conn).await);
        }
        Ok(conn)
    }

    /// Whether the checkpointer asked for a WAL reset (`WAL_RESET_FRAMES`), which the
    /// caller then runs: a PASSIVE checkpoint on the connection about to write.
    fn take_wal_reset(&self) -> bool {
        self.wal.reset_due.swap(false, Ordering::AcqRel)
    }

    /// Inserts already-encoded rows in one transaction (also the benchmark's raw ceiling).
    ///
    /// The statements run on the calling thread (the ingest writer's own), one prepared
    /// single-row statement per table, on a connection the store opened with rusqlite and
    /// keeps for these inserts (`WriteSide::ingest`). Through sqlx's statement API every
    /// statement was a round trip to the connection's worker thread and every row was
    /// copied into an argument buffer first (`budgetscope-bench ingest` commits far more
    /// spans/s without); through sqlx's locked raw handle, each transaction still began
    /// with a round trip to that thread.
    pub async fn insert_rows(
        &self,
        rows: &[SpanRow],
        operations: &[OperationRow],
        traces: &[[u8; TraceId::LEN]],
    ) -> Result<(), StoreError> {
        let Some(file) = &self.file else {
            return self.insert_rows_in_memory(rows, operations, traces).await;
        };
        let mut side = self.writes.lock().await;
        let result = run_blocking(|| {
            if side.ingest.is_none() {
                side.ingest = Some(open_ingest_connection(file)?);
            }
            let db = side.ingest.as_ref().expect("opened above");
            if self.take_wal_reset() {
                log_reset(db.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
                    Ok((row.get(0)?, row.get(1)?, row.get(2)?))
                }));
            }
            insert_on(db, rows, operations, traces)
        });
        if result.is_err() {
            // Opened afresh for the next write, whatever state this one is in.
            side.ingest = None;
        }
        result.map_err(StoreError::from)
    }

    /// `insert_rows` for an in-memory database, which exists only in the sqlx connection:
    /// the same statements on that connection's raw handle.
    async fn insert_rows_in_memory(
        &self,
        rows: &[SpanRow],
        operations: &[OperationRow],
        traces: &[[u8; TraceId::LEN]],
    ) -> Result<(), StoreError> {
        let mut conn = self.write_connection().await?;
        let result = {
            let mut handle = conn.lock_handle().await?;
            let raw = handle.as_raw_handle();
            run_blocking(|| {
                // SAFETY: `handle` keeps the connection locked for this function alone until
                // it is dropped, after `db`; `from_handle` never closes the handle it is given.
                let db = unsafe { rusqlite::Connection::from_handle(raw.as_ptr()) }?;
                insert_on(&db, rows, operations, traces)
            })
        };
        if result.is_ok() {
            conn.keep();
        }
        result.map_err(StoreError::from)
    }
}

/// The lock file beside a database file: `budgetscope.db` → `budgetscope.db.lock`.
pub fn lock_path(file: &std::path::Path) -> std::path::PathBuf {
    let mut path = file.as_os_str().to_owned();
    path.push(".lock");
    path.into()
}

/// Makes `file` this process's: an exclusive lock on its lock file, held until the returned
/// handle is dropped or the process ends (the OS lets it go however the process ends). A
/// second server on the file is refused here, before it reads or migrates anything, with
/// what the first wrote of itself; two started at once cannot race through a migration.
fn own_file(file: &std::path::Path) -> Result<std::fs::File, StoreError> {
    use std::io::{Read as _, Seek as _, Write as _};
    let path = lock_path(file);
    let cannot = |e: std::io::Error| {
        StoreError::Unavailable(format!(
            "could not open the lock file {} beside the database: {e}; check the directory's \
             permissions",
            path.display()
        ))
    };
    let mut lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(cannot)?;
    match lock.try_lock() {
        Ok(()) => {
            let started = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
            let holder = format!("pid {}, started {started}\n", std::process::id());
            lock.set_len(0)
                .and_then(|()| lock.rewind())
                .and_then(|()| lock.write_all(holder.as_bytes()))
                .map_err(cannot)?;
            Ok(lock)
        }
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = lock.read_to_string(&mut holder);
            Err(StoreError::Refused(format!(
                "{} is in use by another budgetscope server ({}); a SQLite file takes one \
                 server: stop that one, or give this one another --db (several servers share \
                 one database on Postgres)",
                file.display(),
                holder.trim()
            )))
        }
        Err(std::fs::TryLockError::Error(e)) => Err(cannot(e)),
    }
}

/// Refuses, without changing it, an existing file that is not a budgetscope database: one
/// that is not SQLite, one with another program's tables, or one whose schema comes from a
/// newer budgetscope. Read through a read-only connection that sets no journal mode.
async fn check_file(base: &SqliteConnectOptions, file: &std::path::Path) -> Result<(), StoreError> {
    use sqlx::Connection as _;
    if std::fs::metadata(file).map_or(true, |m| m.len() == 0) {
        return Ok(());
    }
    let probe = base.clone().read_only(true).create_if_missing(false);
    let not_budgetscope = |what: String| {
        StoreError::Refused(format!(
            "{} is not a budgetscope database ({what}); it was left as it is: give --db a new \
             file, or the one budgetscope wrote",
            file.display()
        ))
    };
    let mut conn = sqlx::SqliteConnection::connect_with(&probe).await?;
    let tables: Result<Vec<(String,)>, sqlx::Error> = sqlx::query_as(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' \
         ORDER BY name",
    )
    .fetch_all(&mut conn)
    .await;
    let tables: Vec<String> = match tables {
        Ok(rows) => rows.into_iter().map(|(name,)| name).collect(),
        // SQLITE_NOTADB (26): the file is something else.
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("26") => {
            return Err(not_budgetscope("it is not a SQLite file".into()));
        }
        Err(e) => return Err(e.into()),
    };
    if tables.is_empty() {
        return Ok(());
    }
    if !tables.iter().any(|t| t == "_sqlx_migrations") {
        let mut listed = tables
            .iter()
            .take(5)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        if tables.len() > 5 {
            listed.push_str(", …");
        }
        return Err(not_budgetscope(format!(
            "it holds another program's tables: {listed}"
        )));
    }
    let (newest,): (Option<i64>,) = sqlx::query_as("SELECT max(version) FROM _sqlx_migrations")
        .fetch_one(&mut conn)
        .await?;
    let known = sqlx::migrate!("migrations/sqlite")
        .iter()
        .map(|m| m.version)
        .max()
        .unwrap_or(0);
    if let Some(newest) = newest.filter(|v| *v > known) {
        return Err(StoreError::Refused(format!(
            "{} was written by a newer budgetscope (schema version {newest}; this one knows up \
             to {known}); run that version, or give --db another file",
            file.display()
        )));
    }
    if let Some(newest) = newest.filter(|v| *v < known) {
        tracing::info!(
            from = newest,
            to = known,
            "upgrading {}'s schema before serving: on a large store this takes minutes \
             (an index is rewritten), and the server listens once it is done; do not stop it",
            file.display()
        );
    }
    Ok(())
}

/// How long a connection waits for another's lock before it fails (SQLite's busy timeout).
/// Only another process holds the lock that long (this one's writers take turns behind
/// `WriteSide`): a request queued behind a failing transaction then hears, retryably,
/// within two of these and the background writes queued between them, inside the
/// exporters' usual 10 s timeout.
const BUSY_TIMEOUT: Duration = Duration::from_secs(2);

/// The busy timeout of the background writes (the analyzer, retention, the lease, alerts),
/// which take turns with ingest behind `WriteSide`: while another process holds the lock
/// they give up soon and try again at their next turn, instead of keeping ingest waiting.
const BACKGROUND_BUSY_TIMEOUT: Duration = Duration::from_millis(500);

/// Settings every connection has, sqlx's (`SqliteBackend::connect`) and ingest's own
/// (`open_ingest_connection`).
const CONNECTION_PRAGMAS: &[(&str, &str)] = &[
    ("synchronous", "NORMAL"),
    // 8 MiB measured best for ingest (`budgetscope-bench ingest`): SQLite scans the page cache at every
    // commit, so 64 MiB cost more per commit than it saved in reads.
    ("cache_size", "-8192"),
    ("temp_store", "memory"),
    // Pages are copied in by read(2), not read through a memory map: every page of the file
    // a connection touched through a map counted as the server's resident memory, most of
    // its peak RSS beside the held spans at a steady 10k spans/s, for the same CPU and
    // query times (`budgetscope-bench ingest --rate 10000`, `budgetscope-bench query`).
    ("mmap_size", "0"),
];

/// Settings of the connections that write to a database file, over `CONNECTION_PRAGMAS`.
const WRITER_PRAGMAS: &[(&str, &str)] = &[("wal_autocheckpoint", WAL_BOUND_FRAMES)];

/// Opens the ingest writer's connection to `file` (already created, in WAL mode and
/// migrated by sqlx), with the settings of sqlx's writer.
fn open_ingest_connection(file: &std::path::Path) -> rusqlite::Result<rusqlite::Connection> {
    use rusqlite::OpenFlags;
    let db = rusqlite::Connection::open_with_flags(
        file,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    db.busy_timeout(BUSY_TIMEOUT)?;
    let settings: String = CONNECTION_PRAGMAS
        .iter()
        .chain(WRITER_PRAGMAS)
        .map(|(name, value)| format!("PRAGMA {name} = {value};"))
        .collect();
    db.execute_batch(&settings)?;
    Ok(db)
}

/// The connections that write, behind one lock: SQLite takes one writer at a time, and a
/// second connection waiting in its busy handler would sleep in steps of up to 100 ms.
struct WriteSide {
    /// The writer pool's one connection, taken out at the first write and kept between
    /// writes (`SqliteBackend::write_connection`). `None` until then, after a write failed,
    /// and always between writes to an in-memory database, whose readers share it.
    sqlx: Option<PoolConnection<Sqlite>>,
    /// The ingest writer's own connection to the file (`SqliteBackend::insert_rows`), opened
    /// at its first insert and again after an insert failed.
    ingest: Option<rusqlite::Connection>,
}

/// The writer connection for one write (`SqliteBackend::write_connection`), locked against
/// every other write until dropped.
pub struct WriteConnection<'a> {
    side: tokio::sync::MutexGuard<'a, WriteSide>,
    /// Set by `keep` when the write succeeded. A failed write gives the connection back to
    /// the pool, which tests it and replaces it if it has gone bad (a rollback sqlx queued
    /// for a dropped transaction runs there too).
    keep: bool,
    in_memory: bool,
}

impl WriteConnection<'_> {
    /// The write succeeded: the connection stays out of the pool for the next one.
    pub(crate) fn keep(&mut self) {
        self.keep = true;
    }
}

impl std::ops::Deref for WriteConnection<'_> {
    type Target = sqlx::SqliteConnection;

    fn deref(&self) -> &Self::Target {
        self.side
            .sqlx
            .as_ref()
            .expect("a WriteConnection always holds the connection")
    }
}

impl std::ops::DerefMut for WriteConnection<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.side
            .sqlx
            .as_mut()
            .expect("a WriteConnection always holds the connection")
    }
}

impl Drop for WriteConnection<'_> {
    fn drop(&mut self) {
        // An in-memory database's readers read through this same connection.
        if !self.keep || self.in_memory {
            self.side.sqlx.take();
        }
    }
}

/// The work of `insert_rows`, on a connection of its own for the duration.
fn insert_on(
    db: &rusqlite::Connection,
    rows: &[SpanRow],
    operations: &[OperationRow],
    traces: &[[u8; TraceId::LEN]],
) -> rusqlite::Result<()> {
    use rusqlite::params;
    // Rolls back when dropped before `commit`, so the handle goes back to sqlx outside any
    // transaction whatever fails.
    let tx = rusqlite::Transaction::new_unchecked(db, rusqlite::TransactionBehavior::Immediate)?;
    {
        // The statement's text, built once: the statement cache is keyed by it.
        static INSERT_SPAN: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
            let placeholders = vec!["?"; SPAN_COLUMNS.split(',').count()].join(", ");
            format!(
                "INSERT INTO spans ({SPAN_COLUMNS}) VALUES ({placeholders}) \
                 ON CONFLICT (trace_id, span_id) DO NOTHING"
            )
        });
        let mut insert = tx.prepare_cached(&INSERT_SPAN)?;
        for row in rows {
            insert.execute(params![
                row.trace_id,
                row.span_id,
                row.parent_span_id,
                row.service,
                row.name,
                row.kind,
                row.start_unix_nano,
                row.end_unix_nano,
                row.status_code,
                row.status_message,
                row.budget_ms,
                row.budget_source,
                row.attributes,
                row.resource,
                row.details,
            ])?;
        }
        let mut upsert = tx.prepare_cached(
            "INSERT INTO operations (service, name, kind, last_seen_unix_nano) \
             VALUES (?, ?, ?, ?) \
             ON CONFLICT (service, name, kind) DO UPDATE SET last_seen_unix_nano = \
             max(last_seen_unix_nano, excluded.last_seen_unix_nano)",
        )?;
        for (service, name, kind, last) in operations {
            upsert.execute(params![service, name, kind, last])?;
        }
        // Appended at the right edge of the marks' B-tree (its key starts with the time).
        let received = now_unix_nano() as i64;
        let mut mark = tx.prepare_cached(
            "INSERT INTO trace_marks (received_unix_nano, trace_id) VALUES (?, ?) \
             ON CONFLICT DO NOTHING",
        )?;
        for trace in traces {
            mark.execute(params![received, trace])?;
        }
    }
    tx.commit()
}

/// Runs blocking database work on the calling thread: the ingest writer has a thread of
/// its own (a current-thread runtime); on a multi-threaded runtime (the benchmark's
/// ceiling, tests) the worker first hands its other tasks away.
fn run_blocking<T>(work: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|handle| handle.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(work),
        _ => work(),
    }
}

/// Logs a writer's checkpoint before a WAL reset: (busy, frames in the WAL, frames copied).
fn log_reset(result: Result<(i64, i64, i64), impl std::fmt::Display>) {
    match result {
        Ok((busy, frames, copied)) => {
            tracing::debug!(
                busy,
                frames,
                copied,
                "writer checkpointed to start the WAL over"
            )
        }
        Err(error) => tracing::warn!(%error, "sqlite could not checkpoint its WAL; will try again"),
    }
}

/// A PASSIVE checkpoint, which copies what it can without waiting for anyone: (1 if it
/// could not run because another connection was checkpointing, frames in the WAL, frames
/// copied so far).
async fn passive_checkpoint(
    conn: &mut sqlx::SqliteConnection,
) -> Result<(i64, i64, i64), sqlx::Error> {
    sqlx::query_as("PRAGMA wal_checkpoint(PASSIVE)")
        .fetch_one(conn)
        .await
}

/// What the checkpointer tells the writer, between two of its transactions.
#[derive(Default)]
struct WalSignals {
    /// Set when the WAL has passed `WAL_RESET_FRAMES` and the checkpointer has flushed and
    /// copied what it could; the next write transaction first starts the WAL over.
    reset_due: AtomicBool,
}

/// Copies committed WAL frames into the database file every `CHECKPOINT_PERIOD` with a
/// PASSIVE checkpoint on its own connection, which never waits for the writer or readers,
/// and prepares the writer's WAL resets (`WAL_RESET_FRAMES`). A clean shutdown truncates
/// the WAL.
async fn start_checkpointer(
    options: SqliteConnectOptions,
    signals: Arc<WalSignals>,
) -> Result<tokio_util::sync::DropGuard, StoreError> {
    use sqlx::Connection as _;
    let mut conn = sqlx::SqliteConnection::connect_with(&options).await?;
    let database = options.get_filename().to_owned();
    let stop = tokio_util::sync::CancellationToken::new();
    let stopped = stop.clone();
    tokio::spawn(async move {
        // A checkpoint that fails (a full disk) fails every period: logged when it starts
        // failing and when it recovers, not twice a second.
        let mut failing = false;
        loop {
            tokio::select! {
                _ = stopped.cancelled() => break,
                _ = tokio::time::sleep(CHECKPOINT_PERIOD) => {}
            }
            let checkpoint = passive_checkpoint(&mut conn).await;
            if checkpoint.is_ok() && std::mem::take(&mut failing) {
                tracing::info!("sqlite checkpoints work again");
            }
            match checkpoint {
                Ok((_, frames, mut copied)) if frames > WAL_RESET_FRAMES => {
                    loop {
                        let file = database.clone();
                        let synced = tokio::task::spawn_blocking(move || {
                            std::fs::File::open(file).and_then(|file| file.sync_data())
                        })
                        .await;
                        if let Ok(Err(error)) = synced {
                            tracing::warn!(%error, "could not flush the database file");
                        }
                        // What the writer committed during the flush.
                        match passive_checkpoint(&mut conn).await {
                            Ok((_, frames, now))
                                if now - copied > RESET_LEFT_FRAMES
                                    && frames < ROUNDS_UNTIL_FRAMES =>
                            {
                                copied = now
                            }
                            _ => break,
                        }
                    }
                    signals.reset_due.store(true, Ordering::Release);
                }
                Ok(_) => {}
                Err(error) => {
                    if !std::mem::replace(&mut failing, true) {
                        tracing::warn!(%error, "sqlite checkpoint failed; will keep trying");
                    }
                }
            }
        }
        // Nothing writes any more: copies every frame and leaves the WAL empty, waiting for
        // readers as long as any connection waits (`BUSY_TIMEOUT`).
        if let Err(error) = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
            .execute(&mut conn)
            .await
        {
            tracing::warn!(%error, "sqlite could not truncate its WAL at shutdown");
        }
        let _ = conn.close().await;
    });
    Ok(stop.drop_guard())
}

/// The marks' table and the rollup chunk: three parameters per key, within SQLite's limit.
#[async_trait]
impl Backend for SqliteBackend {
    type Db = Sqlite;
    type Writer<'a> = WriteConnection<'a>;

    const NAME: &'static str = "sqlite";
    const MARKS: &'static str = "trace_marks";
    const ROLLUP_CHUNK: usize = 300;
    const WRITERS_LOCK: &'static str = "";
    const RESTART_WAIT: &'static str = "";
    const SUBSTRING: &'static str = "instr";
    const JOIN_TEXT: &'static str = "group_concat(data, '|')";
    const PARTITIONED: bool = false;
    const TERMS: TermLayout = TermLayout::BySummary;
    const COMPACTION_LOCK: &'static str = "";

    fn rows_affected(result: &sqlx::sqlite::SqliteQueryResult) -> u64 {
        result.rows_affected()
    }

    fn reader(&self) -> &SqlitePool {
        &self.reader
    }

    async fn writer(&self) -> Result<WriteConnection<'_>, StoreError> {
        self.write_connection().await
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
        conn: &mut sqlx::SqliteConnection,
        cutoff: i64,
        limit: u32,
    ) -> Result<u64, StoreError> {
        Ok(sqlx::query(
            // `spans_by_start_bucket` finds every span of the buckets up to the cutoff's;
            // the exact test leaves the later spans of the cutoff's own bucket (~1 s).
            "DELETE FROM spans WHERE rowid IN \
             (SELECT rowid FROM spans WHERE (start_unix_nano >> 30) <= (?1 >> 30) \
              AND start_unix_nano < ?1 LIMIT ?2)",
        )
        .bind(cutoff)
        .bind(i64::from(limit))
        .execute(conn)
        .await?
        .rows_affected())
    }

    async fn disk_usage(&self) -> Result<DiskUsage, StoreError> {
        let (pages, in_use): (i64, i64) = sqlx::query_as(
            "SELECT page_count * page_size, (page_count - freelist_count) * page_size \
             FROM pragma_page_count(), pragma_freelist_count(), pragma_page_size()",
        )
        .fetch_one(&self.reader)
        .await?;
        // On disk: the file and its WAL (pages committed to the WAL count once they are
        // copied into the file, which may be shorter until then).
        let bytes = match &self.file {
            None => pages as u64,
            Some(file) => {
                let size = |path: &std::path::Path| std::fs::metadata(path).map_or(0, |m| m.len());
                let mut wal = file.clone().into_os_string();
                wal.push("-wal");
                size(file) + size(std::path::Path::new(&wal))
            }
        };
        Ok(DiskUsage {
            bytes,
            in_use_bytes: Some(in_use.max(0) as u64),
        })
    }

    async fn analysis_backlog(&self, quiet_before: u64) -> Result<Backlog, StoreError> {
        // A trace's marks: one per commit that held its spans; the last one says when it
        // was last committed, the first since when it waits.
        let (traces, oldest, active): (i64, Option<i64>, Option<i64>) = sqlx::query_as(
            "SELECT count(*), min(last), sum(first < ?1 AND last >= ?1) FROM \
             (SELECT min(received_unix_nano) AS first, max(received_unix_nano) AS last \
              FROM trace_marks GROUP BY trace_id)",
        )
        .bind(i64::try_from(quiet_before).unwrap_or(i64::MAX))
        .fetch_one(&self.reader)
        .await?;
        Ok(Backlog {
            traces: traces.max(0) as u64,
            oldest_commit_unix_nano: oldest.map(|t| t.max(0) as u64),
            active: active.unwrap_or(0).max(0) as u64,
        })
    }

    async fn due_traces(&self, query: &DueQuery) -> Result<Vec<(TraceId, i64)>, StoreError> {
        let before = i64::try_from(query.quiet_before).unwrap_or(i64::MAX);
        let waiting_before = i64::try_from(query.waiting_before).unwrap_or(i64::MAX);
        let limit = query.limit;
        // A trace with a recent mark is not quiet, whatever older marks it also has. SQLite
        // evaluates the subquery once, into a temporary index, and only when a due mark
        // needs it. Read out through sqlx into a set instead (every mark of the last quiet
        // period, row by row, at every poll, even when nothing was due), the recent marks
        // cost a tenth of the server's CPU (`budgetscope-bench ingest --spans 1000000`).
        // A trace still receiving spans is due too once its first mark is older than
        // `waiting_before`: its marks before the quiet cutoff are taken, the later ones stay
        // and bring it back when it goes quiet.
        let mut due = sqlx::query_as::<_, (Vec<u8>, i64)>(
            "SELECT trace_id, received_unix_nano FROM trace_marks \
             WHERE received_unix_nano < ?1 AND (trace_id NOT IN \
             (SELECT trace_id FROM trace_marks WHERE received_unix_nano >= ?1) \
             OR trace_id IN (SELECT trace_id FROM trace_marks WHERE received_unix_nano < ?2)) \
             ORDER BY received_unix_nano",
        )
        .bind(before)
        .bind(waiting_before)
        .fetch(&self.reader);
        // Every due mark of up to `limit` quiet traces, oldest first. A mark past the first
        // `limit` traces stays for a later pass, which at worst analyses its trace again.
        let mut traces: HashSet<Vec<u8>> = HashSet::new();
        let mut marks = Vec::new();
        while let Some((trace, received)) = due.try_next().await? {
            if !traces.contains(&trace) {
                if traces.len() == limit as usize {
                    break;
                }
                traces.insert(trace.clone());
            }
            marks.push((trace, received));
        }
        drop(due);
        decode_marks(marks)
    }

    async fn summaries_written(&self, _count: u64) {}

    fn push_after(q: &mut QueryBuilder<Sqlite>, order: SearchOrder, cursor: Cursor) {
        let start = i64::try_from(cursor.start_unix_nano).unwrap_or(i64::MAX);
        if order == SearchOrder::Terms(TermLayout::BySummary) {
            // Lets the term index start at the cursor's second.
            q.push(" AND t.start_second <= ")
                .push_bind(TermLayout::BySummary.time_of(start));
        }
        let order = order.exact();
        q.push(format!(" AND ({order}.start_unix_nano < "))
            .push_bind(start)
            .push(format!(" OR ({order}.start_unix_nano = "))
            .push_bind(start)
            .push(format!(" AND {order}.trace_id < "))
            .push_bind(cursor.trace_id.0.to_vec())
            .push("))");
    }
}

impl Writer<Sqlite> for WriteConnection<'_> {
    fn done(&mut self) {
        self.keep();
    }
}

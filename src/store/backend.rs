//! What differs between SQLite and Postgres (`Backend`), and `SqlStore`, the one store over
//! either. Every role trait of `mod.rs` is implemented once, for `SqlStore<B>`, each
//! statement written once over the sqlx backend `B::Db` (`spans.rs`, `queue.rs`,
//! `rollup.rs`, `leases.rs`, `alerts.rs`); where the two databases differ, the role asks its
//! backend: the connections, the ingest insert, the analysis queue's table and claims, how
//! retention finds old spans, and a few spellings of search.
//!
//! Architecture invariant: a `Backend` holds no statement both databases could run alike.

use async_trait::async_trait;
use sqlx::{Database, Pool, QueryBuilder};

use super::StoreError;
use super::blocks::{BLOCK_LEVEL, LEVEL};
use super::dictionary::Dictionaries;
use super::partitions::{PartitionPlan, PartitionsKept};
use super::query::{Backlog, Cursor, DiskUsage, DueQuery, TraceSet};
use super::rows::{EncodedBatch, OperationRow};
use super::search::{SearchOrder, TermLayout};
use super::seen::SeenOperations;
use crate::core::model::TraceId;

/// A connection for one write, taken from the backend (`Backend::writer`) and given back
/// when dropped.
pub trait Writer<DB: Database>: std::ops::DerefMut<Target = DB::Connection> + Send {
    /// The write succeeded: the backend may keep the connection for the next one.
    fn done(&mut self);
}

/// One database: its connections, and what only it says that way.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    type Db: Database;
    type Writer<'a>: Writer<Self::Db>
    where
        Self: 'a;

    /// "sqlite" or "postgres".
    const NAME: &'static str;
    /// The table of traces waiting for analysis, keyed by (received_unix_nano, trace_id).
    const MARKS: &'static str;
    /// Rollup keys per statement (`rollup::apply_rollups`).
    const ROLLUP_CHUNK: usize;
    /// Run first in a transaction that writes summaries, so that one writer at a time merges
    /// into the rollups (a row that does not exist yet cannot be locked, and two first
    /// inserts would overwrite each other); empty where the database has one writer.
    const WRITERS_LOCK: &'static str;
    /// Run for traces that were analysed while a mark of theirs is left (the start of the
    /// `IN (…)` list of their ids follows): their wait restarts at their last commit. Empty
    /// where each commit is a mark of its own (SQLite's marks left are newer anyway).
    const RESTART_WAIT: &'static str;
    /// The function that finds a substring: `instr(haystack, needle)` or `strpos`.
    const SUBSTRING: &'static str;
    /// The aggregate that joins a group's texts with `|`: `group_concat` or `string_agg`.
    const JOIN_TEXT: &'static str;
    /// Whether span blocks and search terms are partitioned by (healthy, start) and
    /// so have a `healthy` column (Postgres, `partitions.rs`).
    const PARTITIONED: bool;
    /// How the search terms name their trace.
    const TERMS: TermLayout;
    /// Run first in a transaction that writes blocks, so that one compaction at a time
    /// writes them (a block is no longer unique by trace id in a partitioned table); empty
    /// where the database has one writer.
    const COMPACTION_LOCK: &'static str;

    /// How many rows a statement changed (sqlx has no backend-neutral accessor).
    fn rows_affected(result: &<Self::Db as Database>::QueryResult) -> u64;

    /// The pool that reads.
    fn reader(&self) -> &Pool<Self::Db>;

    /// A connection for one write transaction.
    async fn writer(&self) -> Result<Self::Writer<'_>, StoreError>;

    /// Why the pool gave no connection in time, in words that say what to check.
    async fn no_connection(&self) -> String {
        "no database connection came free in time; the database is slow or busy".into()
    }

    /// Stores a batch of encoded spans, `operations` (those of its operations to upsert)
    /// and its traces' marks in one transaction (the ingest writer's statement, the one
    /// each backend does its own way).
    async fn write_batch(
        &self,
        batch: &EncodedBatch,
        operations: &[OperationRow],
    ) -> Result<(), StoreError>;

    /// Deletes at most `limit` spans that started before `cutoff`, on `conn` inside the
    /// caller's transaction; returns how many.
    async fn delete_spans(
        conn: &mut <Self::Db as Database>::Connection,
        cutoff: i64,
        limit: u32,
    ) -> Result<u64, StoreError>;

    /// `Store::disk_usage`: each database measures its files its own way.
    async fn disk_usage(&self) -> Result<DiskUsage, StoreError>;

    /// `AnalysisQueue::analysis_backlog`: the marks differ.
    async fn analysis_backlog(&self, quiet_before: u64) -> Result<Backlog, StoreError>;

    /// `AnalysisQueue::due_traces`: the marks differ, and Postgres claims what it returns.
    async fn due_traces(&self, query: &DueQuery) -> Result<Vec<(TraceId, i64)>, StoreError>;

    /// Called after `count` summaries were written (Postgres refreshes its planner's
    /// statistics as the summaries grow).
    async fn summaries_written(&self, count: u64);

    /// `Store::keep_partitions`.
    async fn keep_partitions(
        &self,
        _plan: PartitionPlan,
        _now_unix_nano: u64,
    ) -> Result<PartitionsKept, StoreError> {
        Ok(PartitionsKept::default())
    }

    /// The earliest start time a partition of traces of `set` holds: retention's row deletes
    /// stop there, since dropping the partition takes what is past it.
    async fn partitioned_from(&self, _set: TraceSet) -> Result<Option<u64>, StoreError> {
        Ok(None)
    }

    /// Search: the condition "after `cursor`" on the alias `order`, newest first.
    fn push_after(q: &mut QueryBuilder<Self::Db>, order: SearchOrder, cursor: Cursor);
}

/// The store over backend `B`: what `store::open` returns, behind `dyn Store`.
pub struct SqlStore<B> {
    pub(crate) backend: B,
    /// What span blocks, summaries' hop samples and summaries' packed detail are
    /// compressed with (`dictionary.rs`).
    pub(crate) block_dictionaries: Dictionaries,
    pub(crate) hop_dictionaries: Dictionaries,
    pub(crate) summary_dictionaries: Dictionaries,
    /// The operations this server upserted lately (`seen.rs`).
    pub(crate) seen_operations: SeenOperations,
}

impl<B: Backend> SqlStore<B>
where
    for<'c> &'c Pool<B::Db>: sqlx::Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: sqlx::IntoArguments<B::Db>,
    for<'r> (i64, Vec<u8>): sqlx::FromRow<'r, <B::Db as Database>::Row>,
{
    /// The store over a connected, migrated backend, compressing with its newest
    /// dictionaries.
    pub async fn open(backend: B) -> Result<SqlStore<B>, StoreError> {
        let store = SqlStore {
            backend,
            block_dictionaries: Dictionaries::new("blocks", BLOCK_LEVEL),
            hop_dictionaries: Dictionaries::new("hops", LEVEL),
            summary_dictionaries: Dictionaries::new("summaries", LEVEL),
            seen_operations: SeenOperations::default(),
        };
        store.block_dictionaries.load_newest(&store.backend).await?;
        store.hop_dictionaries.load_newest(&store.backend).await?;
        store
            .summary_dictionaries
            .load_newest(&store.backend)
            .await?;
        Ok(store)
    }
}

impl<B: Backend> SqlStore<B> {
    /// Retention's row deletes of traces of `set`: `cutoff`, but not past the earliest
    /// time partition of the set, whose rows go when it is dropped (`partitions.rs`).
    pub(crate) async fn traces_cutoff(
        &self,
        cutoff: u64,
        set: TraceSet,
    ) -> Result<i64, StoreError> {
        let from = self.backend.partitioned_from(set).await?;
        let cutoff = from.map_or(cutoff, |from| cutoff.min(from));
        Ok(i64::try_from(cutoff).unwrap_or(i64::MAX))
    }
}

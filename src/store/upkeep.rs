//! The store's upkeep, `Store` beyond its roles: whether the database answers, retention's
//! deletes, moving analysed traces' rows into blocks, disk use and Postgres's time
//! partitions.

use async_trait::async_trait;
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, QueryBuilder, Type};

use super::backend::{Backend, SqlStore, Writer as _};
use super::blocks::StoredBlock;
use super::compaction::{Compacted, compact, compact_due, compaction_waiting};
use super::query::{DiskUsage, HEALTHY, StoredSummary, TraceSet};
use super::rows::StoredRow;
use super::spans::IDS_PER_STATEMENT;
use super::summaries::{delete_summaries, delete_summaries_before, oldest_summaries, push_list};
use super::{PartitionPlan, PartitionsKept, SpanWriter, Store, StoreError, TraceReader};
use crate::core::model::TraceId;

#[async_trait]
impl<B> Store for SqlStore<B>
where
    B: Backend,
    Self: SpanWriter
        + TraceReader
        + super::AnalysisQueue
        + super::RollupStore
        + super::LeaseStore
        + super::AlertStore,
    for<'c> &'c mut <B::Db as Database>::Connection: Executor<'c, Database = B::Db>,
    for<'c> &'c Pool<B::Db>: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    i64: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    Vec<u8>: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    String: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    for<'r> (i64,): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (Vec<u8>,): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (Vec<u8>, i64): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (String, i64): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> StoredSummary: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> StoredBlock: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> StoredRow: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (i64, Vec<u8>): FromRow<'r, <B::Db as Database>::Row>,
{
    fn backend(&self) -> &'static str {
        B::NAME
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let answer: Result<(i64,), sqlx::Error> =
            QueryBuilder::<B::Db>::new("SELECT CAST(1 AS BIGINT)")
                .build_query_as()
                .fetch_one(self.backend.reader())
                .await;
        match answer {
            Ok(_) => Ok(()),
            // `/readyz` says why, as writes do.
            Err(sqlx::Error::PoolTimedOut) => {
                Err(StoreError::Unavailable(self.backend.no_connection().await))
            }
            Err(error) => Err(error.into()),
        }
    }

    async fn delete_before(&self, cutoff_unix_nano: u64, limit: u32) -> Result<u64, StoreError> {
        let cutoff = i64::try_from(cutoff_unix_nano).unwrap_or(i64::MAX);
        // Traces in a time partition go with it (`partitions.rs`).
        let traces_cutoff = self
            .traces_cutoff(cutoff_unix_nano, TraceSet::Analysed)
            .await?;
        let mut writer = self.backend.writer().await?;
        let mut tx = sqlx::Connection::begin(&mut *writer).await?;
        let mut deleted = B::delete_spans(&mut tx, cutoff, limit).await?;
        let mut blocks = QueryBuilder::<B::Db>::new(
            "DELETE FROM trace_blocks WHERE trace_id IN (SELECT trace_id FROM trace_blocks \
             WHERE start_unix_nano < ",
        );
        blocks
            .push_bind(traces_cutoff)
            .push(" LIMIT ")
            .push_bind(i64::from(limit))
            .push(") RETURNING span_count");
        let counts: Vec<(i64,)> = blocks.build_query_as().fetch_all(&mut *tx).await?;
        deleted += counts
            .iter()
            .map(|(n,)| n.max(&0).unsigned_abs())
            .sum::<u64>();
        delete_summaries_before::<B::Db>(
            &mut tx,
            cutoff,
            traces_cutoff,
            limit,
            &self.summary_dictionaries,
            B::TERMS,
        )
        .await?;
        tx.commit().await?;
        writer.done();
        Ok(deleted)
    }

    async fn delete_traces_before(
        &self,
        cutoff_unix_nano: u64,
        set: TraceSet,
        limit: u32,
    ) -> Result<u64, StoreError> {
        let cutoff = self.traces_cutoff(cutoff_unix_nano, set).await?;
        let limit = i64::from(limit).min(IDS_PER_STATEMENT as i64);
        let which = match set {
            TraceSet::Healthy => HEALTHY,
            TraceSet::Analysed => "TRUE",
        };
        let mut writer = self.backend.writer().await?;
        let mut tx = sqlx::Connection::begin(&mut *writer).await?;
        let ids = oldest_summaries::<B::Db>(&mut tx, which, cutoff, limit).await?;
        if !ids.is_empty() {
            // The summary last: it is what names the trace analysed (and healthy), and what
            // its search terms are found from.
            let mut delete = QueryBuilder::<B::Db>::new("DELETE FROM spans WHERE trace_id IN ");
            push_list(&mut delete, ids.iter().map(|id| id.0.to_vec()));
            delete.build().execute(&mut *tx).await?;
            let mut delete =
                QueryBuilder::<B::Db>::new("DELETE FROM trace_blocks WHERE trace_id IN ");
            push_list(&mut delete, ids.iter().map(|id| id.0.to_vec()));
            delete.build().execute(&mut *tx).await?;
            delete_summaries::<B::Db>(&mut tx, &ids, &self.summary_dictionaries, B::TERMS).await?;
        }
        tx.commit().await?;
        writer.done();
        Ok(ids.len() as u64)
    }

    async fn compact(
        &self,
        traces: &[TraceId],
        max_trace_bytes: u64,
    ) -> Result<Compacted, StoreError> {
        compact(
            &self.backend,
            &self.block_dictionaries,
            traces,
            max_trace_bytes,
        )
        .await
    }

    async fn compact_due(
        &self,
        limit: u32,
        max_trace_bytes: u64,
    ) -> Result<(Compacted, usize), StoreError> {
        compact_due(
            &self.backend,
            &self.block_dictionaries,
            limit,
            max_trace_bytes,
        )
        .await
    }

    async fn compaction_waiting(&self) -> Result<u64, StoreError> {
        compaction_waiting(&self.backend).await
    }

    async fn disk_usage(&self) -> Result<DiskUsage, StoreError> {
        self.backend.disk_usage().await
    }

    async fn keep_partitions(
        &self,
        plan: PartitionPlan,
        now_unix_nano: u64,
    ) -> Result<PartitionsKept, StoreError> {
        self.backend.keep_partitions(plan, now_unix_nano).await
    }
}

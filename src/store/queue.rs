//! The analysis queue for both databases: which traces wait for analysis (the backend's
//! marks), and the summaries analysis writes (`summaries.rs`), fresh or re-analysed.

use async_trait::async_trait;
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, Type};

use super::backend::{Backend, SqlStore, Writer as _};
use super::edges::StoredEdge;
use super::query::{Backlog, Cursor, DueQuery, StaleQuery, StoredSummary};
use super::rollup::StoredRollup;
use super::rows::decode_positions;
use super::summaries::{Replace, ReplacedSummary, stale_count, stale_query, write_summaries};
use super::{AnalysisQueue, StoreError};
use crate::core::analyze::AnalysisVersion;
use crate::core::analyze::hops::{HopSample, Rollup, RollupKey};
use crate::core::analyze::summary::TraceSummary;
use crate::core::model::TraceId;

#[async_trait]
impl<B> AnalysisQueue for SqlStore<B>
where
    B: Backend,
    for<'c> &'c mut <B::Db as Database>::Connection: Executor<'c, Database = B::Db>,
    for<'c> &'c Pool<B::Db>: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    Vec<u8>: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    String: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    i64: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    f64: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    Option<String>: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    Option<f64>: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    bool: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    for<'r> StoredRollup: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> StoredEdge: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> StoredSummary: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (String,): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> ReplacedSummary: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (String, i64): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (Vec<u8>,): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (Vec<u8>, i64): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (i64,): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (i64, Vec<u8>): FromRow<'r, <B::Db as Database>::Row>,
{
    async fn analysis_backlog(&self, quiet_before: u64) -> Result<Backlog, StoreError> {
        self.backend.analysis_backlog(quiet_before).await
    }

    async fn due_traces(&self, query: &DueQuery) -> Result<Vec<(TraceId, i64)>, StoreError> {
        self.backend.due_traces(query).await
    }

    async fn write_summaries(
        &self,
        traces: &[(TraceSummary, Vec<HopSample>)],
        analysed: &[(TraceId, i64)],
    ) -> Result<Vec<(RollupKey, Rollup)>, StoreError> {
        let minutes = self.write(traces, Replace::Marked(analysed)).await?;
        self.backend.summaries_written(traces.len() as u64).await;
        Ok(minutes)
    }

    async fn stale_summaries(&self, query: &StaleQuery) -> Result<Vec<Cursor>, StoreError> {
        let rows: Vec<(Vec<u8>, i64)> = stale_query::<B::Db>(query)
            .build_query_as()
            .fetch_all(self.backend.reader())
            .await?;
        decode_positions(rows)
    }

    async fn stale_summary_count(&self, version: AnalysisVersion) -> Result<u64, StoreError> {
        let (count,): (i64,) = stale_count::<B::Db>(version)
            .build_query_as()
            .fetch_one(self.backend.reader())
            .await?;
        Ok(count.max(0) as u64)
    }

    async fn rewrite_summaries(
        &self,
        traces: &[(TraceSummary, Vec<HopSample>)],
        version: AnalysisVersion,
    ) -> Result<Vec<(RollupKey, Rollup)>, StoreError> {
        self.write(traces, Replace::Stale(version)).await
    }
}

// The bounds name the crate's own row types; the methods are private.
#[allow(private_bounds)]
impl<B> SqlStore<B>
where
    B: Backend,
    for<'c> &'c mut <B::Db as Database>::Connection: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    Vec<u8>: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    String: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    i64: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    f64: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    Option<String>: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    Option<f64>: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    bool: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    for<'r> StoredRollup: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> StoredEdge: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> StoredSummary: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (String,): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> ReplacedSummary: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (String, i64): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (Vec<u8>,): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (i64, Vec<u8>): FromRow<'r, <B::Db as Database>::Row>,
{
    /// One transaction of `summaries::write_summaries` on the backend's writer.
    async fn write(
        &self,
        traces: &[(TraceSummary, Vec<HopSample>)],
        replace: Replace<'_>,
    ) -> Result<Vec<(RollupKey, Rollup)>, StoreError> {
        let mut writer = self.backend.writer().await?;
        let mut tx = sqlx::Connection::begin(&mut *writer).await?;
        let minutes = write_summaries::<B>(
            &mut tx,
            traces,
            replace,
            &self.hop_dictionaries,
            &self.summary_dictionaries,
        )
        .await?;
        tx.commit().await?;
        writer.done();
        drop(writer);
        // The dictionary, once trained, is in the store before the next summary uses it.
        for (dictionaries, what) in [
            (&self.hop_dictionaries, "hop samples"),
            (&self.summary_dictionaries, "summaries"),
        ] {
            if let Err(error) = dictionaries.train_when_ready(&self.backend).await {
                tracing::warn!(%error, "could not train or store a compression dictionary for {what}; they stay plainly compressed until a later try succeeds");
            }
        }
        Ok(minutes)
    }
}

//! What the analyzer writes for a batch of analysed traces, in one transaction, written
//! once for both stores: summaries (each with its trace's hop samples), index terms, the
//! rollup deltas and the cleared marks. Only the marks' table, the rollup chunk and the writers' lock differ.

use std::collections::{BTreeMap, HashSet};

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, QueryBuilder, Type};

use super::StoreError;
use super::query::{SummaryRow, encode_summary, summary_upsert, terms};
use super::rollup::{StoredRollup, add_samples, apply_rollups, decode_hops, hourly};
use crate::core::analyze::hops::RollupKey;
use crate::core::analyze::hops::{HopSample, Rollup};
use crate::core::analyze::summary::TraceSummary;
use crate::core::model::TraceId;

/// Rows or keys per statement: within SQLite's 32,766 and Postgres's 65,535 parameters.
const CHUNK: usize = 500;

/// Where the stores differ.
pub(crate) struct Dialect {
    /// The table of traces waiting for analysis, keyed by (received_unix_nano, trace_id).
    pub marks: &'static str,
    /// Rollup keys per statement (`apply_rollups`).
    pub rollup_chunk: usize,
    /// Run first in the transaction so that one writer at a time merges into the rollups
    /// (a row that does not exist yet cannot be locked, and two first inserts would
    /// overwrite each other); empty where the store has one writer.
    pub writers_lock: &'static str,
}

/// Clears the marks in `analysed` (trace, mark) and writes `traces` (each summary with its
/// hop samples) on `conn`, inside the caller's transaction. Each trace's hops replace
/// what the trace contributed before (a late span). Returns the per-minute rollup deltas.
pub(crate) async fn write_summaries<DB: Database>(
    conn: &mut DB::Connection,
    dialect: &Dialect,
    traces: &[(TraceSummary, Vec<HopSample>)],
    analysed: &[(TraceId, i64)],
) -> Result<Vec<(RollupKey, Rollup)>, StoreError>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'r> StoredRollup: FromRow<'r, DB::Row>,
    for<'r> (String,): FromRow<'r, DB::Row>,
    for<'r> (Vec<u8>,): FromRow<'r, DB::Row>,
    Vec<u8>: for<'t> Encode<'t, DB> + Type<DB>,
    String: for<'t> Encode<'t, DB> + Type<DB>,
    Option<String>: for<'t> Encode<'t, DB> + Type<DB>,
    i64: for<'t> Encode<'t, DB> + Type<DB>,
    f64: for<'t> Encode<'t, DB> + Type<DB>,
    Option<f64>: for<'t> Encode<'t, DB> + Type<DB>,
{
    if !dialect.writers_lock.is_empty() {
        sqlx::query::<DB>(sqlx::AssertSqlSafe(dialect.writers_lock))
            .execute(&mut *conn)
            .await?;
    }
    // Marks are cleared first, and a trace given with marks is written only if this
    // transaction cleared one of them: of two servers that analysed the same trace, the
    // second finds its marks gone and writes nothing, and a trace whose mark a late span
    // replaced waits for its next analysis.
    let mut cleared: HashSet<TraceId> = HashSet::new();
    for chunk in analysed.chunks(CHUNK) {
        // The list of times lets SQLite find the marks by its key's first column; on the
        // pairs alone it scans the whole table.
        let mut clear = QueryBuilder::<DB>::new(format!(
            "DELETE FROM {} WHERE received_unix_nano IN ",
            dialect.marks
        ));
        push_list(&mut clear, chunk.iter().map(|(_, mark)| *mark));
        clear.push(" AND (received_unix_nano, trace_id) IN (");
        clear.push_values(chunk, |mut b, (id, mark)| {
            b.push_bind(*mark).push_bind(id.0.to_vec());
        });
        clear.push(") RETURNING trace_id");
        let ids: Vec<(Vec<u8>,)> = clear.build_query_as().fetch_all(&mut *conn).await?;
        for (id,) in ids {
            cleared.insert(
                TraceId::from_bytes(&id)
                    .map_err(|e| StoreError::Corrupt(format!("trace id: {e}")))?,
            );
        }
    }
    let marked: HashSet<TraceId> = analysed.iter().map(|(id, _)| *id).collect();
    let traces: Vec<&(TraceSummary, Vec<HopSample>)> = traces
        .iter()
        .filter(|(summary, _)| {
            cleared.contains(&summary.trace_id) || !marked.contains(&summary.trace_id)
        })
        .collect();
    let mut cleared: Vec<TraceId> = cleared.into_iter().collect();
    cleared.sort_unstable();
    // What each trace contributed before (a late span) comes back out; its terms go.
    let mut deltas = BTreeMap::new();
    for chunk in cleared.chunks(CHUNK) {
        let ids = || chunk.iter().map(|id| id.0.to_vec());
        let mut old =
            QueryBuilder::<DB>::new("SELECT hops FROM trace_summaries WHERE trace_id IN ");
        push_list(&mut old, ids());
        let old: Vec<(String,)> = old.build_query_as().fetch_all(&mut *conn).await?;
        for (hops,) in old {
            add_samples(&mut deltas, &decode_hops(&hops), -1);
        }
        let mut delete = QueryBuilder::<DB>::new("DELETE FROM trace_terms WHERE trace_id IN ");
        push_list(&mut delete, ids());
        delete.build().execute(&mut *conn).await?;
    }
    let mut rows: Vec<SummaryRow> = traces
        .iter()
        .map(|(summary, hops)| encode_summary(summary, hops))
        .collect();
    // One upsert may not touch a row twice; sorted ids also keep lock order stable.
    rows.sort_by(|a, b| a.trace_id.cmp(&b.trace_id));
    rows.dedup_by(|a, b| a.trace_id == b.trace_id);
    for chunk in rows.chunks(CHUNK) {
        summary_upsert::<DB>(chunk)
            .build()
            .execute(&mut *conn)
            .await?;
    }
    for (_, hops) in &traces {
        add_samples(&mut deltas, hops, 1);
    }
    let new_terms: Vec<(String, i64, Vec<u8>)> = traces
        .iter()
        .flat_map(|(summary, _)| {
            let start = i64::try_from(summary.start_unix_nano).unwrap_or(i64::MAX);
            terms(summary)
                .into_iter()
                .map(move |term| (term, start, summary.trace_id.0.to_vec()))
        })
        .collect();
    for chunk in new_terms.chunks(10 * CHUNK) {
        let mut insert =
            QueryBuilder::<DB>::new("INSERT INTO trace_terms (term, start_unix_nano, trace_id) ");
        insert.push_values(chunk, |mut b, (term, start, id)| {
            b.push_bind(term.clone())
                .push_bind(*start)
                .push_bind(id.clone());
        });
        insert.push(" ON CONFLICT DO NOTHING");
        insert.build().execute(&mut *conn).await?;
    }
    let minutes: Vec<(RollupKey, Rollup)> = deltas.into_iter().collect();
    let chunk = dialect.rollup_chunk;
    apply_rollups::<DB>(conn, "hop_rollups", &minutes, chunk).await?;
    apply_rollups::<DB>(conn, "hop_rollups_hourly", &hourly(&minutes), chunk).await?;
    Ok(minutes)
}

/// Appends `(?, ?, …)`, one parameter per value.
pub(crate) fn push_list<DB: Database, T>(
    q: &mut QueryBuilder<DB>,
    values: impl IntoIterator<Item = T>,
) where
    T: for<'t> Encode<'t, DB> + Type<DB>,
{
    q.push("(");
    let mut list = q.separated(", ");
    for value in values {
        list.push_bind(value);
    }
    list.push_unseparated(")");
}

/// Retention's work after the spans, in the caller's transaction: operations not seen
/// since `cutoff`, the oldest `limit` summaries that started before it with their index
/// terms, and the rollups of minutes before it.
pub(crate) async fn delete_summaries_before<DB: Database>(
    conn: &mut DB::Connection,
    cutoff: i64,
    limit: u32,
) -> Result<(), StoreError>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    i64: for<'t> Encode<'t, DB> + Type<DB>,
{
    let mut operations =
        QueryBuilder::<DB>::new("DELETE FROM operations WHERE last_seen_unix_nano < ");
    operations.push_bind(cutoff);
    operations.build().execute(&mut *conn).await?;
    for table in ["trace_terms", "trace_summaries"] {
        let mut delete = QueryBuilder::<DB>::new(format!(
            "DELETE FROM {table} WHERE trace_id IN \
             (SELECT trace_id FROM trace_summaries WHERE start_unix_nano < "
        ));
        delete.push_bind(cutoff);
        delete.push(" ORDER BY start_unix_nano LIMIT ");
        delete.push_bind(i64::from(limit)).push(")");
        delete.build().execute(&mut *conn).await?;
    }
    for table in ["hop_rollups", "hop_rollups_hourly", "hop_metrics"] {
        let mut delete =
            QueryBuilder::<DB>::new(format!("DELETE FROM {table} WHERE minute_unix_nano < "));
        delete.push_bind(cutoff);
        delete.build().execute(&mut *conn).await?;
    }
    Ok(())
}

//! What the analyzer writes for a batch of analysed traces, in one transaction, written
//! once for both stores: summaries (each with its trace's hop samples), index terms, the
//! rollup deltas and the cleared marks. Only the marks' table, the rollup chunk and the writers' lock differ.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, QueryBuilder, Type};

use super::StoreError;
use super::backend::Backend;
use super::dictionary::Dictionaries;
use super::edges::{self, StoredEdge, apply_edges};
use super::query::StaleQuery;
use super::query::{
    HEALTHY, SUMMARY_COLUMNS, StoredSummary, SummaryRow, encode_summary, is_healthy, summary_upsert,
};
use super::rollup::{StoredRollup, add_samples, apply_rollups, hourly, stored_hops};
use super::search::{TermLayout, terms};
use crate::core::analyze::hops::{HopSample, Rollup};
use crate::core::analyze::hops::{RollupKey, add_edges};
use crate::core::analyze::summary::TraceSummary;
use crate::core::analyze::{AnalysisVersion, Outcome};
use crate::core::model::TraceId;

/// Rows or keys per statement: within SQLite's 32,766 and Postgres's 65,535 parameters.
const CHUNK: usize = 500;

/// Which traces a write may replace.
pub(crate) enum Replace<'a> {
    /// Traces given with marks (trace, mark): written when this write cleared one of their
    /// marks or a mark of theirs is left (a span arrived since; their wait then restarts
    /// at their last commit), not when all are gone (another server wrote them); traces
    /// given without marks are written in any case.
    Marked(&'a [(TraceId, i64)]),
    /// Only traces whose stored summary exists and was analysed with another version than
    /// this one (the re-analysis of stored traces after the rules changed).
    Stale(AnalysisVersion),
}

/// Writes `traces` (each summary with its hop samples) on `conn`, inside the caller's
/// transaction, as `replace` allows. Each trace's hops replace what the trace contributed
/// before (a late span, or a re-analysis). Returns the per-minute rollup deltas.
pub(crate) async fn write_summaries<B: Backend>(
    conn: &mut <B::Db as Database>::Connection,
    traces: &[(TraceSummary, Vec<HopSample>)],
    replace: Replace<'_>,
    hop_dictionaries: &Dictionaries,
    summary_dictionaries: &Dictionaries,
) -> Result<Vec<(RollupKey, Rollup)>, StoreError>
where
    for<'c> &'c mut <B::Db as Database>::Connection: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    for<'r> StoredRollup: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> StoredEdge: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> StoredSummary: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (String,): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> ReplacedSummary: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (String, i64): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (Vec<u8>,): FromRow<'r, <B::Db as Database>::Row>,
    Vec<u8>: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    String: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    Option<String>: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    i64: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    f64: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    Option<f64>: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    bool: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    for<'r> (i64, Vec<u8>): FromRow<'r, <B::Db as Database>::Row>,
{
    if !B::WRITERS_LOCK.is_empty() {
        sqlx::query::<B::Db>(sqlx::AssertSqlSafe(B::WRITERS_LOCK))
            .execute(&mut *conn)
            .await?;
    }
    // The analyzer's traces analysed whole wait for compaction (`compaction::compact_due`);
    // re-analysis reads traces that were.
    let queue_compaction = matches!(replace, Replace::Marked(_));
    // The traces written, and those whose old contribution goes: with marks, every trace
    // whose mark this write cleared (also one whose spans are gone and that gets no summary).
    let (written, mut replaced) = match replace {
        Replace::Marked(analysed) => {
            // Marks are cleared first: of two servers that analysed the same trace, the
            // second finds its marks gone and writes nothing. A trace whose mark a late span
            // replaced is written too (one receiving spans all the time would never be) and
            // is analysed again; its old contribution goes either way.
            let cleared =
                delete_keyed::<B::Db>(conn, B::MARKS, "received_unix_nano", analysed).await?;
            let marked: HashSet<TraceId> = analysed.iter().map(|(id, _)| *id).collect();
            let uncleared: Vec<TraceId> = marked.difference(&cleared).copied().collect();
            let waiting = still_marked::<B::Db>(conn, B::MARKS, &uncleared).await?;
            if !B::RESTART_WAIT.is_empty() {
                for chunk in waiting.iter().copied().collect::<Vec<_>>().chunks(CHUNK) {
                    let mut restart = QueryBuilder::<B::Db>::new(B::RESTART_WAIT);
                    push_list(&mut restart, chunk.iter().map(|id| id.0.to_vec()));
                    restart.build().execute(&mut *conn).await?;
                }
            }
            let written: HashSet<TraceId> = traces
                .iter()
                .map(|(summary, _)| summary.trace_id)
                .filter(|id| cleared.contains(id) || waiting.contains(id) || !marked.contains(id))
                .collect();
            let replaced: Vec<TraceId> = written.union(&cleared).copied().collect();
            (written, replaced)
        }
        Replace::Stale(version) => {
            let ids: Vec<TraceId> = traces.iter().map(|(s, _)| s.trace_id).collect();
            let written = stale_among::<B::Db>(conn, &ids, version).await?;
            let replaced = written.iter().copied().collect();
            (written, replaced)
        }
    };
    let traces: Vec<&(TraceSummary, Vec<HopSample>)> = traces
        .iter()
        .filter(|(summary, _)| written.contains(&summary.trace_id))
        .collect();
    replaced.sort_unstable();
    // What each trace contributed before (a late span, a re-analysis) comes back out; its
    // terms go.
    let mut deltas = BTreeMap::new();
    let mut edges = BTreeMap::new();
    // The traces that had a summary: only they can have a block already.
    let mut summarised = Vec::new();
    for chunk in replaced.chunks(CHUNK) {
        // Each old summary is read once: its samples come back out, its terms go.
        let mut old = QueryBuilder::<B::Db>::new(format!(
            "SELECT {SUMMARY_COLUMNS}, hops, packed_hops FROM trace_summaries WHERE trace_id IN "
        ));
        push_list(&mut old, chunk.iter().map(|id| id.0.to_vec()));
        let old: Vec<ReplacedSummary> = old.build_query_as().fetch_all(&mut *conn).await?;
        let packed = old.iter().filter_map(|o| o.packed_hops.as_deref());
        hop_dictionaries.load_for(&mut *conn, packed).await?;
        let packed = old
            .iter()
            .filter_map(|o| o.summary.packed_detail.as_deref());
        summary_dictionaries.load_for(&mut *conn, packed).await?;
        let mut gone = Vec::with_capacity(old.len());
        for o in old {
            summarised.push(o.summary.trace_id.clone());
            let hops = stored_hops(&o.hops, o.packed_hops.as_deref(), hop_dictionaries);
            add_samples(&mut deltas, &hops, -1);
            add_edges(&mut edges, &hops, -1);
            gone.extend(o.summary.decode(summary_dictionaries).ok());
        }
        delete_terms_of::<B::Db>(conn, &gone, B::TERMS).await?;
    }
    let mut rows: Vec<SummaryRow> = traces
        .iter()
        .map(|(summary, hops)| {
            encode_summary(summary, hops, hop_dictionaries, summary_dictionaries)
        })
        .collect::<Result<_, _>>()?;
    // One upsert may not touch a row twice; sorted ids also keep lock order stable.
    rows.sort_by(|a, b| a.trace_id.cmp(&b.trace_id));
    rows.dedup_by(|a, b| a.trace_id == b.trace_id);
    for chunk in rows.chunks(CHUNK) {
        summary_upsert::<B::Db>(chunk)
            .build()
            .execute(&mut *conn)
            .await?;
    }
    if B::PARTITIONED {
        // A block follows its trace into the time partition of its class (a late span or a
        // re-analysis may change it; `partitions.rs`).
        for chunk in summarised.chunks(CHUNK) {
            let mut moved = QueryBuilder::<B::Db>::new(format!(
                "UPDATE trace_blocks b SET healthy = ({HEALTHY}) FROM trace_summaries s \
                 WHERE s.trace_id = b.trace_id AND b.healthy <> ({HEALTHY}) AND b.trace_id IN "
            ));
            push_list(&mut moved, chunk.iter().cloned());
            moved.build().execute(&mut *conn).await?;
        }
    }
    for (_, hops) in &traces {
        add_samples(&mut deltas, hops, 1);
        add_edges(&mut edges, hops, 1);
    }
    if queue_compaction {
        let now = i64::try_from(crate::clock::now_unix_nano()).unwrap_or(i64::MAX);
        let due: Vec<Vec<u8>> = traces
            .iter()
            .filter(|(summary, _)| summary.outcome != Outcome::TooLarge)
            .map(|(summary, _)| summary.trace_id.0.to_vec())
            .collect();
        for chunk in due.chunks(CHUNK) {
            let mut insert = QueryBuilder::<B::Db>::new(
                "INSERT INTO compaction_due (queued_unix_nano, trace_id) ",
            );
            insert.push_values(chunk, |mut b, id| {
                b.push_bind(now).push_bind(id.clone());
            });
            insert.push(" ON CONFLICT DO NOTHING");
            insert.build().execute(&mut *conn).await?;
        }
    }
    let new_terms: Vec<(String, i64, Vec<u8>, bool)> = traces
        .iter()
        .flat_map(|(summary, _)| {
            let start = i64::try_from(summary.start_unix_nano).unwrap_or(i64::MAX);
            let healthy = is_healthy(summary);
            terms(summary)
                .into_iter()
                .map(move |term| (term, start, summary.trace_id.0.to_vec(), healthy))
        })
        .collect();
    let ids = term_ids::<B::Db>(conn, new_terms.iter().map(|(t, _, _, _)| t), true).await?;
    let healthy_column = if B::PARTITIONED { ", healthy" } else { "" };
    let (head, tail) = B::TERMS.rows_of_values();
    for chunk in new_terms.chunks(8 * CHUNK) {
        let mut insert = QueryBuilder::<B::Db>::new(format!(
            "INSERT INTO trace_terms ({}{healthy_column}) {head}",
            B::TERMS.columns()
        ));
        insert.push_values(chunk, |mut b, (term, start, id, healthy)| {
            b.push_bind(ids.get(term).copied().unwrap_or(0))
                .push_bind(B::TERMS.time_of(*start))
                .push_bind(id.clone());
            if B::PARTITIONED {
                b.push_bind(*healthy);
            }
        });
        insert.push(tail).push(" ON CONFLICT DO NOTHING");
        insert.build().execute(&mut *conn).await?;
    }
    let minutes: Vec<(RollupKey, Rollup)> = deltas.into_iter().collect();
    apply_rollups::<B::Db>(conn, "hop_rollups", &minutes, B::ROLLUP_CHUNK).await?;
    apply_rollups::<B::Db>(
        conn,
        "hop_rollups_hourly",
        &hourly(&minutes),
        B::ROLLUP_CHUNK,
    )
    .await?;
    apply_edges::<B::Db>(conn, "edge_rollups", &edges, B::ROLLUP_CHUNK).await?;
    apply_edges::<B::Db>(
        conn,
        "edge_rollups_hourly",
        &edges::hourly(&edges),
        B::ROLLUP_CHUNK,
    )
    .await?;
    Ok(minutes)
}

/// Deletes the rows of `table` keyed (`time`, trace_id) in `keys` (trace, time) that are
/// still there (the analyzer's marks, traces waiting for compaction); returns the traces
/// whose rows it deleted.
pub(crate) async fn delete_keyed<DB: Database>(
    conn: &mut DB::Connection,
    table: &str,
    time: &str,
    keys: &[(TraceId, i64)],
) -> Result<HashSet<TraceId>, StoreError>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'r> (Vec<u8>,): FromRow<'r, DB::Row>,
    Vec<u8>: for<'t> Encode<'t, DB> + Type<DB>,
    i64: for<'t> Encode<'t, DB> + Type<DB>,
{
    let mut cleared = HashSet::new();
    for chunk in keys.chunks(CHUNK) {
        // The list of times lets SQLite find the rows by its key's first column; on the
        // pairs alone it scans the whole table.
        let mut clear = QueryBuilder::<DB>::new(format!("DELETE FROM {table} WHERE {time} IN "));
        push_list(&mut clear, chunk.iter().map(|(_, mark)| *mark));
        clear.push(format!(" AND ({time}, trace_id) IN ("));
        clear.push_values(chunk, |mut b, (id, mark)| {
            b.push_bind(*mark).push_bind(id.0.to_vec());
        });
        clear.push(") RETURNING trace_id");
        let ids: Vec<(Vec<u8>,)> = clear.build_query_as().fetch_all(&mut *conn).await?;
        collect_ids(ids, &mut cleared)?;
    }
    Ok(cleared)
}

/// Those of `ids` that still have a mark in `marks`.
async fn still_marked<DB: Database>(
    conn: &mut DB::Connection,
    marks: &str,
    ids: &[TraceId],
) -> Result<HashSet<TraceId>, StoreError>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'r> (Vec<u8>,): FromRow<'r, DB::Row>,
    Vec<u8>: for<'t> Encode<'t, DB> + Type<DB>,
{
    let mut found = HashSet::new();
    for chunk in ids.chunks(CHUNK) {
        let mut q = QueryBuilder::<DB>::new(format!(
            "SELECT DISTINCT trace_id FROM {marks} WHERE trace_id IN "
        ));
        push_list(&mut q, chunk.iter().map(|id| id.0.to_vec()));
        let rows: Vec<(Vec<u8>,)> = q.build_query_as().fetch_all(&mut *conn).await?;
        collect_ids(rows, &mut found)?;
    }
    Ok(found)
}

/// Adds the trace ids read to `into`.
fn collect_ids(rows: Vec<(Vec<u8>,)>, into: &mut HashSet<TraceId>) -> Result<(), StoreError> {
    for (id,) in rows {
        into.insert(
            TraceId::from_bytes(&id).map_err(|e| StoreError::Corrupt(format!("trace id: {e}")))?,
        );
    }
    Ok(())
}

/// `WHERE` condition of summaries analysed otherwise than `version`, with its parameters.
fn push_stale<DB: Database>(q: &mut QueryBuilder<DB>, version: AnalysisVersion)
where
    i64: for<'t> Encode<'t, DB> + Type<DB>,
    f64: for<'t> Encode<'t, DB> + Type<DB>,
{
    q.push("(rules_version <> ")
        .push_bind(i64::from(version.rules))
        .push(" OR tolerance_ms <> ")
        .push_bind(version.tolerance_ms)
        .push(")");
}

/// Those of `ids` whose stored summary was analysed otherwise than `version`.
async fn stale_among<DB: Database>(
    conn: &mut DB::Connection,
    ids: &[TraceId],
    version: AnalysisVersion,
) -> Result<HashSet<TraceId>, StoreError>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'r> (Vec<u8>,): FromRow<'r, DB::Row>,
    Vec<u8>: for<'t> Encode<'t, DB> + Type<DB>,
    i64: for<'t> Encode<'t, DB> + Type<DB>,
    f64: for<'t> Encode<'t, DB> + Type<DB>,
{
    let mut stale = HashSet::new();
    for chunk in ids.chunks(CHUNK) {
        let mut q =
            QueryBuilder::<DB>::new("SELECT trace_id FROM trace_summaries WHERE trace_id IN ");
        push_list(&mut q, chunk.iter().map(|id| id.0.to_vec()));
        q.push(" AND ");
        push_stale(&mut q, version);
        let rows: Vec<(Vec<u8>,)> = q.build_query_as().fetch_all(&mut *conn).await?;
        for (id,) in rows {
            stale.insert(
                TraceId::from_bytes(&id)
                    .map_err(|e| StoreError::Corrupt(format!("trace id: {e}")))?,
            );
        }
    }
    Ok(stale)
}

/// Summaries analysed otherwise than `query.version`, newest first, after `query.after`
/// (keyset on start and trace id, as search pages).
pub(crate) fn stale_query<DB: Database>(query: &StaleQuery) -> QueryBuilder<DB>
where
    Vec<u8>: for<'t> Encode<'t, DB> + Type<DB>,
    i64: for<'t> Encode<'t, DB> + Type<DB>,
    f64: for<'t> Encode<'t, DB> + Type<DB>,
{
    let mut q =
        QueryBuilder::<DB>::new("SELECT trace_id, start_unix_nano FROM trace_summaries WHERE ");
    push_stale(&mut q, query.version);
    if let Some(after) = query.after {
        let start = i64::try_from(after.start_unix_nano).unwrap_or(i64::MAX);
        q.push(" AND (start_unix_nano < ")
            .push_bind(start)
            .push(" OR (start_unix_nano = ")
            .push_bind(start)
            .push(" AND trace_id < ")
            .push_bind(after.trace_id.0.to_vec())
            .push("))");
    }
    q.push(" ORDER BY start_unix_nano DESC, trace_id DESC LIMIT ")
        .push_bind(i64::from(query.limit));
    q
}

/// How many summaries were analysed otherwise than `version`.
pub(crate) fn stale_count<DB: Database>(version: AnalysisVersion) -> QueryBuilder<DB>
where
    i64: for<'t> Encode<'t, DB> + Type<DB>,
    f64: for<'t> Encode<'t, DB> + Type<DB>,
{
    let mut q = QueryBuilder::<DB>::new("SELECT count(*) FROM trace_summaries WHERE ");
    push_stale(&mut q, version);
    q
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
/// since `cutoff`, the oldest `limit` summaries that started before `traces_cutoff` (at
/// most `cutoff`) with their index terms, and the rollups of minutes before `cutoff`.
pub(crate) async fn delete_summaries_before<DB: Database>(
    conn: &mut DB::Connection,
    cutoff: i64,
    traces_cutoff: i64,
    limit: u32,
    dictionaries: &Dictionaries,
    layout: TermLayout,
) -> Result<(), StoreError>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    i64: for<'t> Encode<'t, DB> + Type<DB>,
    String: for<'t> Encode<'t, DB> + Type<DB>,
    Vec<u8>: for<'t> Encode<'t, DB> + Type<DB>,
    for<'r> (Vec<u8>,): FromRow<'r, DB::Row>,
    for<'r> StoredSummary: FromRow<'r, DB::Row>,
    for<'r> (String, i64): FromRow<'r, DB::Row>,
    for<'r> (i64, Vec<u8>): FromRow<'r, DB::Row>,
{
    let mut operations =
        QueryBuilder::<DB>::new("DELETE FROM operations WHERE last_seen_unix_nano < ");
    operations.push_bind(cutoff);
    operations.build().execute(&mut *conn).await?;
    let ids = oldest_summaries::<DB>(conn, "TRUE", traces_cutoff, i64::from(limit)).await?;
    delete_summaries::<DB>(conn, &ids, dictionaries, layout).await?;
    for table in [
        "hop_rollups",
        "hop_rollups_hourly",
        "edge_rollups",
        "edge_rollups_hourly",
        "hop_metrics",
    ] {
        let mut delete =
            QueryBuilder::<DB>::new(format!("DELETE FROM {table} WHERE minute_unix_nano < "));
        delete.push_bind(cutoff);
        delete.build().execute(&mut *conn).await?;
    }
    Ok(())
}

/// The traces of the oldest `limit` summaries that started before `cutoff` and meet
/// `condition` (SQL on the summaries' columns), oldest first.
pub(crate) async fn oldest_summaries<DB: Database>(
    conn: &mut DB::Connection,
    condition: &str,
    cutoff: i64,
    limit: i64,
) -> Result<Vec<TraceId>, StoreError>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    i64: for<'t> Encode<'t, DB> + Type<DB>,
    for<'r> (Vec<u8>,): FromRow<'r, DB::Row>,
{
    let mut find = QueryBuilder::<DB>::new(format!(
        "SELECT trace_id FROM trace_summaries WHERE {condition} AND start_unix_nano < "
    ));
    find.push_bind(cutoff)
        .push(" ORDER BY start_unix_nano LIMIT ")
        .push_bind(limit);
    let rows: Vec<(Vec<u8>,)> = find.build_query_as().fetch_all(&mut *conn).await?;
    rows.iter()
        .map(|(id,)| TraceId::from_bytes(id))
        .collect::<Result<_, _>>()
        .map_err(|e| StoreError::Corrupt(format!("trace id: {e}")))
}

/// A summary about to be replaced, with the hop samples it contributed.
#[derive(sqlx::FromRow)]
pub(crate) struct ReplacedSummary {
    #[sqlx(flatten)]
    summary: StoredSummary,
    hops: String,
    packed_hops: Option<Vec<u8>>,
}

/// Deletes the summaries of the traces `ids` with their search terms (found from each
/// summary, so first).
pub(crate) async fn delete_summaries<DB: Database>(
    conn: &mut DB::Connection,
    ids: &[TraceId],
    dictionaries: &Dictionaries,
    layout: TermLayout,
) -> Result<(), StoreError>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    i64: for<'t> Encode<'t, DB> + Type<DB>,
    String: for<'t> Encode<'t, DB> + Type<DB>,
    Vec<u8>: for<'t> Encode<'t, DB> + Type<DB>,
    for<'r> StoredSummary: FromRow<'r, DB::Row>,
    for<'r> (String, i64): FromRow<'r, DB::Row>,
    for<'r> (i64, Vec<u8>): FromRow<'r, DB::Row>,
{
    for chunk in ids.chunks(CHUNK) {
        delete_terms::<DB>(conn, chunk, dictionaries, layout).await?;
        let mut delete = QueryBuilder::<DB>::new("DELETE FROM trace_summaries WHERE trace_id IN ");
        push_list(&mut delete, chunk.iter().map(|id| id.0.to_vec()));
        delete.build().execute(&mut *conn).await?;
    }
    Ok(())
}

/// Deletes the search terms of the traces `ids` (at most `CHUNK`) that have a summary. The
/// terms are found from each stored summary (`terms`) and deleted by their key, so the
/// table needs no index by trace. A summary that does not decode keeps its terms, which
/// then match no summary and are never listed.
pub(crate) async fn delete_terms<DB: Database>(
    conn: &mut DB::Connection,
    ids: &[TraceId],
    dictionaries: &Dictionaries,
    layout: TermLayout,
) -> Result<(), StoreError>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    i64: for<'t> Encode<'t, DB> + Type<DB>,
    String: for<'t> Encode<'t, DB> + Type<DB>,
    Vec<u8>: for<'t> Encode<'t, DB> + Type<DB>,
    for<'r> StoredSummary: FromRow<'r, DB::Row>,
    for<'r> (String, i64): FromRow<'r, DB::Row>,
    for<'r> (i64, Vec<u8>): FromRow<'r, DB::Row>,
{
    if ids.is_empty() {
        return Ok(());
    }
    let mut q = QueryBuilder::<DB>::new(format!(
        "SELECT {SUMMARY_COLUMNS} FROM trace_summaries WHERE trace_id IN "
    ));
    push_list(&mut q, ids.iter().map(|id| id.0.to_vec()));
    let rows: Vec<StoredSummary> = q.build_query_as().fetch_all(&mut *conn).await?;
    let packed = rows.iter().filter_map(|row| row.packed_detail.as_deref());
    dictionaries.load_for(&mut *conn, packed).await?;
    let summaries: Vec<TraceSummary> = rows
        .into_iter()
        .filter_map(|row| row.decode(dictionaries).ok())
        .collect();
    delete_terms_of::<DB>(conn, &summaries, layout).await
}

/// Deletes the search terms of `summaries` (as stored) by their key.
async fn delete_terms_of<DB: Database>(
    conn: &mut DB::Connection,
    summaries: &[TraceSummary],
    layout: TermLayout,
) -> Result<(), StoreError>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    i64: for<'t> Encode<'t, DB> + Type<DB>,
    String: for<'t> Encode<'t, DB> + Type<DB>,
    Vec<u8>: for<'t> Encode<'t, DB> + Type<DB>,
    for<'r> (String, i64): FromRow<'r, DB::Row>,
{
    let keys: Vec<(String, i64, Vec<u8>)> = summaries
        .iter()
        .flat_map(|summary| {
            let start = i64::try_from(summary.start_unix_nano).unwrap_or(i64::MAX);
            let id = summary.trace_id.0.to_vec();
            terms(summary)
                .into_iter()
                .map(move |term| (term, start, id.clone()))
        })
        .collect();
    // A term never stored has no rows to delete.
    let ids = term_ids::<DB>(conn, keys.iter().map(|(t, _, _)| t), false).await?;
    let keys: Vec<(i64, i64, Vec<u8>)> = keys
        .into_iter()
        .filter_map(|(term, start, id)| Some((*ids.get(&term)?, layout.time_of(start), id)))
        .collect();
    let (head, tail) = layout.rows_of_values();
    for chunk in keys.chunks(2 * CHUNK) {
        // The list of term ids lets the database find the rows by its key's first column;
        // on the triples alone SQLite scans the whole table. The list of start times lets
        // Postgres read only the time partitions that hold them.
        let distinct: BTreeSet<i64> = chunk.iter().map(|(t, _, _)| *t).collect();
        let times: BTreeSet<i64> = chunk.iter().map(|(_, time, _)| *time).collect();
        let mut delete = QueryBuilder::<DB>::new("DELETE FROM trace_terms WHERE term_id IN ");
        push_list(&mut delete, distinct);
        delete.push(format!(" AND {} IN ", layout.time_column()));
        push_list(&mut delete, times);
        delete.push(format!(" AND ({}) IN ({head}", layout.columns()));
        delete.push_values(chunk, |mut b, (term, time, id)| {
            b.push_bind(*term).push_bind(*time).push_bind(id.clone());
        });
        delete.push(format!("{tail})"));
        delete.build().execute(&mut *conn).await?;
    }
    Ok(())
}

/// The ids of `terms` in `search_terms` (each term's text is stored once; `trace_terms`
/// refers to it), with those not there yet added when `add`. Only the missing ones are
/// inserted: on Postgres each insert that conflicts would use up an identity value.
async fn term_ids<'a, DB: Database>(
    conn: &mut DB::Connection,
    terms: impl Iterator<Item = &'a String>,
    add: bool,
) -> Result<HashMap<String, i64>, StoreError>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    String: for<'t> Encode<'t, DB> + Type<DB>,
    for<'r> (String, i64): FromRow<'r, DB::Row>,
{
    let terms: BTreeSet<&String> = terms.collect();
    let terms: Vec<&String> = terms.into_iter().collect();
    let mut ids = HashMap::new();
    for chunk in terms.chunks(CHUNK) {
        let find = |chunk: &[&String]| {
            let mut q = QueryBuilder::<DB>::new("SELECT term, id FROM search_terms WHERE term IN ");
            push_list(&mut q, chunk.iter().map(|t| t.to_string()));
            q
        };
        let found: Vec<(String, i64)> = find(chunk).build_query_as().fetch_all(&mut *conn).await?;
        ids.extend(found);
        let missing: Vec<&String> = chunk
            .iter()
            .filter(|t| !ids.contains_key(t.as_str()))
            .copied()
            .collect();
        if !add || missing.is_empty() {
            continue;
        }
        let mut insert = QueryBuilder::<DB>::new("INSERT INTO search_terms (term) ");
        insert.push_values(&missing, |mut b, term| {
            b.push_bind(term.to_string());
        });
        insert.push(" ON CONFLICT (term) DO NOTHING");
        insert.build().execute(&mut *conn).await?;
        let found: Vec<(String, i64)> = find(&missing)
            .build_query_as()
            .fetch_all(&mut *conn)
            .await?;
        ids.extend(found);
    }
    Ok(ids)
}

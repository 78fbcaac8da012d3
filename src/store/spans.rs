//! Spans: their encoding into rows and back, and the span roles for both databases
//! (`SpanWriter`, `TraceReader`, and `Store` itself: ping and retention), each statement
//! written once over the sqlx backend.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use async_trait::async_trait;
use futures_util::TryStreamExt as _;
use serde_json::Value;
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, QueryBuilder, Type};

use super::backend::{Backend, SqlStore, Writer as _};
use super::blocks::{Compacted, StoredBlock, compact, merge, read_blocks};
use super::query::{
    AttrFilter, Cursor, DiskUsage, OUTLINE_NAMES, SpanListCounts, SpanListQuery, SpanPosition,
    StoredSummary, TraceOutline, TraceQuery, TraceSet, TraceSize, TracesWithin, finish_search,
    start_search,
};
use super::rollup::stored_hops;
use super::summaries::{delete_summaries, delete_summaries_before, oldest_summaries, push_list};
use super::{Operation, SpanWriter, Store, StoreError, TraceReader};
use crate::core::analyze::Role;
use crate::core::analyze::hops::HopSample;
use crate::core::analyze::summary::TraceSummary;
use crate::core::attr_json;
use crate::core::model::{Budget, Span, SpanId, SpanKind, Status, StatusCode, TraceId};

/// Trace ids per statement: within both databases' parameter limits.
const IDS_PER_STATEMENT: usize = 500;

#[async_trait]
impl<B: Backend> SpanWriter for SqlStore<B> {
    async fn write_batch(&self, batch: &EncodedBatch) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        self.backend.write_batch(batch).await
    }
}

#[async_trait]
impl<B> TraceReader for SqlStore<B>
where
    B: Backend,
    for<'c> &'c Pool<B::Db>: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    Vec<u8>: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    String: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    i64: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    f64: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    for<'r> StoredRow: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> StoredSummary: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (Vec<u8>, i64): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (String,): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (String, i16): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (i64, i64): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (i64, i64, i64, Option<i64>): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (i64, Option<i64>, Option<i64>): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (String, String, Option<f64>): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (String, String): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (i64,): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (Vec<u8>, String): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (Vec<u8>, Vec<u8>, String): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (Vec<u8>, String, Option<Vec<u8>>): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> StoredBlock: FromRow<'r, <B::Db as Database>::Row>,
{
    async fn trace(&self, trace_id: TraceId) -> Result<Vec<Span>, StoreError> {
        let mut spans = decode_rows(rows_of(&self.backend, &[trace_id]).await?)?;
        spans.sort_by_key(|s| (s.start_unix_nano, s.span_id));
        Ok(spans)
    }

    async fn traces(&self, trace_ids: &[TraceId]) -> Result<Vec<Span>, StoreError> {
        let mut spans = Vec::new();
        for chunk in trace_ids.chunks(IDS_PER_STATEMENT) {
            spans.extend(decode_rows(rows_of(&self.backend, chunk).await?)?);
        }
        Ok(spans)
    }

    async fn traces_within(
        &self,
        trace_ids: &[TraceId],
        max_bytes: u64,
        max_trace_bytes: u64,
    ) -> Result<TracesWithin, StoreError> {
        let mut ids = trace_ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        let mut within = Within::new(max_bytes, max_trace_bytes);
        'chunks: for chunk in ids.chunks(IDS_PER_STATEMENT) {
            // Each trace's block rows go first, then its rows the block does not hold, in
            // trace-id order, as `Within` takes them.
            let blocks = read_blocks(&self.backend, chunk).await?;
            let mut pending: Vec<&StoredBlock> = blocks.values().collect();
            pending.sort_unstable_by(|a, b| b.trace_id.cmp(&a.trace_id));
            let mut in_block: (Vec<u8>, HashSet<Vec<u8>>) = Default::default();
            let mut q = spans_of::<B::Db>(chunk, " ORDER BY trace_id");
            let mut rows = q.build_query_as::<StoredRow>().fetch(self.backend.reader());
            while let Some(row) = rows.try_next().await? {
                while pending.last().is_some_and(|b| b.trace_id <= row.trace_id) {
                    let block = pending.pop().expect("checked");
                    in_block = (block.trace_id.clone(), HashSet::new());
                    for held in block.rows()? {
                        in_block.1.insert(held.span_id.clone());
                        if !within.push(held)? {
                            break 'chunks;
                        }
                    }
                }
                if in_block.0 == row.trace_id && in_block.1.contains(&row.span_id) {
                    continue;
                }
                if !within.push(row)? {
                    break 'chunks;
                }
            }
            while let Some(block) = pending.pop() {
                for held in block.rows()? {
                    if !within.push(held)? {
                        break 'chunks;
                    }
                }
            }
        }
        Ok(within.finish())
    }

    async fn trace_outline(&self, trace_id: TraceId) -> Result<Option<TraceOutline>, StoreError> {
        // A trace without a block (a large one, most often) is outlined by the database;
        // with one, in Rust over the block and its rows (the conformance suite holds the
        // two to the same answers).
        if has_block(&self.backend, trace_id).await? {
            let mut outline = OutlineScan::default();
            scan_trace(&self.backend, trace_id, |row| outline.add(row)).await?;
            return Ok(outline.finish(trace_id));
        }
        let id = || trace_id.0.to_vec();
        let mut q = QueryBuilder::<B::Db>::new(
            "SELECT count(*), min(start_unix_nano), max(end_unix_nano) FROM spans WHERE trace_id = ",
        );
        q.push_bind(id());
        let (spans, start, end): (i64, Option<i64>, Option<i64>) =
            q.build_query_as().fetch_one(self.backend.reader()).await?;
        let (Some(start), Some(end)) = (start, end) else {
            return Ok(None);
        };
        let mut q = QueryBuilder::<B::Db>::new(
            "SELECT service, name, budget_ms FROM spans WHERE trace_id = ",
        );
        q.push_bind(id()).push(
            " ORDER BY CASE WHEN parent_span_id IS NULL THEN 0 ELSE 1 END, start_unix_nano, \
             span_id LIMIT 1",
        );
        let (root_service, root_name, root_budget_ms): (String, String, Option<f64>) =
            q.build_query_as().fetch_one(self.backend.reader()).await?;
        let mut q =
            QueryBuilder::<B::Db>::new("SELECT DISTINCT service FROM spans WHERE trace_id = ");
        q.push_bind(id())
            .push(" ORDER BY service LIMIT ")
            .push_bind(i64::from(OUTLINE_NAMES));
        let services: Vec<(String,)> = q.build_query_as().fetch_all(self.backend.reader()).await?;
        let mut q = QueryBuilder::<B::Db>::new(
            "SELECT DISTINCT service, name FROM spans WHERE trace_id = ",
        );
        q.push_bind(id()).push(" AND kind IN ");
        push_list(
            &mut q,
            Role::HOP_KINDS.iter().map(|k| i64::from(k.as_i32())),
        );
        q.push(" ORDER BY service, name LIMIT ")
            .push_bind(i64::from(OUTLINE_NAMES));
        let operations: Vec<(String, String)> =
            q.build_query_as().fetch_all(self.backend.reader()).await?;
        Ok(Some(TraceOutline {
            trace_id,
            span_count: spans.max(0) as u64,
            start_unix_nano: start.max(0) as u64,
            end_unix_nano: end.max(start).max(0) as u64,
            root_service,
            root_name,
            root_budget_ms,
            services: services.into_iter().map(|(s,)| s).collect(),
            operations,
        }))
    }

    async fn trace_size(&self, trace_ids: &[TraceId]) -> Result<TraceSize, StoreError> {
        let mut size = TraceSize::default();
        for chunk in trace_ids.chunks(IDS_PER_STATEMENT) {
            // `StoredRow::text_bytes`, summed by the database; blocks keep their rows' sum.
            let mut q = QueryBuilder::<B::Db>::new(
                "SELECT count(*), coalesce(sum(octet_length(trace_id) + octet_length(span_id) \
                 + 8 + octet_length(service) + octet_length(name) \
                 + octet_length(status_message) + coalesce(octet_length(budget_source), 0) \
                 + octet_length(attributes) + octet_length(resource) + octet_length(details)), 0) \
                 FROM spans WHERE trace_id IN ",
            );
            push_list(&mut q, chunk.iter().map(|id| id.0.to_vec()));
            let (spans, bytes): (i64, i64) =
                q.build_query_as().fetch_one(self.backend.reader()).await?;
            let mut q = QueryBuilder::<B::Db>::new(
                "SELECT CAST(coalesce(sum(span_count), 0) AS BIGINT), \
                 CAST(coalesce(sum(text_bytes), 0) AS BIGINT) FROM trace_blocks WHERE trace_id IN ",
            );
            push_list(&mut q, chunk.iter().map(|id| id.0.to_vec()));
            let (block_spans, block_bytes): (i64, i64) =
                q.build_query_as().fetch_one(self.backend.reader()).await?;
            size.spans += (spans.max(0) + block_spans.max(0)) as u64;
            size.bytes += (bytes.max(0) + block_bytes.max(0)) as u64;
        }
        Ok(size)
    }

    async fn trace_page(
        &self,
        trace_id: TraceId,
        after: Option<SpanId>,
        limit: u32,
    ) -> Result<Vec<Span>, StoreError> {
        let mut q = spans_of::<B::Db>(&[trace_id], "");
        if let Some(after) = after {
            q.push(" AND span_id > ").push_bind(after.0.to_vec());
        }
        q.push(" ORDER BY span_id LIMIT ")
            .push_bind(i64::from(limit));
        let rows: Vec<StoredRow> = q.build_query_as().fetch_all(self.backend.reader()).await?;
        // The first `limit` after `after` of the block's rows and of those rows together
        // (the block's copy of a span id wins).
        let mut page: std::collections::BTreeMap<Vec<u8>, StoredRow> =
            rows.into_iter().map(|r| (r.span_id.clone(), r)).collect();
        if let Some(block) = read_blocks(&self.backend, &[trace_id])
            .await?
            .into_values()
            .next()
        {
            let after = after.map(|id| id.0.to_vec());
            for row in block.rows()? {
                if after.as_ref().is_none_or(|after| row.span_id > *after) {
                    page.insert(row.span_id.clone(), row);
                }
            }
        }
        decode_rows(page.into_values().take(limit as usize).collect())
    }

    async fn trace_span_list(
        &self,
        trace_id: TraceId,
        query: &SpanListQuery<'_>,
    ) -> Result<Vec<Span>, StoreError> {
        if !has_block(&self.backend, trace_id).await? {
            let mut q = spans_of::<B::Db>(&[trace_id], "");
            push_find::<B>(&mut q, query.find);
            let order = match query.backwards {
                false => {
                    if let Some(from) = query.from {
                        q.push(" AND NOT");
                        push_before(&mut q, from);
                    }
                    " ORDER BY start_unix_nano, span_id LIMIT "
                }
                true => {
                    if let Some(from) = query.from {
                        q.push(" AND");
                        push_before(&mut q, from);
                    }
                    " ORDER BY start_unix_nano DESC, span_id DESC LIMIT "
                }
            };
            q.push(order).push_bind(i64::from(query.limit));
            let mut spans =
                decode_rows(q.build_query_as().fetch_all(self.backend.reader()).await?)?;
            if query.backwards {
                spans.reverse();
            }
            return Ok(spans);
        }
        let find = Find::new(query.find);
        let limit = query.limit as usize;
        let mut page = std::collections::BinaryHeap::new();
        scan_trace(&self.backend, trace_id, |row| {
            if !find.matches(&row) {
                return Ok(());
            }
            let at = position(&row);
            // Forwards: the first `limit` from `from` on; backwards: the last `limit` before
            // it. The heap's top is the one to give up first.
            let wanted = match (query.backwards, query.from) {
                (false, Some(from)) => at >= from,
                (true, Some(from)) => at < from,
                (_, None) => true,
            };
            if wanted {
                page.push(Ranked::new(at, row, query.backwards));
                if page.len() > limit {
                    page.pop();
                }
            }
            Ok(())
        })
        .await?;
        let mut rows: Vec<Ranked> = page.into_vec();
        rows.sort_by_key(|r| r.at);
        decode_rows(rows.into_iter().map(|r| r.row).collect())
    }

    async fn trace_span_counts(
        &self,
        trace_id: TraceId,
        find: Option<&str>,
        before: Option<SpanPosition>,
    ) -> Result<SpanListCounts, StoreError> {
        if !has_block(&self.backend, trace_id).await? {
            let mut q = QueryBuilder::<B::Db>::new("SELECT count(*), coalesce(sum(CASE WHEN TRUE");
            push_find::<B>(&mut q, find);
            q.push(" THEN 1 ELSE 0 END), 0), coalesce(sum(CASE WHEN TRUE");
            push_find::<B>(&mut q, find);
            if let Some(before) = before {
                q.push(" AND");
                push_before(&mut q, before);
            }
            q.push(" THEN 1 ELSE 0 END), 0), min(start_unix_nano) FROM spans WHERE trace_id = ")
                .push_bind(trace_id.0.to_vec());
            let (spans, matched, before, first): (i64, i64, i64, Option<i64>) =
                q.build_query_as().fetch_one(self.backend.reader()).await?;
            return Ok(SpanListCounts {
                spans: spans.max(0) as u64,
                matched: matched.max(0) as u64,
                before: before.max(0) as u64,
                first_start_unix_nano: first.map(|t| t.max(0) as u64),
            });
        }
        let find = Find::new(find);
        let mut counts = SpanListCounts::default();
        scan_trace(&self.backend, trace_id, |row| {
            counts.spans += 1;
            let at = position(&row);
            counts.first_start_unix_nano = Some(
                counts
                    .first_start_unix_nano
                    .map_or(at.start_unix_nano, |first| first.min(at.start_unix_nano)),
            );
            if find.matches(&row) {
                counts.matched += 1;
                if before.is_some_and(|before| at < before) {
                    counts.before += 1;
                }
            }
            Ok(())
        })
        .await?;
        Ok(counts)
    }

    async fn span_counts(
        &self,
        trace_ids: &[TraceId],
    ) -> Result<HashMap<TraceId, u64>, StoreError> {
        let mut counts = HashMap::new();
        for chunk in trace_ids.chunks(IDS_PER_STATEMENT) {
            // Counted in the primary key's index, without reading the rows; a block says
            // how many it holds.
            let mut q = QueryBuilder::<B::Db>::new(
                "SELECT trace_id, count(*) FROM spans WHERE trace_id IN ",
            );
            push_list(&mut q, chunk.iter().map(|id| id.0.to_vec()));
            q.push(" GROUP BY trace_id UNION ALL SELECT trace_id, span_count FROM trace_blocks WHERE trace_id IN ");
            push_list(&mut q, chunk.iter().map(|id| id.0.to_vec()));
            for (id, count) in
                decode_counts(q.build_query_as().fetch_all(self.backend.reader()).await?)?
            {
                *counts.entry(id).or_insert(0) += count;
            }
        }
        Ok(counts)
    }

    async fn span_count(&self) -> Result<u64, StoreError> {
        let (count,): (i64,) = QueryBuilder::<B::Db>::new(
            "SELECT (SELECT count(*) FROM spans) \
             + (SELECT CAST(coalesce(sum(span_count), 0) AS BIGINT) FROM trace_blocks)",
        )
        .build_query_as()
        .fetch_one(self.backend.reader())
        .await?;
        Ok(count.max(0) as u64)
    }

    async fn services(&self) -> Result<Vec<String>, StoreError> {
        let rows: Vec<(String,)> =
            QueryBuilder::<B::Db>::new("SELECT DISTINCT service FROM operations ORDER BY service")
                .build_query_as()
                .fetch_all(self.backend.reader())
                .await?;
        Ok(rows.into_iter().map(|(service,)| service).collect())
    }

    async fn operations(&self, service: &str) -> Result<Vec<Operation>, StoreError> {
        let mut q =
            QueryBuilder::<B::Db>::new("SELECT name, kind FROM operations WHERE service = ");
        q.push_bind(service.to_string())
            .push(" ORDER BY name, kind");
        let rows: Vec<(String, i16)> = q.build_query_as().fetch_all(self.backend.reader()).await?;
        Ok(decode_operations(rows))
    }

    async fn search_traces(&self, query: &TraceQuery) -> Result<Vec<TraceSummary>, StoreError> {
        if query.attrs.is_empty() {
            return search_page(&self.backend, query).await;
        }
        // Attribute filters look into spans, which blocks keep compressed: summaries are
        // taken a page at a time, newest first, and kept when their spans match, until the
        // limit is reached or no summary is left.
        let mut found = Vec::new();
        let mut page = query.clone();
        // As many as asked for first (most searches find them there), then twice as many
        // each time, so a rare attribute costs few round trips.
        page.limit = query.limit.clamp(FIRST_ATTR_PAGE, MAX_ATTR_PAGE);
        loop {
            let summaries = search_page(&self.backend, &page).await?;
            let full = summaries.len() >= page.limit as usize;
            let ids: Vec<TraceId> = summaries.iter().map(|s| s.trace_id).collect();
            let matching = traces_matching(&self.backend, &ids, &query.attrs).await?;
            for summary in summaries {
                page.cursor = Some(Cursor {
                    start_unix_nano: summary.start_unix_nano,
                    trace_id: summary.trace_id,
                });
                if matching.contains(&summary.trace_id) {
                    found.push(summary);
                    if found.len() >= query.limit as usize {
                        return Ok(found);
                    }
                }
            }
            if !full {
                return Ok(found);
            }
            page.limit = (page.limit * 2).min(MAX_ATTR_PAGE);
        }
    }

    async fn hop_samples(
        &self,
        trace_ids: &[TraceId],
    ) -> Result<HashMap<TraceId, Vec<HopSample>>, StoreError> {
        let mut samples = HashMap::new();
        for chunk in trace_ids.chunks(IDS_PER_STATEMENT) {
            let mut q = QueryBuilder::<B::Db>::new(
                "SELECT trace_id, hops, packed_hops FROM trace_summaries WHERE trace_id IN ",
            );
            push_list(&mut q, chunk.iter().map(|id| id.0.to_vec()));
            let rows: Vec<(Vec<u8>, String, Option<Vec<u8>>)> =
                q.build_query_as().fetch_all(self.backend.reader()).await?;
            for (id, hops, packed) in rows {
                let id = TraceId::from_bytes(&id)
                    .map_err(|e| StoreError::Corrupt(format!("trace id: {e}")))?;
                samples.insert(id, stored_hops(&hops, packed.as_deref()));
            }
        }
        Ok(samples)
    }
}

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
    for<'r> StoredSummary: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> StoredBlock: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> StoredRow: FromRow<'r, <B::Db as Database>::Row>,
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
        let mut writer = self.backend.writer().await?;
        let mut tx = sqlx::Connection::begin(&mut *writer).await?;
        let mut deleted = B::delete_spans(&mut tx, cutoff, limit).await?;
        let mut blocks = QueryBuilder::<B::Db>::new(
            "DELETE FROM trace_blocks WHERE trace_id IN (SELECT trace_id FROM trace_blocks \
             WHERE start_unix_nano < ",
        );
        blocks
            .push_bind(cutoff)
            .push(" LIMIT ")
            .push_bind(i64::from(limit))
            .push(") RETURNING span_count");
        let counts: Vec<(i64,)> = blocks.build_query_as().fetch_all(&mut *tx).await?;
        deleted += counts
            .iter()
            .map(|(n,)| n.max(&0).unsigned_abs())
            .sum::<u64>();
        delete_summaries_before::<B::Db>(&mut tx, cutoff, limit).await?;
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
        let cutoff = i64::try_from(cutoff_unix_nano).unwrap_or(i64::MAX);
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
            delete_summaries::<B::Db>(&mut tx, &ids).await?;
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
        compact(&self.backend, traces, max_trace_bytes).await
    }

    async fn disk_usage(&self) -> Result<DiskUsage, StoreError> {
        self.backend.disk_usage().await
    }
}

/// What a healthy trace's summary holds: no flag (`flags` is then ","), and an outcome
/// that is no problem.
const HEALTHY: &str = "flags = ',' AND outcome IN ('ok', 'no_budget')";

/// The spans of `traces` (at most `IDS_PER_STATEMENT` of them), then `tail`.
fn spans_of<DB: Database>(traces: &[TraceId], tail: &str) -> QueryBuilder<DB>
where
    Vec<u8>: for<'t> Encode<'t, DB> + Type<DB>,
{
    let mut q = QueryBuilder::new(format!(
        "SELECT {SPAN_COLUMNS} FROM spans WHERE trace_id IN "
    ));
    push_list(&mut q, traces.iter().map(|id| id.0.to_vec()));
    q.push(tail);
    q
}

/// ` AND (…)`: spans whose service, name or attribute text holds `find` in any case, or,
/// when it is 16 hex digits, the span with that id.
fn push_find<B: Backend>(q: &mut QueryBuilder<B::Db>, find: Option<&str>)
where
    String: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    Vec<u8>: for<'t> Encode<'t, B::Db> + Type<B::Db>,
{
    let Some(find) = find.map(str::trim).filter(|f| !f.is_empty()) else {
        return;
    };
    let text = find.to_lowercase();
    q.push(" AND (");
    for (i, column) in ["service", "name", "attributes"].into_iter().enumerate() {
        if i > 0 {
            q.push(" OR ");
        }
        q.push(format!("{}(lower({column}), ", B::SUBSTRING))
            .push_bind(text.clone())
            .push(") > 0");
    }
    if let Ok(id) = SpanId::from_hex(find) {
        q.push(" OR span_id = ").push_bind(id.0.to_vec());
    }
    q.push(")");
}

/// ` (…)`: spans before `position` in start order, then span id.
fn push_before<DB: Database>(q: &mut QueryBuilder<DB>, position: SpanPosition)
where
    i64: for<'t> Encode<'t, DB> + Type<DB>,
    Vec<u8>: for<'t> Encode<'t, DB> + Type<DB>,
{
    let start = i64::try_from(position.start_unix_nano).unwrap_or(i64::MAX);
    q.push(" (start_unix_nano < ")
        .push_bind(start)
        .push(" OR (start_unix_nano = ")
        .push_bind(start)
        .push(" AND span_id < ")
        .push_bind(position.span_id.0.to_vec())
        .push("))");
}

/// Whether the trace has a block: its per-trace reads then run in Rust over block and rows.
async fn has_block<B>(backend: &B, trace_id: TraceId) -> Result<bool, StoreError>
where
    B: Backend,
    for<'c> &'c Pool<B::Db>: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    Vec<u8>: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    for<'r> (i64,): FromRow<'r, <B::Db as Database>::Row>,
{
    let mut q = QueryBuilder::<B::Db>::new("SELECT count(*) FROM trace_blocks WHERE trace_id = ");
    q.push_bind(trace_id.0.to_vec());
    let (n,): (i64,) = q.build_query_as().fetch_one(backend.reader()).await?;
    Ok(n > 0)
}

/// Summaries a search asks for at a time while attribute filters look into their spans:
/// at first, and at most.
const FIRST_ATTR_PAGE: u32 = 20;
const MAX_ATTR_PAGE: u32 = 1_000;

/// One page of a search, attribute filters left aside.
async fn search_page<B>(backend: &B, query: &TraceQuery) -> Result<Vec<TraceSummary>, StoreError>
where
    B: Backend,
    for<'c> &'c Pool<B::Db>: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    String: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    i64: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    f64: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    for<'r> StoredSummary: FromRow<'r, <B::Db as Database>::Row>,
{
    // Drive from the index of the most selective term when there is one (newest first
    // through the primary key); otherwise from the summaries' start index.
    let (mut q, order) = start_search::<B::Db>(query, B::SUBSTRING);
    if let Some(cursor) = query.cursor {
        B::push_after(&mut q, order, cursor);
    }
    finish_search(&mut q, order, query.limit);
    let rows: Vec<StoredSummary> = q.build_query_as().fetch_all(backend.reader()).await?;
    rows.into_iter().map(StoredSummary::decode).collect()
}

/// The traces among `ids` where each filter holds on one of their spans.
async fn traces_matching<B>(
    backend: &B,
    ids: &[TraceId],
    filters: &[AttrFilter],
) -> Result<HashSet<TraceId>, StoreError>
where
    B: Backend,
    for<'c> &'c Pool<B::Db>: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    Vec<u8>: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    for<'r> StoredBlock: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (Vec<u8>, Vec<u8>, String): FromRow<'r, <B::Db as Database>::Row>,
{
    let all = (1u64 << filters.len().min(63)) - 1;
    let mut met: HashMap<Vec<u8>, u64> = HashMap::new();
    let mut meet = |trace: &[u8], attributes: &str| {
        let mut bits = 0;
        for (i, filter) in filters.iter().enumerate().take(63) {
            if filter.matches(attributes) {
                bits |= 1 << i;
            }
        }
        if bits != 0 {
            *met.entry(trace.to_vec()).or_insert(0) |= bits;
        }
    };
    let blocks = read_blocks(backend, ids).await?;
    let mut in_blocks = HashSet::new();
    for block in blocks.values() {
        for (span_id, attributes) in block.attributes()? {
            meet(&block.trace_id, &attributes);
            in_blocks.insert((block.trace_id.clone(), span_id));
        }
    }
    for chunk in ids.chunks(IDS_PER_STATEMENT) {
        let mut q = QueryBuilder::<B::Db>::new(
            "SELECT trace_id, span_id, attributes FROM spans WHERE trace_id IN ",
        );
        push_list(&mut q, chunk.iter().map(|id| id.0.to_vec()));
        let mut rows = q
            .build_query_as::<(Vec<u8>, Vec<u8>, String)>()
            .fetch(backend.reader());
        while let Some((trace, span, attributes)) = rows.try_next().await? {
            if !in_blocks.contains(&(trace.clone(), span)) {
                meet(&trace, &attributes);
            }
        }
    }
    met.into_iter()
        .filter(|(_, bits)| *bits == all)
        .map(|(id, _)| decode_trace_id(&id))
        .collect()
}

/// Every row of `traces` (at most a statement's worth): each trace's block, then its rows
/// the block does not hold.
async fn rows_of<B>(backend: &B, traces: &[TraceId]) -> Result<Vec<StoredRow>, StoreError>
where
    B: Backend,
    for<'c> &'c Pool<B::Db>: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    Vec<u8>: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    for<'r> StoredBlock: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> StoredRow: FromRow<'r, <B::Db as Database>::Row>,
{
    let blocks = read_blocks(backend, traces).await?;
    let mut q = spans_of::<B::Db>(traces, "");
    let rows: Vec<StoredRow> = q.build_query_as().fetch_all(backend.reader()).await?;
    if blocks.is_empty() {
        return Ok(rows);
    }
    let mut by_trace: HashMap<Vec<u8>, Vec<StoredRow>> = HashMap::new();
    for row in rows {
        by_trace.entry(row.trace_id.clone()).or_default().push(row);
    }
    let mut all = Vec::new();
    for (id, block) in blocks {
        all.extend(merge(
            block.rows()?,
            by_trace.remove(&id).unwrap_or_default(),
        ));
    }
    all.extend(by_trace.into_values().flatten());
    Ok(all)
}

/// Calls `each` with every row of one trace (its block's, then its other rows, streamed),
/// holding at most one row of the database's at a time.
async fn scan_trace<B>(
    backend: &B,
    trace_id: TraceId,
    mut each: impl FnMut(StoredRow) -> Result<(), StoreError> + Send,
) -> Result<(), StoreError>
where
    B: Backend,
    for<'c> &'c Pool<B::Db>: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    Vec<u8>: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    for<'r> StoredBlock: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> StoredRow: FromRow<'r, <B::Db as Database>::Row>,
{
    let mut in_block = HashSet::new();
    if let Some(block) = read_blocks(backend, &[trace_id])
        .await?
        .into_values()
        .next()
    {
        for row in block.rows()? {
            in_block.insert(row.span_id.clone());
            each(row)?;
        }
    }
    let mut q = spans_of::<B::Db>(&[trace_id], "");
    let mut rows = q.build_query_as::<StoredRow>().fetch(backend.reader());
    while let Some(row) = rows.try_next().await? {
        if !in_block.contains(&row.span_id) {
            each(row)?;
        }
    }
    Ok(())
}

/// A row's place in its trace's start order.
fn position(row: &StoredRow) -> SpanPosition {
    let mut id = [0u8; SpanId::LEN];
    if row.span_id.len() == SpanId::LEN {
        id.copy_from_slice(&row.span_id);
    }
    SpanPosition {
        start_unix_nano: row.start_unix_nano.max(0) as u64,
        span_id: SpanId(id),
    }
}

/// `SpanListQuery::find`: spans whose service, name or attribute text holds it in any
/// case, or, when it is 16 hex digits, the span with that id; every span without one.
struct Find {
    text: Option<String>,
    id: Option<SpanId>,
}

impl Find {
    fn new(find: Option<&str>) -> Find {
        let find = find.map(str::trim).filter(|f| !f.is_empty());
        Find {
            text: find.map(str::to_lowercase),
            id: find.and_then(|f| SpanId::from_hex(f).ok()),
        }
    }

    fn matches(&self, row: &StoredRow) -> bool {
        let Some(text) = &self.text else {
            return true;
        };
        let holds = |column: &str| column.to_lowercase().contains(text.as_str());
        holds(&row.service)
            || holds(&row.name)
            || holds(&row.attributes)
            || self.id.is_some_and(|id| row.span_id == id.0)
    }
}

/// A row kept for a page of `trace_span_list`, ordered so that the heap's greatest is the
/// one the page gives up first.
struct Ranked {
    at: SpanPosition,
    backwards: bool,
    row: StoredRow,
}

impl Ranked {
    fn new(at: SpanPosition, row: StoredRow, backwards: bool) -> Ranked {
        Ranked { at, backwards, row }
    }
}

impl PartialEq for Ranked {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}

impl Eq for Ranked {}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        match self.backwards {
            false => self.at.cmp(&other.at),
            true => other.at.cmp(&self.at),
        }
    }
}

/// `TraceOutline` gathered row by row.
#[derive(Default)]
struct OutlineScan {
    spans: u64,
    start: Option<i64>,
    end: Option<i64>,
    /// The first span without a parent (else the first span): its key and what is kept.
    root: Option<((bool, i64, Vec<u8>), (String, String, Option<f64>))>,
    services: std::collections::BTreeSet<String>,
    operations: std::collections::BTreeSet<(String, String)>,
}

impl OutlineScan {
    fn add(&mut self, row: StoredRow) -> Result<(), StoreError> {
        self.spans += 1;
        self.start = Some(
            self.start
                .map_or(row.start_unix_nano, |s| s.min(row.start_unix_nano)),
        );
        self.end = Some(
            self.end
                .map_or(row.end_unix_nano, |e| e.max(row.end_unix_nano)),
        );
        let key = (
            row.parent_span_id.is_some(),
            row.start_unix_nano,
            row.span_id.clone(),
        );
        if self.root.as_ref().is_none_or(|(root, _)| key < *root) {
            self.root = Some((key, (row.service.clone(), row.name.clone(), row.budget_ms)));
        }
        let hop = Role::HOP_KINDS
            .iter()
            .any(|k| k.as_i32() == i32::from(row.kind));
        if hop {
            keep_first(&mut self.operations, (row.service.clone(), row.name));
        }
        keep_first(&mut self.services, row.service);
        Ok(())
    }

    fn finish(self, trace_id: TraceId) -> Option<TraceOutline> {
        let (start, end) = (self.start?, self.end?);
        let (_, (root_service, root_name, root_budget_ms)) = self.root?;
        Some(TraceOutline {
            trace_id,
            span_count: self.spans,
            start_unix_nano: start.max(0) as u64,
            end_unix_nano: end.max(start).max(0) as u64,
            root_service,
            root_name,
            root_budget_ms,
            services: self.services.into_iter().collect(),
            operations: self.operations.into_iter().collect(),
        })
    }
}

/// Adds `value` to a set that keeps its first `OUTLINE_NAMES` in order.
fn keep_first<T: Ord>(set: &mut std::collections::BTreeSet<T>, value: T) {
    set.insert(value);
    if set.len() > OUTLINE_NAMES as usize {
        set.pop_last();
    }
}

/// A span encoded into column values, shared by both backends' inserts.
pub struct SpanRow {
    pub(crate) trace_id: [u8; TraceId::LEN],
    pub(crate) span_id: [u8; SpanId::LEN],
    pub(crate) parent_span_id: Option<[u8; SpanId::LEN]>,
    pub(crate) service: String,
    pub(crate) name: String,
    pub(crate) kind: i16,
    pub(crate) start_unix_nano: i64,
    pub(crate) end_unix_nano: i64,
    pub(crate) status_code: i16,
    pub(crate) status_message: String,
    pub(crate) budget_ms: Option<f64>,
    pub(crate) budget_source: Option<String>,
    pub(crate) attributes: String,
    /// Shared by the rows of spans with the same resource (`encode_rows`).
    pub(crate) resource: Arc<str>,
    /// Shared by consecutive rows whose details are the same (`encode_rows`).
    pub(crate) details: Arc<str>,
}

/// A (service, name, kind) and the latest start seen for it in a batch.
pub type OperationRow = (String, String, i16, i64);

/// Spans encoded for insertion, with the operations they touch. Encoding is CPU work done
/// by the request that brought the spans, so the writer only runs the insert.
pub struct EncodedBatch {
    pub(crate) rows: Vec<SpanRow>,
    pub(crate) operations: Vec<OperationRow>,
    /// The distinct trace ids of the rows, sorted: marked dirty for the analyzer.
    pub(crate) traces: Vec<[u8; TraceId::LEN]>,
}

impl EncodedBatch {
    /// `from_spans` on a copy of the spans (tests, the demo and offline paths).
    pub fn encode(spans: &[Span]) -> EncodedBatch {
        EncodedBatch::from_spans(spans.to_vec())
    }

    /// `encode`, taking the spans apart instead of copying their text (the ingest path).
    pub fn from_spans(spans: Vec<Span>) -> EncodedBatch {
        let mut traces: Vec<_> = spans.iter().map(|s| s.trace_id.0).collect();
        traces.sort_unstable();
        traces.dedup();
        EncodedBatch {
            operations: batch_operations(&spans),
            rows: encode_rows(spans),
            traces,
        }
    }

    pub fn empty() -> EncodedBatch {
        EncodedBatch {
            rows: Vec::new(),
            operations: Vec::new(),
            traces: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// One batch of all the rows; operations deduplicated (a Postgres upsert may not touch
    /// a row twice) and sorted (concurrent upserts lock rows in one order).
    pub fn merge(batches: Vec<EncodedBatch>) -> EncodedBatch {
        let mut merged = EncodedBatch::empty();
        for batch in batches {
            merged.rows.extend(batch.rows);
            merged.operations.extend(batch.operations);
            merged.traces.extend(batch.traces);
        }
        merged.traces.sort();
        merged.traces.dedup();
        merged.operations.sort();
        merged.operations.dedup_by(|later, earlier| {
            let same = (&later.0, &later.1, later.2) == (&earlier.0, &earlier.1, earlier.2);
            if same {
                earlier.3 = earlier.3.max(later.3);
            }
            same
        });
        merged
    }
}

/// Encodes spans for insertion, moving their text into the rows. The spans of one OTLP
/// `ResourceSpans` share one resource, so its JSON is written once per run of spans sharing
/// it; so are the details of consecutive spans of one scope that have no events, links or
/// warnings (most spans).
pub fn encode_rows(spans: Vec<Span>) -> Vec<SpanRow> {
    let mut rows = Vec::with_capacity(spans.len());
    let mut last_resource: Option<(Arc<crate::core::model::Attributes>, Arc<str>)> = None;
    let mut last_plain_details: Option<(crate::core::model::Scope, Arc<str>)> = None;
    for span in spans {
        let resource = match &last_resource {
            Some((shared, json))
                if Arc::ptr_eq(shared, &span.resource) || **shared == *span.resource =>
            {
                json.clone()
            }
            _ => {
                let json: Arc<str> = attr_json::attributes_to_string(&span.resource).into();
                last_resource = Some((span.resource.clone(), json.clone()));
                json
            }
        };
        let plain = span.events.is_empty() && span.links.is_empty() && span.warnings.is_empty();
        let details: Arc<str> = match &last_plain_details {
            Some((scope, json)) if plain && *scope == span.scope => json.clone(),
            _ => {
                let json: Arc<str> = attr_json::details_to_string(
                    &span.scope,
                    &span.events,
                    &span.links,
                    &span.warnings,
                )
                .into();
                if plain {
                    last_plain_details = Some((span.scope.clone(), json.clone()));
                }
                json
            }
        };
        let (budget_ms, budget_source) = match span.budget {
            Some(budget) => (Some(budget.ms), Some(budget.source)),
            None => (None, None),
        };
        rows.push(SpanRow {
            trace_id: span.trace_id.0,
            span_id: span.span_id.0,
            parent_span_id: span.parent_span_id.map(|p| p.0),
            kind: span.kind.as_i32() as i16,
            // normalize rejects timestamps above i64::MAX.
            start_unix_nano: i64::try_from(span.start_unix_nano).unwrap_or(i64::MAX),
            end_unix_nano: i64::try_from(span.end_unix_nano).unwrap_or(i64::MAX),
            status_code: span.status.code.as_i32() as i16,
            budget_ms,
            budget_source,
            attributes: attr_json::attributes_to_string(&span.attributes),
            resource,
            details,
            service: span.service,
            name: span.name,
            status_message: span.status.message,
        });
    }
    rows
}

/// The distinct (service, name, kind, latest start) of a batch, for the operations table.
pub fn batch_operations(spans: &[Span]) -> Vec<OperationRow> {
    let mut seen: std::collections::HashMap<(&str, &str, i16), i64> = Default::default();
    for span in spans {
        let start = i64::try_from(span.start_unix_nano).unwrap_or(i64::MAX);
        let entry = seen
            .entry((&span.service, &span.name, span.kind.as_i32() as i16))
            .or_insert(start);
        *entry = (*entry).max(start);
    }
    let mut operations: Vec<_> = seen
        .into_iter()
        .map(|((service, name, kind), last)| (service.to_string(), name.to_string(), kind, last))
        .collect();
    operations.sort();
    operations
}

/// One stored span row as read back, before decoding.
#[derive(sqlx::FromRow)]
pub(crate) struct StoredRow {
    pub trace_id: Vec<u8>,
    pub span_id: Vec<u8>,
    pub parent_span_id: Option<Vec<u8>>,
    pub service: String,
    pub name: String,
    pub kind: i16,
    pub start_unix_nano: i64,
    pub end_unix_nano: i64,
    pub status_code: i16,
    pub status_message: String,
    pub budget_ms: Option<f64>,
    pub budget_source: Option<String>,
    pub attributes: String,
    pub resource: String,
    pub details: String,
}

/// The column list both backends select, in `StoredRow` order.
pub(crate) const SPAN_COLUMNS: &str = "trace_id, span_id, parent_span_id, service, name, kind, \
     start_unix_nano, end_unix_nano, status_code, status_message, budget_ms, budget_source, \
     attributes, resource, details";

impl StoredRow {
    /// The row's size as read: its ids and text.
    pub(crate) fn text_bytes(&self) -> u64 {
        (self.trace_id.len()
            + self.span_id.len()
            + 8
            + self.service.len()
            + self.name.len()
            + self.status_message.len()
            + self.budget_source.as_ref().map_or(0, String::len)
            + self.attributes.len()
            + self.resource.len()
            + self.details.len()) as u64
    }

    pub fn decode(self) -> Result<Span, StoreError> {
        let corrupt =
            |what: &str, e: &dyn std::fmt::Display| StoreError::Corrupt(format!("{what}: {e}"));
        let json = |text: &str, what: &str| -> Result<Value, StoreError> {
            serde_json::from_str(text).map_err(|e| corrupt(what, &e))
        };
        let (scope, events, links, warnings) =
            attr_json::details_from_json(&json(&self.details, "details")?);
        Ok(Span {
            trace_id: TraceId::from_bytes(&self.trace_id).map_err(|e| corrupt("trace id", &e))?,
            span_id: SpanId::from_bytes(&self.span_id).map_err(|e| corrupt("span id", &e))?,
            parent_span_id: match self.parent_span_id {
                Some(bytes) => {
                    Some(SpanId::from_bytes(&bytes).map_err(|e| corrupt("parent span id", &e))?)
                }
                None => None,
            },
            service: self.service,
            name: self.name,
            kind: SpanKind::from_i32(self.kind.into()),
            start_unix_nano: self.start_unix_nano.max(0) as u64,
            end_unix_nano: self.end_unix_nano.max(0) as u64,
            status: Status {
                code: StatusCode::from_i32(self.status_code.into()),
                message: self.status_message,
            },
            attributes: attr_json::attributes_from_json(&json(&self.attributes, "attributes")?),
            resource: Arc::new(attr_json::attributes_from_json(&json(
                &self.resource,
                "resource",
            )?)),
            scope,
            events,
            links,
            budget: match (self.budget_ms, self.budget_source) {
                (Some(ms), Some(source)) => Some(Budget { ms, source }),
                _ => None,
            },
            warnings,
        })
    }
}

/// `TraceReader::traces_within`'s rule, for rows in trace-id order: whole traces while
/// their rows' text stays within `max_bytes`, the first up to `max_trace_bytes`; a trace
/// past that is dropped as soon as it passes it, so what is held never exceeds the larger
/// of the two limits.
struct Within {
    read: TracesWithin,
    max_bytes: u64,
    max_trace_bytes: u64,
    /// The trace being read: its id, where its spans start in `read.spans`, their bytes.
    current: Option<(Vec<u8>, usize, u64)>,
    /// Whether the current trace was found too large (its further rows are passed over).
    skipping: bool,
    /// The last trace read whole or found too large.
    last_done: Option<Vec<u8>>,
}

impl Within {
    fn new(max_bytes: u64, max_trace_bytes: u64) -> Within {
        Within {
            read: TracesWithin::default(),
            max_bytes,
            max_trace_bytes: max_trace_bytes.max(max_bytes),
            current: None,
            skipping: false,
            last_done: None,
        }
    }

    /// Takes the next row; false when reading stops: a trace after the first one would
    /// pass `max_bytes` (what was read of it is dropped; it waits for another read).
    fn push(&mut self, row: StoredRow) -> Result<bool, StoreError> {
        let same = matches!(&self.current, Some((id, _, _)) if *id == row.trace_id);
        if !same {
            self.last_done = self.current.take().map(|(id, _, _)| id);
            self.skipping = false;
            self.current = Some((row.trace_id.clone(), self.read.spans.len(), 0));
        }
        if self.skipping {
            return Ok(true);
        }
        let Some((id, first, bytes)) = &mut self.current else {
            unreachable!("set above")
        };
        let row_bytes = row.text_bytes();
        if *first > 0 && self.read.bytes + row_bytes > self.max_bytes {
            self.read.spans.truncate(*first);
            self.read.bytes -= *bytes;
            self.read.stopped_after = self.last_done.as_deref().map(decode_trace_id).transpose()?;
            return Ok(false);
        }
        if *bytes + row_bytes > self.max_trace_bytes {
            self.read.spans.truncate(*first);
            self.read.bytes -= *bytes;
            *bytes = 0;
            self.read.too_large.push(decode_trace_id(id)?);
            self.skipping = true;
            return Ok(true);
        }
        *bytes += row_bytes;
        self.read.bytes += row_bytes;
        self.read.spans.push(row.decode()?);
        Ok(true)
    }

    fn finish(self) -> TracesWithin {
        self.read
    }
}

fn decode_trace_id(bytes: &[u8]) -> Result<TraceId, StoreError> {
    TraceId::from_bytes(bytes).map_err(|e| StoreError::Corrupt(format!("trace id: {e}")))
}

pub(crate) fn decode_rows(rows: Vec<StoredRow>) -> Result<Vec<Span>, StoreError> {
    rows.into_iter().map(StoredRow::decode).collect()
}

pub(crate) fn decode_counts(
    rows: Vec<(Vec<u8>, i64)>,
) -> Result<HashMap<TraceId, u64>, StoreError> {
    Ok(decode_marks(rows)?
        .into_iter()
        .map(|(id, count)| (id, count.max(0) as u64))
        .collect())
}

pub(crate) fn decode_operations(rows: Vec<(String, i16)>) -> Vec<Operation> {
    rows.into_iter()
        .map(|(name, kind)| Operation {
            name,
            kind: SpanKind::from_i32(kind.into()),
        })
        .collect()
}

/// Rows of (trace id, start): positions in the summaries' newest-first order.
pub(crate) fn decode_positions(rows: Vec<(Vec<u8>, i64)>) -> Result<Vec<Cursor>, StoreError> {
    Ok(decode_marks(rows)?
        .into_iter()
        .map(|(trace_id, start)| Cursor {
            start_unix_nano: start.max(0) as u64,
            trace_id,
        })
        .collect())
}

/// Rows of (trace id, number): marks, or counts (`decode_counts`).
pub(crate) fn decode_marks(rows: Vec<(Vec<u8>, i64)>) -> Result<Vec<(TraceId, i64)>, StoreError> {
    rows.into_iter()
        .map(|(id, mark)| {
            TraceId::from_bytes(&id)
                .map(|id| (id, mark))
                .map_err(|e| StoreError::Corrupt(format!("trace id: {e}")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::encode_rows;
    use crate::core::attr_json::details_to_string;
    use crate::core::model::{Event, Scope};

    #[test]
    fn rows_share_details_only_where_they_are_the_same() {
        let mut spans = crate::core::analyze::fixture::parse(
            "edge server \"a\" 0 10\n  edge client \"b\" 1 8\n  edge client \"c\" 2 7\n  edge client \"d\" 3 6\n  edge client \"e\" 4 5",
        );
        spans[1].events.push(Event {
            time_unix_nano: 5,
            name: "retry".into(),
            attributes: Vec::new(),
        });
        spans[2].warnings.push("a warning".into());
        spans[4].scope = Scope {
            name: "other".into(),
            version: "2".into(),
        };
        let expected: Vec<String> = spans
            .iter()
            .map(|s| details_to_string(&s.scope, &s.events, &s.links, &s.warnings))
            .collect();
        let details: Vec<String> = encode_rows(spans)
            .iter()
            .map(|row| row.details.to_string())
            .collect();
        assert_eq!(details, expected);
        assert_eq!(details[0], details[3], "plain spans of one scope share");
        assert_ne!(details[3], details[4]);
    }
}

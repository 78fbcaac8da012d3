//! The span roles for both databases (`SpanWriter`, `TraceReader`; `Store`'s own upkeep is
//! in `upkeep.rs`), each statement written once over the sqlx backend.

use std::collections::{HashMap, HashSet};

use async_trait::async_trait;
use futures_util::TryStreamExt as _;
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, QueryBuilder, Type};

use super::backend::{Backend, SqlStore};
use super::blocks::{StoredBlock, merge, read_blocks};
use super::dictionary::Dictionaries;
use super::query::{
    AttrFilter, Cursor, OUTLINE_NAMES, SpanListCounts, SpanListQuery, SpanPosition, StoredSummary,
    TraceOutline, TraceQuery, TraceSize, TracesWithin,
};
use super::rollup::stored_hops;
use super::rows::{
    EncodedBatch, SPAN_COLUMNS, StoredRow, decode_counts, decode_operations, decode_rows,
    decode_trace_id,
};
use super::search::{finish_search, start_search};
use super::summaries::push_list;
use super::trace_scan::{Find, OutlineScan, Ranked, position};
use super::{Operation, SpanWriter, StoreError, TraceReader};
use crate::core::analyze::Role;
use crate::core::analyze::hops::HopSample;
use crate::core::analyze::summary::TraceSummary;
use crate::core::model::{Span, SpanId, TraceId};

/// Trace ids per statement: within both databases' parameter limits.
pub(super) const IDS_PER_STATEMENT: usize = 500;

#[async_trait]
impl<B: Backend> SpanWriter for SqlStore<B> {
    async fn write_batch(&self, batch: &EncodedBatch) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let operations = self.seen_operations.news(&batch.operations);
        self.backend.write_batch(batch, &operations).await?;
        self.seen_operations.committed(&operations);
        Ok(())
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
    for<'r> (i64, Vec<u8>): FromRow<'r, <B::Db as Database>::Row>,
{
    async fn trace(&self, trace_id: TraceId) -> Result<Vec<Span>, StoreError> {
        let mut spans =
            decode_rows(rows_of(&self.backend, &self.block_dictionaries, &[trace_id]).await?)?;
        spans.sort_by_key(|s| (s.start_unix_nano, s.span_id));
        Ok(spans)
    }

    async fn traces(&self, trace_ids: &[TraceId]) -> Result<Vec<Span>, StoreError> {
        let mut spans = Vec::new();
        for chunk in trace_ids.chunks(IDS_PER_STATEMENT) {
            spans.extend(decode_rows(
                rows_of(&self.backend, &self.block_dictionaries, chunk).await?,
            )?);
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
            let blocks = read_blocks(&self.backend, &self.block_dictionaries, chunk).await?;
            let mut pending: Vec<&StoredBlock> = blocks.values().collect();
            pending.sort_unstable_by(|a, b| b.trace_id.cmp(&a.trace_id));
            let mut in_block: (Vec<u8>, HashSet<Vec<u8>>) = Default::default();
            let mut q = spans_of::<B::Db>(chunk, " ORDER BY trace_id");
            let mut rows = q.build_query_as::<StoredRow>().fetch(self.backend.reader());
            while let Some(row) = rows.try_next().await? {
                while pending.last().is_some_and(|b| b.trace_id <= row.trace_id) {
                    let block = pending.pop().expect("checked");
                    in_block = (block.trace_id.clone(), HashSet::new());
                    for held in block.rows(&self.block_dictionaries)? {
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
                for held in block.rows(&self.block_dictionaries)? {
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
        if let Some(block) = block_of(&self.backend, &self.block_dictionaries, trace_id).await? {
            let mut outline = OutlineScan::default();
            scan_trace(
                &self.backend,
                &self.block_dictionaries,
                trace_id,
                block,
                |row| outline.add(row),
            )
            .await?;
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
        if let Some(block) = block_of(&self.backend, &self.block_dictionaries, trace_id).await? {
            let after = after.map(|id| id.0.to_vec());
            for row in block.rows(&self.block_dictionaries)? {
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
        let Some(block) = block_of(&self.backend, &self.block_dictionaries, trace_id).await? else {
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
        };
        let find = Find::new(query.find);
        let limit = query.limit as usize;
        let mut page = std::collections::BinaryHeap::new();
        scan_trace(
            &self.backend,
            &self.block_dictionaries,
            trace_id,
            block,
            |row| {
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
            },
        )
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
        let Some(block) = block_of(&self.backend, &self.block_dictionaries, trace_id).await? else {
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
        };
        let find = Find::new(find);
        let mut counts = SpanListCounts::default();
        scan_trace(
            &self.backend,
            &self.block_dictionaries,
            trace_id,
            block,
            |row| {
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
            },
        )
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
        if !query.checked_after() {
            return search_page(&self.backend, &self.summary_dictionaries, query).await;
        }
        // Attribute filters look into spans, which blocks keep compressed, and a service's
        // operation is checked on the summaries the terms found: summaries are taken a page
        // at a time, newest first, and kept when they match, until the limit is reached or
        // no summary is left.
        let mut found = Vec::new();
        let mut page = query.clone();
        // As many as asked for first (most searches find them there), then twice as many
        // each time, so a rare attribute costs few round trips.
        page.limit = query.limit.clamp(FIRST_CHECKED_PAGE, MAX_CHECKED_PAGE);
        loop {
            let summaries = search_page(&self.backend, &self.summary_dictionaries, &page).await?;
            let full = summaries.len() >= page.limit as usize;
            let ids: Vec<TraceId> = summaries
                .iter()
                .filter(|s| query.pair_matches(s))
                .map(|s| s.trace_id)
                .collect();
            let matching = if query.attrs.is_empty() {
                ids.into_iter().collect()
            } else {
                traces_matching(&self.backend, &self.block_dictionaries, &ids, &query.attrs).await?
            };
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
            page.limit = (page.limit * 2).min(MAX_CHECKED_PAGE);
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
            let packed = rows.iter().filter_map(|(_, _, packed)| packed.as_deref());
            self.hop_dictionaries
                .load_for(self.backend.reader(), packed)
                .await?;
            for (id, hops, packed) in rows {
                let id = TraceId::from_bytes(&id)
                    .map_err(|e| StoreError::Corrupt(format!("trace id: {e}")))?;
                samples.insert(
                    id,
                    stored_hops(&hops, packed.as_deref(), &self.hop_dictionaries),
                );
            }
        }
        Ok(samples)
    }
}

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

/// The trace's block, if it has one: its per-trace reads then run in Rust over block and
/// rows (`scan_trace`), otherwise in the database.
async fn block_of<B>(
    backend: &B,
    dictionaries: &Dictionaries,
    trace_id: TraceId,
) -> Result<Option<StoredBlock>, StoreError>
where
    B: Backend,
    for<'c> &'c Pool<B::Db>: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    Vec<u8>: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    for<'r> StoredBlock: FromRow<'r, <B::Db as Database>::Row>,
    i64: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    for<'r> (i64, Vec<u8>): FromRow<'r, <B::Db as Database>::Row>,
{
    Ok(read_blocks(backend, dictionaries, &[trace_id])
        .await?
        .into_values()
        .next())
}

/// Summaries a search asks for at a time while what it asks is checked after the
/// database's answer (`TraceQuery::checked_after`): at first, and at most.
const FIRST_CHECKED_PAGE: u32 = 20;
const MAX_CHECKED_PAGE: u32 = 1_000;

/// One page of a search, attribute filters left aside.
async fn search_page<B>(
    backend: &B,
    dictionaries: &Dictionaries,
    query: &TraceQuery,
) -> Result<Vec<TraceSummary>, StoreError>
where
    B: Backend,
    for<'c> &'c Pool<B::Db>: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    String: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    i64: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    f64: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    for<'r> StoredSummary: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (i64, Vec<u8>): FromRow<'r, <B::Db as Database>::Row>,
    Vec<u8>: for<'t> Encode<'t, B::Db> + Type<B::Db>,
{
    // Drive from the index of the most selective term when there is one (newest first
    // through the primary key); otherwise from the summaries' start index.
    let (mut q, order) = start_search::<B::Db>(query, B::TERMS);
    if let Some(cursor) = query.cursor {
        B::push_after(&mut q, order, cursor);
    }
    finish_search(&mut q, order, query.limit);
    let rows: Vec<StoredSummary> = q.build_query_as().fetch_all(backend.reader()).await?;
    let packed = rows.iter().filter_map(|row| row.packed_detail.as_deref());
    dictionaries.load_for(backend.reader(), packed).await?;
    rows.into_iter()
        .map(|row| row.decode(dictionaries))
        .collect()
}

/// The traces among `ids` where each filter holds on one of their spans.
async fn traces_matching<B>(
    backend: &B,
    dictionaries: &Dictionaries,
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
    i64: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    for<'r> (i64, Vec<u8>): FromRow<'r, <B::Db as Database>::Row>,
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
    let blocks = read_blocks(backend, dictionaries, ids).await?;
    let mut in_blocks = HashSet::new();
    for block in blocks.values() {
        for (span_id, attributes) in block.attributes(dictionaries)? {
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
async fn rows_of<B>(
    backend: &B,
    dictionaries: &Dictionaries,
    traces: &[TraceId],
) -> Result<Vec<StoredRow>, StoreError>
where
    B: Backend,
    for<'c> &'c Pool<B::Db>: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    Vec<u8>: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    for<'r> StoredBlock: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> StoredRow: FromRow<'r, <B::Db as Database>::Row>,
    i64: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    for<'r> (i64, Vec<u8>): FromRow<'r, <B::Db as Database>::Row>,
{
    let blocks = read_blocks(backend, dictionaries, traces).await?;
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
            block.rows(dictionaries)?,
            by_trace.remove(&id).unwrap_or_default(),
        ));
    }
    all.extend(by_trace.into_values().flatten());
    Ok(all)
}

/// Calls `each` with every row of one trace (its `block`'s, then its other rows, streamed),
/// holding at most one row of the database's at a time.
async fn scan_trace<B>(
    backend: &B,
    dictionaries: &Dictionaries,
    trace_id: TraceId,
    block: StoredBlock,
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
    for row in block.rows(dictionaries)? {
        in_block.insert(row.span_id.clone());
        each(row)?;
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

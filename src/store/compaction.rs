//! Compaction: once the analyzer has summarised a trace, its span rows move into the
//! trace's block (`blocks.rs`), merged with any block it had; exactly the rows moved are
//! deleted, so a span arriving meanwhile stays a row.

use std::collections::{HashMap, HashSet};

use futures_util::TryStreamExt as _;
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, QueryBuilder, Type};

use super::StoreError;
use super::backend::{Backend, Writer as _};
use super::blocks::{IDS_PER_STATEMENT, StoredBlock, encode, merge, read_blocks};
use super::dictionary::Dictionaries;
use super::query::HEALTHY;
use super::rows::{SPAN_COLUMNS, StoredRow};
use super::summaries::{delete_keyed, push_list};
use crate::core::model::{SpanId, TraceId};

/// New blocks per insert: five values each, within both databases' parameter limits.
const BLOCKS_PER_STATEMENT: usize = 100;

/// What `compact` did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Compacted {
    /// Traces whose block was written.
    pub traces: u64,
    /// Rows moved into blocks (and deleted).
    pub spans: u64,
    /// The text of those rows, and the bytes of the blocks written.
    pub row_bytes: u64,
    pub block_bytes: u64,
}

/// Moves the rows of `traces` into their blocks: for each trace whose rows (with its block)
/// hold at most `max_trace_bytes` of text, writes the block holding all of them and
/// deletes exactly the rows read, in one transaction. A block rewritten by someone else
/// since it was read (its generation moved) is left alone, and so are its rows.
pub(crate) async fn compact<B>(
    backend: &B,
    dictionaries: &Dictionaries,
    traces: &[TraceId],
    max_trace_bytes: u64,
) -> Result<Compacted, StoreError>
where
    B: Backend,
    for<'c> &'c Pool<B::Db>: Executor<'c, Database = B::Db>,
    for<'c> &'c mut <B::Db as Database>::Connection: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    Vec<u8>: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    i64: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    for<'r> StoredBlock: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> StoredRow: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (Vec<u8>,): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (i64, Vec<u8>): FromRow<'r, <B::Db as Database>::Row>,
{
    let mut done = Compacted::default();
    let mut ids = traces.to_vec();
    ids.sort_unstable();
    ids.dedup();
    for chunk in ids.chunks(IDS_PER_STATEMENT) {
        let mut old = read_blocks(backend, dictionaries, chunk).await?;
        // Rows in trace order; a trace past the limit is passed over (it stays rows).
        let mut q = QueryBuilder::<B::Db>::new(format!(
            "SELECT {SPAN_COLUMNS} FROM spans WHERE trace_id IN "
        ));
        push_list(&mut q, chunk.iter().map(|id| id.0.to_vec()));
        q.push(" ORDER BY trace_id");
        let mut stream = q.build_query_as::<StoredRow>().fetch(backend.reader());
        // What waits to be written is compressed; past `max_trace_bytes` of it, it is
        // written before reading on, so a compaction holds at most about twice that.
        let (mut new, mut pending) = (Vec::new(), 0u64);
        let mut current: Option<(Vec<u8>, Vec<StoredRow>, u64)> = None;
        loop {
            let row = stream.try_next().await?;
            let next_trace = row.as_ref().is_none_or(|row| {
                current
                    .as_ref()
                    .is_none_or(|(id, _, _)| *id != row.trace_id)
            });
            if next_trace {
                let trace = current.take();
                if let Some(rewrite) = finished(trace, &mut old, max_trace_bytes, dictionaries)? {
                    pending += rewrite.held_bytes();
                    new.push(rewrite);
                }
                if pending > max_trace_bytes {
                    write_rewrites(backend, &new, &mut done).await?;
                    (new, pending) = (Vec::new(), 0);
                }
            }
            let Some(row) = row else {
                break;
            };
            let (_, rows, bytes) =
                current.get_or_insert_with(|| (row.trace_id.clone(), Vec::new(), 0));
            if *bytes <= max_trace_bytes {
                *bytes += row.text_bytes();
                rows.push(row);
            }
        }
        drop(stream);
        write_rewrites(backend, &new, &mut done).await?;
    }
    // The dictionary, once trained, is in the store before the next block uses it.
    if let Err(error) = dictionaries.train_when_ready(backend).await {
        tracing::warn!(%error, "could not train or store a compression dictionary for span blocks; they stay plainly compressed until a later try succeeds");
    }
    Ok(done)
}

/// Moves the rows of up to `limit` traces waiting in `compaction_due`, oldest first, into
/// their blocks (`compact`), then takes exactly those entries off (one queued again
/// meanwhile by a late span's analysis stays); returns what it did and how many entries it
/// took (0 when none waits). An entry whose trace has no rows left (retention, or a
/// compaction before a crash) goes with nothing written.
pub(crate) async fn compact_due<B>(
    backend: &B,
    dictionaries: &Dictionaries,
    limit: u32,
    max_trace_bytes: u64,
) -> Result<(Compacted, usize), StoreError>
where
    B: Backend,
    for<'c> &'c Pool<B::Db>: Executor<'c, Database = B::Db>,
    for<'c> &'c mut <B::Db as Database>::Connection: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    Vec<u8>: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    i64: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    for<'r> StoredBlock: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> StoredRow: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (Vec<u8>,): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (Vec<u8>, i64): FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (i64, Vec<u8>): FromRow<'r, <B::Db as Database>::Row>,
{
    let mut q = QueryBuilder::<B::Db>::new(
        "SELECT trace_id, queued_unix_nano FROM compaction_due \
         ORDER BY queued_unix_nano, trace_id LIMIT ",
    );
    q.push_bind(i64::from(limit));
    let rows: Vec<(Vec<u8>, i64)> = q.build_query_as().fetch_all(backend.reader()).await?;
    let due = rows
        .into_iter()
        .map(|(id, queued)| {
            TraceId::from_bytes(&id)
                .map(|id| (id, queued))
                .map_err(|e| StoreError::Corrupt(format!("trace id waiting for compaction: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if due.is_empty() {
        return Ok((Compacted::default(), 0));
    }
    let ids: Vec<TraceId> = due.iter().map(|(id, _)| *id).collect();
    let done = compact(backend, dictionaries, &ids, max_trace_bytes).await?;
    let mut writer = backend.writer().await?;
    let mut tx = sqlx::Connection::begin(&mut *writer).await?;
    delete_keyed::<B::Db>(&mut tx, "compaction_due", "queued_unix_nano", &due).await?;
    tx.commit().await?;
    writer.done();
    Ok((done, due.len()))
}

/// How many traces wait for compaction (`compact_due`).
pub(crate) async fn compaction_waiting<B>(backend: &B) -> Result<u64, StoreError>
where
    B: Backend,
    for<'c> &'c Pool<B::Db>: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    for<'r> (i64,): FromRow<'r, <B::Db as Database>::Row>,
{
    let (count,): (i64,) = sqlx::query_as("SELECT count(*) FROM compaction_due")
        .fetch_one(backend.reader())
        .await?;
    Ok(count.max(0) as u64)
}

/// The rewrite of a trace read whole (`rows`, `bytes` of text), unless it has no rows or
/// it passes `max_trace_bytes` with its block's.
fn finished(
    trace: Option<(Vec<u8>, Vec<StoredRow>, u64)>,
    old: &mut HashMap<Vec<u8>, StoredBlock>,
    max_trace_bytes: u64,
    dictionaries: &Dictionaries,
) -> Result<Option<Rewrite>, StoreError> {
    let Some((id, rows, bytes)) = trace else {
        return Ok(None);
    };
    let previous = old.remove(&id);
    let old_bytes = previous.as_ref().map_or(0, |b| b.text_bytes.max(0) as u64);
    if rows.is_empty() || bytes + old_bytes > max_trace_bytes {
        return Ok(None);
    }
    Rewrite::build(id, previous, rows, dictionaries).map(Some)
}

/// Writes `rewrites` in one transaction, adding what was written to `done`.
async fn write_rewrites<B>(
    backend: &B,
    rewrites: &[Rewrite],
    done: &mut Compacted,
) -> Result<(), StoreError>
where
    B: Backend,
    for<'c> &'c mut <B::Db as Database>::Connection: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    Vec<u8>: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    i64: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    for<'r> (Vec<u8>,): FromRow<'r, <B::Db as Database>::Row>,
{
    if rewrites.is_empty() {
        return Ok(());
    }
    let mut writer = backend.writer().await?;
    let mut tx = sqlx::Connection::begin(&mut *writer).await?;
    if !B::COMPACTION_LOCK.is_empty() {
        sqlx::query::<B::Db>(sqlx::AssertSqlSafe(B::COMPACTION_LOCK))
            .execute(&mut *tx)
            .await?;
    }
    // A trace's first block is inserted with others in one statement, and the rows of all
    // written traces are deleted together: a statement per trace cost a round trip to the
    // database each (`budgetscope-bench ingest --rate 10000`, the server's CPU).
    let (first, later): (Vec<&Rewrite>, Vec<&Rewrite>) =
        rewrites.iter().partition(|r| r.generation.is_none());
    let mut written: Vec<&Rewrite> = Vec::new();
    for chunk in first.chunks(BLOCKS_PER_STATEMENT) {
        let inserted = insert_first_blocks::<B>(&mut tx, chunk).await?;
        written.extend(chunk.iter().filter(|r| inserted.contains(&r.trace_id)));
    }
    for rewrite in later {
        if rewrite.update::<B>(&mut tx).await? {
            written.push(rewrite);
        }
    }
    let moved: Vec<(&Vec<u8>, &Vec<u8>)> = written
        .iter()
        .flat_map(|r| r.moved.iter().map(move |span| (&r.trace_id, span)))
        .collect();
    for chunk in moved.chunks(IDS_PER_STATEMENT) {
        // The list of trace ids lets SQLite find the rows by its key's first column; on the
        // pairs alone it scans the whole table.
        let traces: HashSet<&Vec<u8>> = chunk.iter().map(|(trace, _)| *trace).collect();
        let mut delete = QueryBuilder::<B::Db>::new("DELETE FROM spans WHERE trace_id IN ");
        push_list(&mut delete, traces.into_iter().cloned());
        delete.push(" AND (trace_id, span_id) IN (");
        delete.push_values(chunk, |mut b, (trace, span)| {
            b.push_bind((*trace).clone()).push_bind((*span).clone());
        });
        delete.push(")");
        delete.build().execute(&mut *tx).await?;
    }
    for rewrite in written {
        done.traces += 1;
        done.spans += rewrite.moved.len() as u64;
        done.row_bytes += rewrite.moved_bytes;
        done.block_bytes += rewrite.block.len() as u64;
    }
    tx.commit().await?;
    writer.done();
    Ok(())
}

/// One trace's new block, and the rows it takes in.
struct Rewrite {
    trace_id: Vec<u8>,
    /// The generation read, None when the trace had no block.
    generation: Option<i64>,
    start_unix_nano: i64,
    span_count: i64,
    text_bytes: i64,
    block: Vec<u8>,
    /// The span ids of the rows moved into the block (deleted when it is written).
    moved: Vec<Vec<u8>>,
    moved_bytes: u64,
}

impl Rewrite {
    fn build(
        trace_id: Vec<u8>,
        previous: Option<StoredBlock>,
        rows: Vec<StoredRow>,
        dictionaries: &Dictionaries,
    ) -> Result<Rewrite, StoreError> {
        let moved: Vec<Vec<u8>> = rows.iter().map(|r| r.span_id.clone()).collect();
        let moved_bytes = rows.iter().map(StoredRow::text_bytes).sum();
        let (generation, held) = match previous {
            Some(block) => (Some(block.generation), block.rows(dictionaries)?),
            None => (None, Vec::new()),
        };
        let mut all = merge(held, rows);
        all.sort_by(|a, b| (a.start_unix_nano, &a.span_id).cmp(&(b.start_unix_nano, &b.span_id)));
        let text_bytes = all.iter().map(StoredRow::text_bytes).sum::<u64>();
        Ok(Rewrite {
            trace_id,
            generation,
            start_unix_nano: all.first().map_or(0, |r| r.start_unix_nano),
            span_count: all.len() as i64,
            text_bytes: i64::try_from(text_bytes).unwrap_or(i64::MAX),
            block: encode(&all, dictionaries)?,
            moved,
            moved_bytes,
        })
    }

    /// What it holds in memory until written.
    fn held_bytes(&self) -> u64 {
        (self.block.len() + self.moved.len() * (SpanId::LEN + 24)) as u64
    }

    /// Writes the new block over the one read if that is still as read (its generation);
    /// false when someone else rewrote the block first (nothing is changed then).
    async fn update<B>(
        &self,
        conn: &mut <B::Db as Database>::Connection,
    ) -> Result<bool, StoreError>
    where
        B: Backend,
        for<'c> &'c mut <B::Db as Database>::Connection: Executor<'c, Database = B::Db>,
        <B::Db as Database>::Arguments: IntoArguments<B::Db>,
        Vec<u8>: for<'t> Encode<'t, B::Db> + Type<B::Db>,
        i64: for<'t> Encode<'t, B::Db> + Type<B::Db>,
        for<'r> (Vec<u8>,): FromRow<'r, <B::Db as Database>::Row>,
    {
        let Some(generation) = self.generation else {
            return Ok(false);
        };
        let mut q = QueryBuilder::<B::Db>::new("UPDATE trace_blocks SET start_unix_nano = ");
        q.push_bind(self.start_unix_nano)
            .push(", span_count = ")
            .push_bind(self.span_count)
            .push(", text_bytes = ")
            .push_bind(self.text_bytes)
            .push(", generation = ")
            .push_bind(generation + 1)
            .push(", block = ")
            .push_bind(self.block.clone());
        if B::PARTITIONED {
            q.push(format!(", healthy = {}", class_of("trace_blocks.trace_id")));
        }
        q.push(" WHERE trace_id = ")
            .push_bind(self.trace_id.clone())
            .push(" AND generation = ")
            .push_bind(generation)
            .push(" RETURNING trace_id");
        let written: Option<(Vec<u8>,)> = q.build_query_as().fetch_optional(&mut *conn).await?;
        Ok(written.is_some())
    }
}

/// Where blocks are partitioned (`partitions.rs`), each is in its trace's class: its
/// summary's, written before the trace was queued for compaction (none left, as retention
/// took it: a problem trace's, kept longer). The class of the trace `trace_id` names.
fn class_of(trace_id: &str) -> String {
    format!(
        "COALESCE((SELECT {HEALTHY} FROM trace_summaries s WHERE s.trace_id = {trace_id}), FALSE)"
    )
}

/// Inserts the first block of each of `rewrites` (traces that had none when read), except
/// where one was written meanwhile; returns the traces whose block it inserted.
async fn insert_first_blocks<B>(
    conn: &mut <B::Db as Database>::Connection,
    rewrites: &[&Rewrite],
) -> Result<HashSet<Vec<u8>>, StoreError>
where
    B: Backend,
    for<'c> &'c mut <B::Db as Database>::Connection: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    Vec<u8>: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    i64: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    for<'r> (Vec<u8>,): FromRow<'r, <B::Db as Database>::Row>,
{
    // Not `ON CONFLICT`: a partitioned table has no key by trace id alone; the compaction
    // lock keeps two writers from inserting at once.
    let (healthy_column, healthy) = if B::PARTITIONED {
        (", healthy", format!(", {}", class_of("v.column1")))
    } else {
        ("", String::new())
    };
    let mut q = QueryBuilder::<B::Db>::new(format!(
        "INSERT INTO trace_blocks (trace_id, start_unix_nano, span_count, text_bytes, \
         generation, block{healthy_column}) \
         SELECT v.column1, v.column2, v.column3, v.column4, 0, v.column5{healthy} FROM ("
    ));
    q.push_values(rewrites, |mut b, r| {
        b.push_bind(r.trace_id.clone())
            .push_bind(r.start_unix_nano)
            .push_bind(r.span_count)
            .push_bind(r.text_bytes)
            .push_bind(r.block.clone());
    });
    q.push(
        ") AS v WHERE NOT EXISTS (SELECT 1 FROM trace_blocks b WHERE b.trace_id = v.column1) \
         RETURNING trace_id",
    );
    let inserted: Vec<(Vec<u8>,)> = q.build_query_as().fetch_all(&mut *conn).await?;
    Ok(inserted.into_iter().map(|(id,)| id).collect())
}

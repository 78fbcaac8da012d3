//! An analysed trace's spans kept together as one compressed block (`trace_blocks`): the
//! shape columnar trace stores use. Ingest writes span rows; once the analyzer has
//! summarised a trace, `compaction.rs` moves its rows into the trace's block (merging any block
//! it had) and deletes exactly the rows it moved, so a span arriving meanwhile stays a row.
//! Every read of a trace's spans takes its block and its rows together (`spans.rs`).
//!
//! Architecture invariant: a block holds the rows' own text (`StoredRow`), column by
//! column, compressed with zstd; what a block and a row say of one span id never differs
//! in kind, and the block's copy wins (the first copy stored, as for rows).

use std::collections::{HashMap, HashSet};

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, QueryBuilder, Type};

use super::StoreError;
use super::backend::Backend;
use super::dictionary::Dictionaries;
use super::rows::StoredRow;
use super::summaries::push_list;
use crate::core::attr_json;
use crate::core::model::{SpanId, TraceId};

/// The most a compressed value may expand to: far above any block or summary, so a
/// damaged size field reads as damage instead of an allocation.
pub(crate) const MAX_EXPANDED: u64 = 1 << 30;

thread_local! {
    // One zstd context per thread, reused: making one per value cost more than the
    // (de)compression of a small block or summary (`budgetscope-bench query`, the hop page).
    static COMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Compressor<'static>>> =
        const { std::cell::RefCell::new(None) };
    static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// Compresses a value plainly: what `dictionary::Dictionaries` does until it has a dictionary.
pub(crate) fn compress(bytes: &[u8]) -> Result<Vec<u8>, StoreError> {
    let failed = |e: std::io::Error| {
        StoreError::Unavailable(format!("compressing for the store failed: {e}"))
    };
    COMPRESSOR.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.is_none() {
            *cell = Some(zstd::bulk::Compressor::new(LEVEL).map_err(failed)?);
        }
        let compressor = cell.as_mut().expect("set above");
        compressor.compress(bytes).map_err(failed)
    })
}

/// What `compress` compressed.
pub(crate) fn decompress(bytes: &[u8]) -> Result<Vec<u8>, StoreError> {
    let corrupt = |e: &dyn std::fmt::Display| StoreError::Corrupt(format!("compressed data: {e}"));
    let size = match zstd::zstd_safe::get_frame_content_size(bytes) {
        Ok(Some(size)) if size <= MAX_EXPANDED => size as usize,
        _ => return Err(corrupt(&"no valid frame size")),
    };
    DECOMPRESSOR.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.is_none() {
            *cell = Some(zstd::bulk::Decompressor::new().map_err(|e| corrupt(&e))?);
        }
        let decompressor = cell.as_mut().expect("set above");
        decompressor
            .decompress(bytes, size)
            .map_err(|e| corrupt(&e))
    })
}

/// The frame's layout version, its first byte before compression. Format 1 (still read)
/// kept each parent id whole and each budget as a double; format 2 names a parent held in
/// the same block by its place there, and leaves out a budget that its source attribute
/// holds exactly: the attributes already say it, and a double's low bytes do not compress
/// (BENCHMARKS.md, "Disk per span").
const FORMAT: u8 = 2;
const FORMAT_1: u8 = 1;

/// Budget tags of format 2: none, a double follows, or the number its source attribute
/// holds (`attribute_number`).
const BUDGET_NONE: u8 = 0;
const BUDGET_DOUBLE: u8 = 1;
const BUDGET_FROM_ATTRIBUTE: u8 = 2;

/// Parent tags of format 2: none, an id follows, or (`PARENT_AT` + i) the block's i-th span.
const PARENT_NONE: u64 = 0;
const PARENT_ID: u64 = 1;
const PARENT_AT: u64 = 2;

/// The number the attribute `key` of the attributes' JSON holds, or a string holding one:
/// what a budget read from that attribute says (`core::budget`), checked bit for bit
/// before a block leaves the budget out.
fn attribute_number(attributes: &str, key: &str) -> Option<f64> {
    match attr_json::value_of(attributes, key)? {
        serde_json::Value::Number(n) => n.as_f64(),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// zstd's level for values compressed without a dictionary (a store's first, kept as
/// samples to train one from), and for hop samples and summaries with one: its default.
pub(crate) const LEVEL: i32 = 3;

/// zstd's level for span blocks with a dictionary: compaction compresses each once, in the
/// time analysis leaves it, so smaller blocks are worth the slower compression
/// (BENCHMARKS.md, "Disk per span"). Hop samples and summaries keep `LEVEL`: the analysis
/// compresses them itself, and its time bounds the lag at a sustained load
/// (`budgetscope-bench sustained --rate 40000`).
pub(crate) const BLOCK_LEVEL: i32 = 9;

/// The text columns a frame holds, in order: service, name, status message, attributes,
/// resource, details.
const TEXT_COLUMNS: usize = 6;

/// Ids (of traces, or of a trace's moved spans) per statement: within both databases' parameter
/// limits.
pub(crate) const IDS_PER_STATEMENT: usize = 500;

/// One stored block as read: the trace, its generation (what a rewrite compares), the
/// text of its rows and the compressed frame.
#[derive(sqlx::FromRow)]
pub(crate) struct StoredBlock {
    pub trace_id: Vec<u8>,
    pub generation: i64,
    pub text_bytes: i64,
    pub block: Vec<u8>,
}

impl StoredBlock {
    /// The block's rows, in the order they were written (start, then span id).
    pub fn rows(&self, dictionaries: &Dictionaries) -> Result<Vec<StoredRow>, StoreError> {
        decode(&self.trace_id, &dictionaries.decompress(&self.block)?)
    }

    /// Each span's id and attribute text, without the rest of its row (attribute filters).
    pub fn attributes(
        &self,
        dictionaries: &Dictionaries,
    ) -> Result<Vec<(Vec<u8>, String)>, StoreError> {
        let frame = dictionaries.decompress(&self.block)?;
        let c = Columns::parse(&frame)?;
        Ok(c.span_ids
            .iter()
            .zip(&c.texts[3])
            .map(|(id, attributes)| (id.to_vec(), attributes.to_string()))
            .collect())
    }
}

/// The blocks of `traces` (at most a statement's worth of ids).
pub(crate) fn blocks_of<DB: Database>(traces: &[TraceId]) -> QueryBuilder<DB>
where
    Vec<u8>: for<'t> Encode<'t, DB> + Type<DB>,
{
    let mut q = QueryBuilder::new(
        "SELECT trace_id, generation, text_bytes, block FROM trace_blocks \
         WHERE trace_id IN ",
    );
    push_list(&mut q, traces.iter().map(|id| id.0.to_vec()));
    q
}

/// Reads the blocks of `traces` (any number), by trace id, with the dictionaries they were
/// compressed with.
pub(crate) async fn read_blocks<B>(
    backend: &B,
    dictionaries: &Dictionaries,
    traces: &[TraceId],
) -> Result<HashMap<Vec<u8>, StoredBlock>, StoreError>
where
    B: Backend,
    for<'c> &'c Pool<B::Db>: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    Vec<u8>: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    i64: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    for<'r> StoredBlock: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> (i64, Vec<u8>): FromRow<'r, <B::Db as Database>::Row>,
{
    let mut blocks = HashMap::new();
    for chunk in traces.chunks(IDS_PER_STATEMENT) {
        let mut q = blocks_of::<B::Db>(chunk);
        let rows: Vec<StoredBlock> = q.build_query_as().fetch_all(backend.reader()).await?;
        dictionaries
            .load_for(backend.reader(), rows.iter().map(|b| b.block.as_slice()))
            .await?;
        blocks.extend(rows.into_iter().map(|b| (b.trace_id.clone(), b)));
    }
    Ok(blocks)
}

/// A block's rows followed by the trace's rows whose span id the block does not hold.
pub(crate) fn merge(block: Vec<StoredRow>, rows: Vec<StoredRow>) -> Vec<StoredRow> {
    if block.is_empty() {
        return rows;
    }
    let held: HashSet<Vec<u8>> = block.iter().map(|r| r.span_id.clone()).collect();
    let mut merged = block;
    merged.extend(rows.into_iter().filter(|r| !held.contains(&r.span_id)));
    merged
}

/// The frame of `rows` (one trace's), compressed: column by column, so that like values
/// sit together (ids, then kinds, then starts as deltas, …, then each text column).
pub(crate) fn encode(
    rows: &[StoredRow],
    dictionaries: &Dictionaries,
) -> Result<Vec<u8>, StoreError> {
    let mut frame =
        Vec::with_capacity(rows.iter().map(StoredRow::text_bytes).sum::<u64>() as usize);
    frame.push(FORMAT);
    put_varint(&mut frame, rows.len() as u64);
    for row in rows {
        frame.extend_from_slice(&row.span_id);
    }
    let mut places: HashMap<&[u8], usize> = HashMap::with_capacity(rows.len());
    for (i, row) in rows.iter().enumerate() {
        places.entry(row.span_id.as_slice()).or_insert(i);
    }
    for row in rows {
        match row.parent_span_id.as_deref() {
            Some(parent) => match places.get(parent) {
                Some(&i) => put_varint(&mut frame, PARENT_AT + i as u64),
                None => {
                    put_varint(&mut frame, PARENT_ID);
                    frame.extend_from_slice(parent);
                }
            },
            None => put_varint(&mut frame, PARENT_NONE),
        }
    }
    for row in rows {
        put_signed(&mut frame, row.kind.into());
        put_signed(&mut frame, row.status_code.into());
    }
    let mut previous = 0i64;
    for row in rows {
        put_signed(&mut frame, row.start_unix_nano.wrapping_sub(previous));
        previous = row.start_unix_nano;
    }
    for row in rows {
        put_signed(
            &mut frame,
            row.end_unix_nano.wrapping_sub(row.start_unix_nano),
        );
    }
    for row in rows {
        match (row.budget_ms, row.budget_source.as_deref()) {
            (Some(ms), Some(source))
                if attribute_number(&row.attributes, source).map(f64::to_bits)
                    == Some(ms.to_bits()) =>
            {
                frame.push(BUDGET_FROM_ATTRIBUTE)
            }
            (Some(ms), _) => {
                frame.push(BUDGET_DOUBLE);
                frame.extend_from_slice(&ms.to_le_bytes());
            }
            (None, _) => frame.push(BUDGET_NONE),
        }
    }
    for row in rows {
        put_optional_text(&mut frame, row.budget_source.as_deref());
    }
    fn text_column(r: &StoredRow, column: usize) -> &str {
        match column {
            0 => &r.service,
            1 => &r.name,
            2 => &r.status_message,
            3 => &r.attributes,
            4 => &r.resource,
            _ => &r.details,
        }
    }
    for column in 0..TEXT_COLUMNS {
        for row in rows {
            put_text(&mut frame, text_column(row, column));
        }
    }
    dictionaries.compress(&frame)
}

/// A frame's columns, borrowed from it (`encode`'s layout).
struct Columns<'a> {
    span_ids: Vec<&'a [u8]>,
    parents: Vec<Option<&'a [u8]>>,
    kinds: Vec<(i16, i16)>,
    starts: Vec<i64>,
    ends: Vec<i64>,
    budgets: Vec<StoredBudget>,
    sources: Vec<Option<&'a str>>,
    texts: Vec<Vec<&'a str>>,
}

impl<'a> Columns<'a> {
    fn parse(frame: &'a [u8]) -> Result<Columns<'a>, StoreError> {
        let corrupt = |what: &str| StoreError::Corrupt(format!("span block: {what}"));
        let mut r = Reader { frame, at: 0 };
        let format = r.byte()?;
        if format != FORMAT && format != FORMAT_1 {
            return Err(corrupt("unknown format"));
        }
        let n = r.varint()? as usize;
        if n > frame.len() {
            return Err(corrupt("bad span count"));
        }
        let span_ids: Vec<&[u8]> = (0..n)
            .map(|_| r.bytes(SpanId::LEN))
            .collect::<Result<_, _>>()?;
        let parents = (0..n)
            .map(|_| match (format, r.varint()?) {
                (_, PARENT_NONE) => Ok(None),
                (FORMAT_1, _) | (_, PARENT_ID) => r.bytes(SpanId::LEN).map(Some),
                (_, at) => usize::try_from(at - PARENT_AT)
                    .ok()
                    .and_then(|i| span_ids.get(i))
                    .map(|id| Some(*id))
                    .ok_or_else(|| corrupt("parent outside the block")),
            })
            .collect::<Result<_, _>>()?;
        let kinds = (0..n)
            .map(|_| Ok((r.signed()? as i16, r.signed()? as i16)))
            .collect::<Result<_, StoreError>>()?;
        let mut previous = 0i64;
        let starts: Vec<i64> = (0..n)
            .map(|_| {
                previous = previous.wrapping_add(r.signed()?);
                Ok(previous)
            })
            .collect::<Result<_, StoreError>>()?;
        let ends = starts
            .iter()
            .map(|start| Ok(start.wrapping_add(r.signed()?)))
            .collect::<Result<_, StoreError>>()?;
        // A budget left out for its attribute is read once the attributes are.
        let budgets = (0..n)
            .map(|_| match (format, r.byte()?) {
                (_, BUDGET_NONE) => Ok(StoredBudget::Held(None)),
                (FORMAT_1, _) | (_, BUDGET_DOUBLE) => r.bytes(8).map(|b| {
                    StoredBudget::Held(Some(f64::from_le_bytes(b.try_into().expect("8 bytes"))))
                }),
                (_, BUDGET_FROM_ATTRIBUTE) => Ok(StoredBudget::InAttribute),
                _ => Err(corrupt("unknown budget tag")),
            })
            .collect::<Result<_, _>>()?;
        let sources: Vec<Option<&str>> = (0..n)
            .map(|_| r.optional_text())
            .collect::<Result<_, _>>()?;
        let mut texts = Vec::with_capacity(TEXT_COLUMNS);
        for _ in 0..TEXT_COLUMNS {
            texts.push((0..n).map(|_| r.text()).collect::<Result<Vec<_>, _>>()?);
        }
        if r.at != frame.len() {
            return Err(corrupt("trailing bytes"));
        }
        Ok(Columns {
            span_ids,
            parents,
            kinds,
            starts,
            ends,
            budgets,
            sources,
            texts,
        })
    }
}

/// A span's budget as a frame holds it: itself (or none), or left to its source attribute.
#[derive(Clone, Copy)]
enum StoredBudget {
    Held(Option<f64>),
    InAttribute,
}

impl Columns<'_> {
    /// The budget of the `i`-th span.
    fn budget(&self, i: usize) -> Result<Option<f64>, StoreError> {
        match self.budgets[i] {
            StoredBudget::Held(budget) => Ok(budget),
            StoredBudget::InAttribute => self.sources[i]
                .and_then(|source| attribute_number(self.texts[3][i], source))
                .map(Some)
                .ok_or_else(|| {
                    StoreError::Corrupt("span block: a budget its attribute does not hold".into())
                }),
        }
    }
}

/// The rows of a frame (`encode`'s, decompressed) of the trace `trace_id`.
fn decode(trace_id: &[u8], frame: &[u8]) -> Result<Vec<StoredRow>, StoreError> {
    let c = Columns::parse(frame)?;
    let text = |column: usize, i: usize| c.texts[column][i].to_string();
    (0..c.span_ids.len())
        .map(|i| {
            Ok(StoredRow {
                trace_id: trace_id.to_vec(),
                span_id: c.span_ids[i].to_vec(),
                parent_span_id: c.parents[i].map(<[u8]>::to_vec),
                service: text(0, i),
                name: text(1, i),
                kind: c.kinds[i].0,
                start_unix_nano: c.starts[i],
                end_unix_nano: c.ends[i],
                status_code: c.kinds[i].1,
                status_message: text(2, i),
                budget_ms: c.budget(i)?,
                budget_source: c.sources[i].map(str::to_string),
                attributes: text(3, i),
                resource: text(4, i),
                details: text(5, i),
            })
        })
        .collect()
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_signed(out: &mut Vec<u8>, value: i64) {
    put_varint(out, ((value << 1) ^ (value >> 63)) as u64);
}

pub(crate) fn put_text(out: &mut Vec<u8>, text: &str) {
    put_varint(out, text.len() as u64);
    out.extend_from_slice(text.as_bytes());
}

pub(crate) fn put_optional_text(out: &mut Vec<u8>, text: Option<&str>) {
    match text {
        Some(text) => {
            out.push(1);
            put_text(out, text);
        }
        None => out.push(0),
    }
}

pub(crate) struct Reader<'a> {
    frame: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(frame: &'a [u8]) -> Reader<'a> {
        Reader { frame, at: 0 }
    }

    fn bytes(&mut self, n: usize) -> Result<&'a [u8], StoreError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|end| *end <= self.frame.len());
        let Some(end) = end else {
            return Err(StoreError::Corrupt("span block: truncated".into()));
        };
        let bytes = &self.frame[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    pub(crate) fn byte(&mut self) -> Result<u8, StoreError> {
        Ok(self.bytes(1)?[0])
    }

    fn varint(&mut self) -> Result<u64, StoreError> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.byte()?;
            value |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Ok(value);
            }
        }
        Err(StoreError::Corrupt("span block: bad number".into()))
    }

    fn signed(&mut self) -> Result<i64, StoreError> {
        let value = self.varint()?;
        Ok(((value >> 1) as i64) ^ -((value & 1) as i64))
    }

    pub(crate) fn text(&mut self) -> Result<&'a str, StoreError> {
        let len = self.varint()?;
        let len = usize::try_from(len)
            .map_err(|_| StoreError::Corrupt("span block: bad length".into()))?;
        std::str::from_utf8(self.bytes(len)?)
            .map_err(|e| StoreError::Corrupt(format!("span block: {e}")))
    }

    pub(crate) fn optional_text(&mut self) -> Result<Option<&'a str>, StoreError> {
        match self.byte()? {
            0 => Ok(None),
            _ => self.text().map(Some),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(span: u8, start: i64) -> StoredRow {
        StoredRow {
            trace_id: vec![7; 16],
            span_id: vec![span; 8],
            parent_span_id: (span > 1).then(|| vec![1; 8]),
            service: "edge".into(),
            name: format!("GET /{span}"),
            kind: 2,
            start_unix_nano: start,
            end_unix_nano: start + 5_000,
            status_code: i16::from(span % 3),
            status_message: if span == 2 {
                "boom".into()
            } else {
                String::new()
            },
            budget_ms: (span % 2 == 0).then_some(250.5),
            budget_source: (span % 2 == 0).then(|| "grpc-timeout".into()),
            attributes: format!("{{\"n\":{span},\"text\":\"é\"}}"),
            resource: "{\"service.name\":\"edge\"}".into(),
            details: "{}".into(),
        }
    }

    fn same(a: &StoredRow, b: &StoredRow) -> bool {
        let ids = |r: &StoredRow| {
            (
                r.trace_id.clone(),
                r.span_id.clone(),
                r.parent_span_id.clone(),
            )
        };
        let numbers = |r: &StoredRow| {
            (
                r.kind,
                r.start_unix_nano,
                r.end_unix_nano,
                r.status_code,
                r.budget_ms,
            )
        };
        let texts = |r: &StoredRow| {
            (
                r.service.clone(),
                r.name.clone(),
                r.status_message.clone(),
                r.budget_source.clone(),
                r.attributes.clone(),
                r.resource.clone(),
                r.details.clone(),
            )
        };
        ids(a) == ids(b) && numbers(a) == numbers(b) && texts(a) == texts(b)
    }

    #[test]
    fn a_block_gives_back_every_field_of_every_row() {
        // Starts out of order and at the extremes: deltas may be negative or wrap.
        let rows = vec![
            row(1, 1_000),
            row(2, 500),
            row(3, i64::MAX - 10_000),
            row(4, 0),
        ];
        let dictionaries = Dictionaries::new("blocks", BLOCK_LEVEL);
        let block = encode(&rows, &dictionaries).unwrap();
        let stored = StoredBlock {
            trace_id: vec![7; 16],
            generation: 0,
            text_bytes: rows.iter().map(StoredRow::text_bytes).sum::<u64>() as i64,
            block,
        };
        let back = stored.rows(&dictionaries).unwrap();
        assert_eq!(back.len(), rows.len());
        for (a, b) in rows.iter().zip(&back) {
            assert!(same(a, b), "row {:?} came back changed", a.span_id);
        }
        let attributes: Vec<(Vec<u8>, String)> = rows
            .iter()
            .map(|r| (r.span_id.clone(), r.attributes.clone()))
            .collect();
        assert_eq!(stored.attributes(&dictionaries).unwrap(), attributes);
    }

    #[test]
    fn a_damaged_block_is_an_error_not_a_panic() {
        let rows = vec![row(1, 1_000), row(2, 2_000)];
        let dictionaries = Dictionaries::new("blocks", BLOCK_LEVEL);
        let frame_of = |rows: &[StoredRow]| {
            zstd::bulk::decompress(&encode(rows, &dictionaries).unwrap(), 1 << 20).unwrap()
        };
        let frame = frame_of(&rows);
        for cut in 0..frame.len() {
            assert!(decode(&[7; 16], &frame[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = frame.clone();
        longer.push(0);
        assert!(decode(&[7; 16], &longer).is_err());
        let mut unknown = frame;
        unknown[0] = 99;
        assert!(decode(&[7; 16], &unknown).is_err());
        let garbage = StoredBlock {
            trace_id: vec![7; 16],
            generation: 0,
            text_bytes: 10,
            block: vec![1, 2, 3, 4],
        };
        assert!(matches!(
            garbage.rows(&dictionaries),
            Err(StoreError::Corrupt(_))
        ));
    }

    #[test]
    fn a_block_leaves_out_a_budget_its_attribute_holds_and_a_parent_it_holds() {
        let mut rows = vec![row(1, 1_000), row(2, 1_500), row(3, 2_000), row(4, 2_500)];
        // The budget its attribute holds as a number, as a string, and one it does not.
        rows[0].budget_ms = Some(1964.0469401028433);
        rows[0].budget_source = Some("deadline.remaining_ms".into());
        rows[0].attributes = r#"{"a":1,"deadline.remaining_ms":1964.0469401028433}"#.into();
        rows[1].budget_ms = Some(842.0);
        rows[1].budget_source = Some("x-budget".into());
        rows[1].attributes = r#"{"x-budget":" 842 "}"#.into();
        rows[2].budget_ms = Some(100.0);
        rows[2].budget_source = Some("deadline.remaining_ms".into());
        rows[2].attributes =
            r#"{"deadline.remaining_ms":100.0,"deadline.remaining_ms":99.5}"#.into();
        // A parent outside the block, and one inside it that comes later.
        rows[1].parent_span_id = Some(vec![9; 8]);
        rows[0].parent_span_id = Some(rows[3].span_id.clone());
        let dictionaries = Dictionaries::new("blocks", BLOCK_LEVEL);
        let block = encode(&rows, &dictionaries).unwrap();
        let frame = zstd::bulk::decompress(&block, 1 << 20).unwrap();
        assert_eq!(frame[0], FORMAT);
        let back = decode(&[7; 16], &frame).unwrap();
        for (a, b) in rows.iter().zip(&back) {
            assert!(same(a, b), "row {:?} came back changed", a.span_id);
        }
        // Only the budget its attribute does not hold, and row 4's, are kept as doubles,
        // and only the parent outside the block as an id.
        let doubles = [100.0f64, 250.5]
            .iter()
            .filter(|ms| frame.windows(8).any(|w| w == ms.to_le_bytes()))
            .count();
        assert_eq!(doubles, 2);
        assert!(
            !frame
                .windows(8)
                .any(|w| w == 1964.0469401028433f64.to_le_bytes())
        );
        assert_eq!(
            frame.windows(8).filter(|w| *w == [1; 8]).count(),
            1,
            "row 1's own id"
        );
    }

    #[test]
    fn a_format_1_block_still_reads() {
        // `encode` of `[row(1, 1_000), row(2, 500)]` before format 2, uncompressed.
        let hex = "0102010101010101010102020202020202020001010101010101010104020404d00fe707904e\
                   904e00010000000000506f4000010c677270632d74696d656f75740465646765046564676506\
                   474554202f3106474554202f320004626f6f6d137b226e223a312c2274657874223a22c3a922\
                   7d137b226e223a322c2274657874223a22c3a9227d177b22736572766963652e6e616d65223a\
                   2265646765227d177b22736572766963652e6e616d65223a2265646765227d027b7d027b7d";
        let frame: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        let back = decode(&[7; 16], &frame).unwrap();
        let rows = [row(1, 1_000), row(2, 500)];
        assert_eq!(back.len(), 2);
        for (a, b) in rows.iter().zip(&back) {
            assert!(same(a, b), "row {:?} came back changed", a.span_id);
        }
    }

    #[test]
    fn a_block_naming_what_it_does_not_hold_is_an_error() {
        let mut rows = vec![row(1, 1_000), row(2, 2_000)];
        rows[0].budget_ms = Some(5.0);
        rows[0].budget_source = Some("b".into());
        rows[0].attributes = r#"{"b":5}"#.into();
        let dictionaries = Dictionaries::new("blocks", BLOCK_LEVEL);
        let frame =
            zstd::bulk::decompress(&encode(&rows, &dictionaries).unwrap(), 1 << 20).unwrap();
        assert!(decode(&[7; 16], &frame).is_ok());
        // Row 2's parent (row 1, at place 0) moved past the block's end.
        let at = 1 + 1 + 2 * SpanId::LEN;
        assert_eq!(&frame[at..at + 2], [0, PARENT_AT as u8]);
        let mut outside = frame.clone();
        outside[at + 1] = (PARENT_AT + 2) as u8;
        assert!(matches!(
            decode(&[7; 16], &outside),
            Err(StoreError::Corrupt(_))
        ));
        // The attribute the budget was left out for no longer holds it.
        let text = br#"{"b":5}"#;
        let place = frame.windows(text.len()).position(|w| w == text).unwrap();
        let mut other = frame;
        other[place + 5] = b'6';
        assert!(
            decode(&[7; 16], &other).is_ok(),
            "another number is still a number"
        );
        other[place + 5] = b'x';
        assert!(matches!(
            decode(&[7; 16], &other),
            Err(StoreError::Corrupt(_))
        ));
    }

    #[test]
    fn a_block_keeps_the_first_copy_of_a_span() {
        let mut again = row(2, 500);
        again.name = "a later copy".into();
        let merged = merge(vec![row(1, 1_000), row(2, 500)], vec![again, row(3, 700)]);
        let names: Vec<&str> = merged.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["GET /1", "GET /2", "GET /3"]);
    }
}

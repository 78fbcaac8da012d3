//! The per-trace reads of a trace kept as a block (`blocks.rs`), worked out in Rust over
//! its rows as they stream by: the outline, a page of the span list, its counts. A trace
//! without a block gets the same answers from the database's SQL (`spans.rs`); the
//! conformance suite holds the two together.

use std::collections::BTreeSet;

use super::StoreError;
use super::query::{OUTLINE_NAMES, SpanPosition, TraceOutline};
use super::rows::StoredRow;
use crate::core::analyze::Role;
use crate::core::model::{SpanId, TraceId};

/// A row's place in its trace's start order.
pub(crate) fn position(row: &StoredRow) -> SpanPosition {
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
pub(crate) struct Find {
    text: Option<String>,
    id: Option<SpanId>,
}

impl Find {
    pub(crate) fn new(find: Option<&str>) -> Find {
        let find = find.map(str::trim).filter(|f| !f.is_empty());
        Find {
            text: find.map(str::to_lowercase),
            id: find.and_then(|f| SpanId::from_hex(f).ok()),
        }
    }

    pub(crate) fn matches(&self, row: &StoredRow) -> bool {
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
pub(crate) struct Ranked {
    pub(crate) at: SpanPosition,
    backwards: bool,
    pub(crate) row: StoredRow,
}

impl Ranked {
    pub(crate) fn new(at: SpanPosition, row: StoredRow, backwards: bool) -> Ranked {
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
pub(crate) struct OutlineScan {
    spans: u64,
    start: Option<i64>,
    end: Option<i64>,
    /// The first span without a parent (else the first span): its key and what is kept.
    root: Option<((bool, i64, Vec<u8>), (String, String, Option<f64>))>,
    services: BTreeSet<String>,
    operations: BTreeSet<(String, String)>,
}

impl OutlineScan {
    pub(crate) fn add(&mut self, row: StoredRow) -> Result<(), StoreError> {
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

    pub(crate) fn finish(self, trace_id: TraceId) -> Option<TraceOutline> {
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
fn keep_first<T: Ord>(set: &mut BTreeSet<T>, value: T) {
    set.insert(value);
    if set.len() > OUTLINE_NAMES as usize {
        set.pop_last();
    }
}

//! Hop rollups as rows, shared by both stores: decoding, and the deltas a batch of
//! (re-)analysed traces makes to them.

use std::collections::BTreeMap;

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, QueryBuilder, Type};

use super::StoreError;
use crate::analyze::hops::{COUNTED, Histogram, HopSample, Rollup, minute_of};
use crate::analyze::summary::TraceSummary;

/// Nanoseconds in an hour: the hourly table's key is the minute key rounded down to it.
const HOUR_NANOS: u64 = 3_600_000_000_000;

/// One hop identity's rollup for one minute.
#[derive(Debug, Clone, PartialEq)]
pub struct HopRollupRow {
    pub service: String,
    pub operation: String,
    pub minute_unix_nano: u64,
    pub rollup: Rollup,
}

/// (service, operation, minute).
pub type RollupKey = (String, String, u64);

pub(crate) const TRACE_HOP_COLUMNS: &str =
    "service, operation, start_unix_nano, budget_ms, burn, self_ms, counts, wasted_ms";

pub(crate) const ROLLUP_COLUMNS: &str = "service, operation, minute_unix_nano, requests, inherited_exceed, \
     local_exceed, overspent, inflated, dropped, doomed, refused, retry, origin, wasted_ms, budget_hist, burn_hist, self_hist";

/// The conflict clause of both backends' rollup upserts.
pub(crate) const ROLLUP_UPSERT: &str = " ON CONFLICT (service, operation, minute_unix_nano) DO UPDATE SET \
     requests = excluded.requests, inherited_exceed = excluded.inherited_exceed, \
     local_exceed = excluded.local_exceed, overspent = excluded.overspent, inflated = excluded.inflated, \
     dropped = excluded.dropped, doomed = excluded.doomed, refused = excluded.refused, \
     retry = excluded.retry, origin = excluded.origin, wasted_ms = excluded.wasted_ms, budget_hist = excluded.budget_hist, \
     burn_hist = excluded.burn_hist, self_hist = excluded.self_hist";

pub(crate) fn encode_counts(counts: &[i64; COUNTED.len()]) -> String {
    counts
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

#[derive(sqlx::FromRow)]
pub(crate) struct StoredTraceHop {
    pub service: String,
    pub operation: String,
    pub start_unix_nano: i64,
    pub budget_ms: Option<f64>,
    pub burn: Option<f64>,
    pub self_ms: f64,
    pub counts: String,
    pub wasted_ms: f64,
}

impl StoredTraceHop {
    pub fn decode(self) -> HopSample {
        let mut counts = [0; COUNTED.len()];
        for (slot, value) in counts.iter_mut().zip(self.counts.split(',')) {
            *slot = value.parse().unwrap_or(0);
        }
        HopSample {
            service: self.service,
            operation: self.operation,
            start_unix_nano: self.start_unix_nano.max(0) as u64,
            budget_ms: self.budget_ms,
            burn: self.burn,
            self_ms: self.self_ms,
            counts,
            wasted_ms: self.wasted_ms,
        }
    }
}

#[derive(sqlx::FromRow)]
pub(crate) struct StoredRollup {
    pub service: String,
    pub operation: String,
    pub minute_unix_nano: i64,
    pub requests: i64,
    pub inherited_exceed: i64,
    pub local_exceed: i64,
    pub overspent: i64,
    pub inflated: i64,
    pub dropped: i64,
    pub doomed: i64,
    pub refused: i64,
    pub retry: i64,
    pub origin: i64,
    pub wasted_ms: f64,
    pub budget_hist: String,
    pub burn_hist: String,
    pub self_hist: String,
}

impl StoredRollup {
    pub fn decode(self) -> HopRollupRow {
        HopRollupRow {
            service: self.service,
            operation: self.operation,
            minute_unix_nano: self.minute_unix_nano.max(0) as u64,
            rollup: Rollup {
                requests: self.requests,
                counts: [
                    self.inherited_exceed,
                    self.local_exceed,
                    self.overspent,
                    self.inflated,
                    self.dropped,
                    self.doomed,
                    self.refused,
                    self.retry,
                    self.origin,
                ],
                wasted_ms: self.wasted_ms,
                budget: Histogram::decode(&self.budget_hist),
                burn: Histogram::decode(&self.burn_hist),
                self_ms: Histogram::decode(&self.self_hist),
            },
        }
    }
}

/// The insert of trace hops (trace id, hop), one statement for all of `hops`.
pub(crate) fn trace_hops_insert<DB: Database>(hops: &[(&[u8], &HopSample)]) -> QueryBuilder<DB>
where
    Vec<u8>: for<'t> Encode<'t, DB> + Type<DB>,
    String: for<'t> Encode<'t, DB> + Type<DB>,
    i64: for<'t> Encode<'t, DB> + Type<DB>,
    f64: for<'t> Encode<'t, DB> + Type<DB>,
    Option<f64>: for<'t> Encode<'t, DB> + Type<DB>,
{
    let mut insert: QueryBuilder<DB> = QueryBuilder::new(format!(
        "INSERT INTO trace_hops (trace_id, {TRACE_HOP_COLUMNS}) "
    ));
    insert.push_values(hops, |mut b, (id, hop)| {
        b.push_bind(id.to_vec())
            .push_bind(hop.service.clone())
            .push_bind(hop.operation.clone())
            .push_bind(i64::try_from(hop.start_unix_nano).unwrap_or(i64::MAX))
            .push_bind(hop.budget_ms)
            .push_bind(hop.burn)
            .push_bind(hop.self_ms)
            .push_bind(encode_counts(&hop.counts))
            .push_bind(hop.wasted_ms);
    });
    insert
}

/// Each hop of each analysed trace with its trace id, the rows for `trace_hops`; their
/// samples are added to `deltas`.
pub(crate) fn new_hops<'a>(
    traces: &'a [(TraceSummary, Vec<HopSample>)],
    deltas: &mut BTreeMap<RollupKey, Rollup>,
) -> Vec<(&'a [u8], &'a HopSample)> {
    for (_, hops) in traces {
        add_samples(deltas, hops, 1);
    }
    traces
        .iter()
        .flat_map(|(summary, hops)| {
            hops.iter()
                .map(move |hop| (summary.trace_id.0.as_slice(), hop))
        })
        .collect()
}

/// Adds samples (weight +1) or takes them back out (−1) of per-key deltas.
pub(crate) fn add_samples(
    deltas: &mut BTreeMap<RollupKey, Rollup>,
    samples: &[HopSample],
    weight: i64,
) {
    for sample in samples {
        let key = (
            sample.service.clone(),
            sample.operation.clone(),
            minute_of(sample.start_unix_nano),
        );
        deltas.entry(key).or_default().add(sample, weight);
    }
}

/// Merges deltas into the existing rows of their keys: rows that still count requests (to
/// upsert) and keys whose rollup fell to zero (to delete).
pub(crate) fn apply_deltas(
    existing: Vec<StoredRollup>,
    deltas: &[(RollupKey, Rollup)],
) -> (Vec<HopRollupRow>, Vec<RollupKey>) {
    let mut current: BTreeMap<RollupKey, Rollup> = existing
        .into_iter()
        .map(StoredRollup::decode)
        .map(|row| {
            (
                (row.service, row.operation, row.minute_unix_nano),
                row.rollup,
            )
        })
        .collect();
    let (mut keep, mut gone) = (Vec::new(), Vec::new());
    for (key, delta) in deltas {
        let mut rollup = current.remove(key).unwrap_or_default();
        rollup.merge(delta);
        if rollup.requests <= 0 {
            gone.push(key.clone());
        } else {
            keep.push(HopRollupRow {
                service: key.0.clone(),
                operation: key.1.clone(),
                minute_unix_nano: key.2,
                rollup,
            });
        }
    }
    (keep, gone)
}

/// Per-minute deltas folded into the hours that hold them, for `hop_rollups_hourly`.
pub(crate) fn hourly(minutes: &[(RollupKey, Rollup)]) -> Vec<(RollupKey, Rollup)> {
    let mut hours: BTreeMap<RollupKey, Rollup> = BTreeMap::new();
    for ((service, operation, minute), delta) in minutes {
        hours
            .entry((
                service.clone(),
                operation.clone(),
                minute - minute % HOUR_NANOS,
            ))
            .or_default()
            .merge(delta);
    }
    hours.into_iter().collect()
}

/// Adds deltas to a rollup table (`hop_rollups` per minute or `hop_rollups_hourly`), in
/// chunks of `chunk` keys: reads the rows of the keys (with `lock`, e.g. Postgres's
/// `FOR UPDATE` in key order, appended to the read), merges, deletes rows that fell to zero
/// requests and upserts the rest. Only the chunk size and the lock differ between stores.
pub(crate) async fn apply_rollups<DB: Database>(
    conn: &mut DB::Connection,
    table: &str,
    deltas: &[(RollupKey, Rollup)],
    chunk: usize,
    lock: &str,
) -> Result<(), StoreError>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'r> StoredRollup: FromRow<'r, DB::Row>,
    String: for<'t> Encode<'t, DB> + Type<DB>,
    i64: for<'t> Encode<'t, DB> + Type<DB>,
    f64: for<'t> Encode<'t, DB> + Type<DB>,
{
    fn keys<DB: Database>(q: &mut QueryBuilder<DB>, keys: &[&RollupKey])
    where
        String: for<'t> Encode<'t, DB> + Type<DB>,
        i64: for<'t> Encode<'t, DB> + Type<DB>,
    {
        q.push_values(keys, |mut b, (service, operation, minute)| {
            b.push_bind(service.clone())
                .push_bind(operation.clone())
                .push_bind(i64::try_from(*minute).unwrap_or(i64::MAX));
        });
    }
    for chunk in deltas.chunks(chunk) {
        let mut select: QueryBuilder<DB> = QueryBuilder::new(format!(
            "SELECT {ROLLUP_COLUMNS} FROM {table} WHERE (service, operation, minute_unix_nano) IN ("
        ));
        keys(
            &mut select,
            &chunk.iter().map(|(key, _)| key).collect::<Vec<_>>(),
        );
        select.push(")").push(lock);
        let existing: Vec<StoredRollup> = select.build_query_as().fetch_all(&mut *conn).await?;
        let (keep, gone) = apply_deltas(existing, chunk);
        if !gone.is_empty() {
            let mut delete: QueryBuilder<DB> = QueryBuilder::new(format!(
                "DELETE FROM {table} WHERE (service, operation, minute_unix_nano) IN ("
            ));
            keys(&mut delete, &gone.iter().collect::<Vec<_>>());
            delete.push(")");
            delete.build().execute(&mut *conn).await?;
        }
        if !keep.is_empty() {
            let mut upsert: QueryBuilder<DB> =
                QueryBuilder::new(format!("INSERT INTO {table} ({ROLLUP_COLUMNS}) "));
            upsert.push_values(&keep, |mut b, row| {
                b.push_bind(row.service.clone())
                    .push_bind(row.operation.clone())
                    .push_bind(i64::try_from(row.minute_unix_nano).unwrap_or(i64::MAX))
                    .push_bind(row.rollup.requests);
                for count in row.rollup.counts {
                    b.push_bind(count);
                }
                b.push_bind(row.rollup.wasted_ms)
                    .push_bind(row.rollup.budget.encode())
                    .push_bind(row.rollup.burn.encode())
                    .push_bind(row.rollup.self_ms.encode());
            });
            upsert.push(ROLLUP_UPSERT);
            upsert.build().execute(&mut *conn).await?;
        }
    }
    Ok(())
}

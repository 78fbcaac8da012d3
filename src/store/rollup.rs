//! Per-hop statistics for both databases (`RollupStore`): hop rollups as rows (decoding,
//! the deltas a batch of (re-)analysed traces makes to them, whole hours read from the
//! hourly table) and the deadline metrics (`reported.rs`).

use std::collections::BTreeMap;

use async_trait::async_trait;
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, QueryBuilder, Type};

use super::backend::{Backend, SqlStore, Writer as _};
use super::dictionary::Dictionaries;
use super::edges::{StoredEdge, edge_query};
use super::query::{MetricsQuery, RollupQuery, rollup_query};
use super::reported::{StoredReported, add_reported, reported_query};
use super::{RollupStore, StoreError};
use crate::core::analyze::Flag;
use crate::core::analyze::advice_stats::{AdviceRollup, AdviceSample, RequestShape};
use crate::core::analyze::edges::{EdgeKey, EdgeRollup, EdgeSample};
use crate::core::analyze::histogram::Histogram;
use crate::core::analyze::hops::{
    CriticalCounts, CriticalSample, HopRollupRow, HopSample, ReportedRow, Rollup, RollupKey,
    SpentArrival, minute_of,
};

/// Nanoseconds in an hour: the hourly table's key is the minute key rounded down to it.
pub(crate) const HOUR_NANOS: u64 = 3_600_000_000_000;

pub(crate) const ROLLUP_COLUMNS: &str = "service, operation, minute_unix_nano, requests, inherited_exceed, \
     local_exceed, overspent, inflated, dropped, doomed, refused, retry, origin, wasted_ms, budget_hist, burn_hist, self_hist, \
     critical_ms, exceeded_requests, critical_exceeded, dominant_exceeded, advice";

/// The conflict clause of both backends' rollup upserts.
pub(crate) const ROLLUP_UPSERT: &str = " ON CONFLICT (service, operation, minute_unix_nano) DO UPDATE SET \
     requests = excluded.requests, inherited_exceed = excluded.inherited_exceed, \
     local_exceed = excluded.local_exceed, overspent = excluded.overspent, inflated = excluded.inflated, \
     dropped = excluded.dropped, doomed = excluded.doomed, refused = excluded.refused, \
     retry = excluded.retry, origin = excluded.origin, wasted_ms = excluded.wasted_ms, budget_hist = excluded.budget_hist, \
     burn_hist = excluded.burn_hist, self_hist = excluded.self_hist, critical_ms = excluded.critical_ms, \
     exceeded_requests = excluded.exceeded_requests, critical_exceeded = excluded.critical_exceeded, \
     dominant_exceeded = excluded.dominant_exceeded, advice = excluded.advice";

#[async_trait]
impl<B> RollupStore for SqlStore<B>
where
    B: Backend,
    for<'c> &'c mut <B::Db as Database>::Connection: Executor<'c, Database = B::Db>,
    for<'c> &'c Pool<B::Db>: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    String: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    i64: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    f64: for<'t> Encode<'t, B::Db> + Type<B::Db>,
    for<'r> StoredRollup: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> StoredReported: FromRow<'r, <B::Db as Database>::Row>,
    for<'r> StoredEdge: FromRow<'r, <B::Db as Database>::Row>,
{
    async fn hop_rollups(&self, query: &RollupQuery<'_>) -> Result<Vec<HopRollupRow>, StoreError> {
        let mut rows = Vec::new();
        for (hourly, since, until) in
            rollup_ranges(query.since_unix_nano, query.until_unix_nano, query.hourly)
        {
            let table = if hourly {
                "hop_rollups_hourly"
            } else {
                "hop_rollups"
            };
            let mut q = rollup_query::<B::Db>(table, since, until, query.service, query.operation);
            let found: Vec<StoredRollup> =
                q.build_query_as().fetch_all(self.backend.reader()).await?;
            rows.extend(found.into_iter().map(StoredRollup::decode));
        }
        Ok(rows)
    }

    async fn edge_rollups(
        &self,
        query: &RollupQuery<'_>,
    ) -> Result<Vec<(EdgeKey, EdgeRollup)>, StoreError> {
        // Each edge over the whole range: the hourly and minute parts summed.
        let mut rows: BTreeMap<(String, String, String, String), EdgeRollup> = BTreeMap::new();
        for (hourly, since, until) in
            rollup_ranges(query.since_unix_nano, query.until_unix_nano, query.hourly)
        {
            let table = if hourly {
                "edge_rollups_hourly"
            } else {
                "edge_rollups"
            };
            let mut q = edge_query::<B::Db>(table, since, until, query.service, B::JOIN_TEXT);
            let found: Vec<StoredEdge> =
                q.build_query_as().fetch_all(self.backend.reader()).await?;
            for (key, edge) in found.into_iter().map(StoredEdge::decode) {
                let (a, b, c, d, _) = key;
                rows.entry((a, b, c, d))
                    .or_insert_with(EdgeRollup::default)
                    .merge(&edge);
            }
        }
        Ok(rows
            .into_iter()
            .map(|((a, b, c, d), edge)| ((a, b, c, d, query.since_unix_nano), edge))
            .collect())
    }

    async fn add_reported(&self, rows: &[ReportedRow]) -> Result<(), StoreError> {
        let mut writer = self.backend.writer().await?;
        let mut tx = sqlx::Connection::begin(&mut *writer).await?;
        add_reported::<B::Db>(&mut tx, rows).await?;
        tx.commit().await?;
        writer.done();
        Ok(())
    }

    async fn reported(&self, query: &MetricsQuery<'_>) -> Result<Vec<ReportedRow>, StoreError> {
        let mut q = reported_query::<B::Db>(query);
        let found: Vec<StoredReported> =
            q.build_query_as().fetch_all(self.backend.reader()).await?;
        let range_start = (!query.per_minute).then_some(query.since_unix_nano);
        Ok(found
            .into_iter()
            .map(|row| row.decode(range_start))
            .collect())
    }
}

/// Splits `[since, until)` into the ranges to read from a rollup table and its hourly
/// form (true): whole hours from the hourly table, the edges per minute.
pub(crate) fn rollup_ranges(since: u64, until: u64, hourly: bool) -> Vec<(bool, u64, u64)> {
    let first_hour = since.div_ceil(HOUR_NANOS) * HOUR_NANOS;
    let last_hour = until - until % HOUR_NANOS;
    if !hourly || first_hour >= last_hour {
        return vec![(false, since, until)];
    }
    let mut ranges = vec![(true, first_hour, last_hour)];
    if since < first_hour {
        ranges.push((false, since, first_hour));
    }
    if last_hour < until {
        ranges.push((false, last_hour, until));
    }
    ranges
}

/// Counts as stored: "1,0,2", in their array's order.
pub(crate) fn encode_counts(counts: &[i64]) -> String {
    counts
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// What `encode_counts` wrote; missing or malformed counts read as 0.
pub(crate) fn decode_counts<const N: usize>(text: &str) -> [i64; N] {
    let mut counts = [0; N];
    for (slot, value) in counts.iter_mut().zip(text.split(',')) {
        *slot = value.parse().unwrap_or(0);
    }
    counts
}

/// One hop sample as its trace's summary keeps it (the `hops` column, a JSON array of
/// these): service, operation, start, budget, burn, self time, counts ("1,0,…" in the
/// order of `COUNTED`), wasted ms, every flag it owns ("inflated:1,retry:2"), and when it
/// arrived already spent, "caller service TAB caller operation TAB origin service TAB
/// origin operation" (the origin empty when there is none), and its part in the critical
/// path: [ms, exceeded, on the path, critical hop], and its calls, one per callee: [callee
/// service, callee operation, calls, counts in `EDGE_COUNTED` order, then the forwarded,
/// left, latency and shortfall histograms]. Samples stored before the last four existed
/// read as having none; the re-analysis after an upgrade fills them in.
#[derive(serde::Serialize, serde::Deserialize)]
struct StoredHop(
    String,
    String,
    i64,
    Option<f64>,
    Option<f64>,
    Option<f64>,
    String,
    Option<f64>,
    #[serde(default)] String,
    #[serde(default)] Option<String>,
    #[serde(default)] Option<(f64, bool, bool, bool)>,
    #[serde(default)] Vec<(String, String, i64, String, String, String, String, String)>,
    #[serde(default)] Option<StoredAdvice>,
);

/// A hop sample's `AdviceSample`: exceeded, inflating, tail, kept, short reserve, and at
/// the edge hop (need, clean exceeded, reached, layers).
type StoredAdvice = (
    bool,
    bool,
    Option<f64>,
    Option<f64>,
    bool,
    Option<(Option<f64>, bool, u32, u32)>,
);

/// A trace's hop samples for its summary's `hops` column, so that re-analysing the trace
/// (a late span) can take its old contribution to the rollups back out.
pub(crate) fn encode_hops(hops: &[HopSample]) -> String {
    let stored: Vec<StoredHop> = hops
        .iter()
        .map(|hop| {
            StoredHop(
                hop.service.clone(),
                hop.operation.clone(),
                i64::try_from(hop.start_unix_nano).unwrap_or(i64::MAX),
                hop.budget_ms,
                hop.burn,
                Some(hop.self_ms),
                encode_counts(&hop.counts),
                Some(hop.wasted_ms),
                hop.flags
                    .iter()
                    .map(|(flag, n)| format!("{}:{n}", flag.as_str()))
                    .collect::<Vec<_>>()
                    .join(","),
                hop.spent.as_ref().map(|spent| {
                    let (origin_service, origin_operation) =
                        spent.origin.clone().unwrap_or_default();
                    [
                        spent.caller.0.as_str(),
                        &spent.caller.1,
                        &origin_service,
                        &origin_operation,
                    ]
                    .join("\t")
                }),
                Some((
                    hop.critical.ms,
                    hop.critical.exceeded,
                    hop.critical.on_path,
                    hop.critical.dominant,
                )),
                hop.calls
                    .iter()
                    .map(|edge| {
                        (
                            edge.callee_service.clone(),
                            edge.callee_operation.clone(),
                            edge.stats.calls,
                            encode_counts(&edge.stats.counts),
                            edge.stats.forwarded.encode(),
                            edge.stats.left.encode(),
                            edge.stats.latency.encode(),
                            edge.stats.shortfall.encode(),
                        )
                    })
                    .collect(),
                Some((
                    hop.advice.exceeded,
                    hop.advice.inflating,
                    hop.advice.tail_ms,
                    hop.advice.kept_ms,
                    hop.advice.short_reserve,
                    hop.advice
                        .request
                        .map(|r| (r.need_ms, r.clean_exceeded, r.reached, r.layers)),
                )),
            )
        })
        .collect();
    serde_json::to_string(&stored).unwrap_or_else(|_| "[]".into())
}

/// A trace's hop samples as its summary keeps them (`packed_hops`): `encode_hops`'s text,
/// compressed (about a third of its size: the samples were most of a summary's bytes).
pub(crate) fn pack_hops(
    hops: &[HopSample],
    dictionaries: &Dictionaries,
) -> Result<Vec<u8>, StoreError> {
    dictionaries.compress(encode_hops(hops).as_bytes())
}

/// The samples a summary keeps: `packed_hops` when it has them, else the `hops` text of
/// summaries written before samples were packed (none from bytes it did not write).
pub(crate) fn stored_hops(
    text: &str,
    packed: Option<&[u8]>,
    dictionaries: &Dictionaries,
) -> Vec<HopSample> {
    match packed {
        Some(packed) => dictionaries
            .decompress(packed)
            .ok()
            .and_then(|text| String::from_utf8(text).ok())
            .map(|text| decode_hops(&text))
            .unwrap_or_default(),
        None => decode_hops(text),
    }
}

/// The samples `encode_hops` wrote (none from text it did not write).
pub(crate) fn decode_hops(text: &str) -> Vec<HopSample> {
    let stored: Vec<StoredHop> = serde_json::from_str(text).unwrap_or_default();
    stored
        .into_iter()
        .map(
            |StoredHop(
                service,
                operation,
                start,
                budget_ms,
                burn,
                self_ms,
                counts,
                wasted,
                flags,
                spent,
                critical,
                calls,
                advice,
            )| {
                HopSample {
                    service,
                    operation,
                    start_unix_nano: start.max(0) as u64,
                    budget_ms,
                    burn,
                    self_ms: self_ms.unwrap_or(0.0),
                    counts: decode_counts(&counts),
                    wasted_ms: wasted.unwrap_or(0.0),
                    flags: flags
                        .split(',')
                        .filter_map(|pair| {
                            let (flag, n) = pair.split_once(':')?;
                            Some((Flag::from_name(flag)?, n.parse().ok()?))
                        })
                        .collect(),
                    spent: spent.map(|text| {
                        let mut parts = text.split('\t').map(str::to_string);
                        let mut next = || parts.next().unwrap_or_default();
                        let caller = (next(), next());
                        let origin = (next(), next());
                        SpentArrival {
                            caller,
                            origin: (!origin.0.is_empty()).then_some(origin),
                        }
                    }),
                    critical: critical
                        .map(|(ms, exceeded, on_path, dominant)| CriticalSample {
                            ms,
                            exceeded,
                            on_path,
                            dominant,
                        })
                        .unwrap_or_default(),
                    calls: calls
                        .into_iter()
                        .map(
                            |(
                                service,
                                operation,
                                calls,
                                counts,
                                forwarded,
                                left,
                                latency,
                                short,
                            )| {
                                EdgeSample {
                                    callee_service: service,
                                    callee_operation: operation,
                                    stats: EdgeRollup {
                                        requests: 1,
                                        calls,
                                        counts: decode_counts(&counts),
                                        forwarded: Histogram::decode(&forwarded),
                                        left: Histogram::decode(&left),
                                        latency: Histogram::decode(&latency),
                                        shortfall: Histogram::decode(&short),
                                    },
                                }
                            },
                        )
                        .collect(),
                    advice: advice
                        .map(
                            |(exceeded, inflating, tail_ms, kept_ms, short_reserve, request)| {
                                AdviceSample {
                                    exceeded,
                                    inflating,
                                    tail_ms,
                                    kept_ms,
                                    short_reserve,
                                    request: request.map(
                                        |(need_ms, clean_exceeded, reached, layers)| RequestShape {
                                            need_ms,
                                            clean_exceeded,
                                            reached,
                                            layers,
                                        },
                                    ),
                                }
                            },
                        )
                        .unwrap_or_default(),
                }
            },
        )
        .collect()
}

/// An `AdviceRollup` as the `advice` column keeps it: a JSON array of its counts (in
/// `ADVICE_COUNTED` order), its four histograms and its reached tally ("27:1,3:40").
pub(crate) fn encode_advice(advice: &AdviceRollup) -> String {
    let reached: Vec<i64> = advice
        .reached
        .iter()
        .flat_map(|(k, c)| [i64::from(*k), *c])
        .collect();
    serde_json::to_string(&(
        encode_counts(&advice.counts),
        advice.exceeded_budget.encode(),
        advice.tail.encode(),
        advice.kept.encode(),
        advice.need.encode(),
        encode_counts(&reached),
    ))
    .unwrap_or_default()
}

/// What `encode_advice` wrote; empty (rows from before the column) or malformed text reads
/// as nothing counted.
pub(crate) fn decode_advice(text: &str) -> AdviceRollup {
    let Ok((counts, exceeded, tail, kept, need, reached)) =
        serde_json::from_str::<(String, String, String, String, String, String)>(text)
    else {
        return AdviceRollup::default();
    };
    let pairs: Vec<i64> = reached.split(',').filter_map(|v| v.parse().ok()).collect();
    AdviceRollup {
        counts: decode_counts(&counts),
        exceeded_budget: Histogram::decode(&exceeded),
        tail: Histogram::decode(&tail),
        kept: Histogram::decode(&kept),
        need: Histogram::decode(&need),
        reached: pairs
            .chunks_exact(2)
            .filter_map(|p| Some((u32::try_from(p[0]).ok()?, p[1])))
            .collect(),
    }
}

#[derive(sqlx::FromRow)]
pub struct StoredRollup {
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
    pub critical_ms: f64,
    pub exceeded_requests: i64,
    pub critical_exceeded: i64,
    pub dominant_exceeded: i64,
    pub advice: String,
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
                critical: CriticalCounts {
                    ms: self.critical_ms,
                    exceeded: self.exceeded_requests,
                    exceeded_on_path: self.critical_exceeded,
                    exceeded_dominant: self.dominant_exceeded,
                },
                advice: decode_advice(&self.advice),
                reported: Default::default(),
            },
        }
    }
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
/// chunks of `chunk` keys: reads the rows of the keys, merges, deletes rows that fell to
/// zero requests and upserts the rest. The caller's transaction keeps other writers out
/// (`summaries::Dialect::writers_lock`); only the chunk size differs between stores.
pub(crate) async fn apply_rollups<DB: Database>(
    conn: &mut DB::Connection,
    table: &str,
    deltas: &[(RollupKey, Rollup)],
    chunk: usize,
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
        select.push(")");
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
                    .push_bind(row.rollup.self_ms.encode())
                    .push_bind(row.rollup.critical.ms)
                    .push_bind(row.rollup.critical.exceeded)
                    .push_bind(row.rollup.critical.exceeded_on_path)
                    .push_bind(row.rollup.critical.exceeded_dominant)
                    .push_bind(encode_advice(&row.rollup.advice));
            });
            upsert.push(ROLLUP_UPSERT);
            upsert.build().execute(&mut *conn).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::analyze::hops::COUNTED;
    use sqlx::Connection as _;

    /// Two hops as the analyzer stored them before the `hops` column, one with a budget.
    const OLD_ROWS: &str = "INSERT INTO trace_hops VALUES \
        (X'01', 'edge', 'GET /', 5, 800.0, 0.25, 12.5, '1,0,2,0,0,0,0,0,1', 3.5), \
        (X'01', 'billing', 'Charge', 7, NULL, NULL, 4.0, '0,0,0,0,0,0,0,0,0', 0.0)";

    fn expected() -> Vec<HopSample> {
        let mut edge = [0; COUNTED.len()];
        (edge[0], edge[2], edge[8]) = (1, 2, 1);
        let hop =
            |service: &str, operation: &str, start, budget_ms, burn, self_ms, counts, wasted_ms| {
                HopSample {
                    service: service.into(),
                    operation: operation.into(),
                    start_unix_nano: start,
                    budget_ms,
                    burn,
                    self_ms,
                    counts,
                    wasted_ms,
                    flags: Default::default(),
                    spent: None,
                    critical: Default::default(),
                    calls: Vec::new(),
                    advice: Default::default(),
                }
            };
        vec![
            hop("edge", "GET /", 5, Some(800.0), Some(0.25), 12.5, edge, 3.5),
            hop(
                "billing",
                "Charge",
                7,
                None,
                None,
                4.0,
                [0; COUNTED.len()],
                0.0,
            ),
        ]
    }

    fn sorted(mut hops: Vec<HopSample>) -> Vec<HopSample> {
        hops.sort_by(|a, b| a.start_unix_nano.cmp(&b.start_unix_nano));
        hops
    }

    const MIGRATED: &str = "SELECT hops FROM trace_summaries ORDER BY trace_id";

    /// Summary 1 has both old hops; summary 2 had none.
    fn check_migrated(hops: Vec<(String,)>) {
        assert_eq!(sorted(decode_hops(&hops[0].0)), sorted(expected()));
        assert_eq!(hops[1].0, "[]", "a summary without hops");
    }

    #[test]
    fn hop_samples_round_trip_and_bad_text_decodes_to_none() {
        assert_eq!(decode_hops(&encode_hops(&expected())), expected());
        assert_eq!(decode_hops("not json"), Vec::new());
    }

    /// The migrations that moved hop samples into the summaries write what `decode_hops`
    /// reads, so re-analysing a trace summarised before still takes its hops back out.
    #[tokio::test]
    async fn migrated_hop_rows_decode_to_the_same_samples() {
        let old_sqlite = include_str!("../../migrations/sqlite/0003_hop_rollups.sql");
        let old_sqlite = &old_sqlite[..old_sqlite.find("CREATE INDEX").unwrap()];
        let mut db = sqlx::SqliteConnection::connect("sqlite::memory:")
            .await
            .unwrap();
        let setup = format!(
            "{old_sqlite} CREATE TABLE trace_summaries (trace_id BLOB PRIMARY KEY); \
             INSERT INTO trace_summaries VALUES (X'01'), (X'02'); {OLD_ROWS};"
        );
        sqlx::raw_sql(sqlx::AssertSqlSafe(setup))
            .execute(&mut db)
            .await
            .unwrap();
        let migration = include_str!("../../migrations/sqlite/0011_hops_in_summaries.sql");
        sqlx::raw_sql(migration).execute(&mut db).await.unwrap();
        check_migrated(sqlx::query_as(MIGRATED).fetch_all(&mut db).await.unwrap());

        let Ok(url) = std::env::var("BUDGETSCOPE_TEST_POSTGRES_URL") else {
            eprintln!(
                "SKIPPED the Postgres migration check: BUDGETSCOPE_TEST_POSTGRES_URL is not set"
            );
            return;
        };
        let old_pg = include_str!("../../migrations/postgres/0003_hop_rollups.sql");
        let old_pg = old_pg[..old_pg.find("CREATE INDEX").unwrap()]
            .replace("CREATE TABLE", "CREATE TEMP TABLE");
        let mut db = sqlx::PgConnection::connect(&url).await.unwrap();
        let setup = format!(
            "{old_pg} CREATE TEMP TABLE trace_summaries (trace_id BYTEA PRIMARY KEY); \
             INSERT INTO trace_summaries VALUES ('\\x01'), ('\\x02'); {};",
            OLD_ROWS.replace("X'01'", "'\\x01'")
        );
        sqlx::raw_sql(sqlx::AssertSqlSafe(setup))
            .execute(&mut db)
            .await
            .unwrap();
        let migration = include_str!("../../migrations/postgres/0009_hops_in_summaries.sql");
        sqlx::raw_sql(migration).execute(&mut db).await.unwrap();
        check_migrated(sqlx::query_as(MIGRATED).fetch_all(&mut db).await.unwrap());
    }

    #[test]
    fn whole_hours_come_from_the_hourly_table_and_edges_from_minutes() {
        let minute = 60_000_000_000;
        let since = 10 * HOUR_NANOS + 25 * minute;
        let until = 14 * HOUR_NANOS + 5 * minute;
        assert_eq!(
            rollup_ranges(since, until, true),
            [
                (true, 11 * HOUR_NANOS, 14 * HOUR_NANOS),
                (false, since, 11 * HOUR_NANOS),
                (false, 14 * HOUR_NANOS, until),
            ]
        );
        assert_eq!(rollup_ranges(since, until, false), [(false, since, until)]);
        assert_eq!(
            rollup_ranges(since, 10 * HOUR_NANOS + 50 * minute, true),
            [(false, since, 10 * HOUR_NANOS + 50 * minute)]
        );
        assert_eq!(
            rollup_ranges(10 * HOUR_NANOS, 12 * HOUR_NANOS, true),
            [(true, 10 * HOUR_NANOS, 12 * HOUR_NANOS)]
        );
    }
}

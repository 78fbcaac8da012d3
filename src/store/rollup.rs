//! Hop rollups as rows, shared by both stores: decoding, and the deltas a batch of
//! (re-)analysed traces makes to them.

use std::collections::BTreeMap;

use crate::analyze::hops::{COUNTED, Histogram, HopSample, Rollup, minute_of};

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

//! Per-hop statistics: what each hop of a trace contributes (`HopSample`), and the
//! mergeable per-minute rollups they add up to (`Rollup`). Pure.
//!
//! Quantiles come from a log-bucket histogram: 8 buckets per doubling, so a quantile is
//! reported within ±4.4 % of a value that was really observed (the bucket's geometric
//! midpoint), for any magnitude and sign. Histograms are sparse maps, merge by adding and
//! un-merge by subtracting, so a late span's re-analysis replaces the trace's contribution.

use std::collections::BTreeMap;

use std::collections::HashMap;

use super::{Analysis, AnalyzeOptions, Exceed, Flag, Role, analyze};
use crate::model::{Span, TraceId};

/// Buckets per doubling.
const BUCKETS_PER_OCTAVE: f64 = 8.0;
/// Values smaller than this in magnitude count as zero.
const ZERO: f64 = 1e-6;

/// A sparse log histogram. Keys: 0 for zero, ±(1 + bucket offset) for positive/negative values.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histogram {
    pub buckets: BTreeMap<i32, i64>,
}

impl Histogram {
    fn key(value: f64) -> i32 {
        if !value.is_finite() || value.abs() < ZERO {
            return 0;
        }
        // Offset so every |value| ≥ ZERO gets a positive index.
        let index = ((value.abs() / ZERO).log2() * BUCKETS_PER_OCTAVE).floor() as i32 + 1;
        if value > 0.0 { index } else { -index }
    }

    /// The geometric midpoint of a bucket.
    fn value(key: i32) -> f64 {
        if key == 0 {
            return 0.0;
        }
        let index = f64::from(key.abs() - 1) + 0.5;
        let magnitude = ZERO * (index / BUCKETS_PER_OCTAVE).exp2();
        if key > 0 { magnitude } else { -magnitude }
    }

    pub fn record(&mut self, value: f64, weight: i64) {
        let key = Self::key(value);
        let count = self.buckets.entry(key).or_insert(0);
        *count += weight;
        if *count == 0 {
            self.buckets.remove(&key);
        }
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (key, count) in &other.buckets {
            let entry = self.buckets.entry(*key).or_insert(0);
            *entry += count;
            if *entry == 0 {
                self.buckets.remove(key);
            }
        }
    }

    /// Takes `other`'s counts back out: the inverse of `merge`.
    pub fn unmerge(&mut self, other: &Histogram) {
        for (key, count) in &other.buckets {
            let entry = self.buckets.entry(*key).or_insert(0);
            *entry -= count;
            if *entry == 0 {
                self.buckets.remove(key);
            }
        }
    }

    pub fn count(&self) -> i64 {
        self.buckets.values().filter(|c| **c > 0).sum()
    }

    /// The value at quantile `q` (0–1), or `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as i64).max(1);
        let mut seen = 0;
        // Keys order: negatives by magnitude descending first.
        let mut keys: Vec<i32> = self.buckets.keys().copied().collect();
        keys.sort_by(|a, b| Self::value(*a).total_cmp(&Self::value(*b)));
        for key in keys {
            seen += self.buckets[&key].max(0);
            if seen >= rank {
                return Some(Self::value(key));
            }
        }
        None
    }

    /// Each non-empty bucket as (its representative value, count), in value order.
    pub fn points(&self) -> Vec<(f64, i64)> {
        let mut points: Vec<(f64, i64)> = self
            .buckets
            .iter()
            .filter(|(_, c)| **c > 0)
            .map(|(k, c)| (Self::value(*k), *c))
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        points
    }

    /// Compact text form for storage: `key:count,key:count`.
    pub fn encode(&self) -> String {
        self.buckets
            .iter()
            .map(|(k, c)| format!("{k}:{c}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Reads `encode`'s form; malformed pairs are skipped.
    pub fn decode(text: &str) -> Histogram {
        let buckets = text
            .split(',')
            .filter_map(|pair| {
                let (k, c) = pair.split_once(':')?;
                Some((k.parse().ok()?, c.parse().ok()?))
            })
            .collect();
        Histogram { buckets }
    }
}

/// What one hop of one trace contributes to its identity's statistics.
#[derive(Debug, Clone, PartialEq)]
pub struct HopSample {
    pub service: String,
    pub operation: String,
    pub start_unix_nano: u64,
    pub budget_ms: Option<f64>,
    pub burn: Option<f64>,
    pub self_ms: f64,
    /// Counts, indexed like `COUNTED`, of flags on the hop and on the calls it made.
    pub counts: [i64; COUNTED.len()],
    pub wasted_ms: f64,
}

/// What a rollup counts, in column order.
pub const COUNTED: [&str; 8] = [
    "inherited_exceed",
    "local_exceed",
    "overspent",
    "inflated",
    "dropped",
    "doomed",
    "refused",
    "retry",
];

fn counted_index(flag: Flag) -> Option<usize> {
    COUNTED.iter().position(|name| *name == flag.as_str())
}

/// The hop samples of an analysed trace. Flags of a call (inflated, doomed, retry) count
/// for the hop that made it.
pub fn samples(spans: &[Span], analysis: &Analysis) -> Vec<HopSample> {
    let mut by_span: BTreeMap<usize, HopSample> = BTreeMap::new();
    for row in analysis.rows.iter().filter(|row| row.role == Role::Hop) {
        let span = &spans[row.span];
        by_span.insert(
            row.span,
            HopSample {
                service: span.service.clone(),
                operation: span.name.clone(),
                start_unix_nano: span.start_unix_nano,
                budget_ms: row.budget_ms,
                burn: row.burn,
                self_ms: row.self_ms.unwrap_or(0.0),
                counts: [0; COUNTED.len()],
                wasted_ms: row.wasted_ms.unwrap_or(0.0),
            },
        );
    }
    for row in &analysis.rows {
        let Some(sample) = row.owner.and_then(|o| by_span.get_mut(&o)) else {
            continue;
        };
        for note in &row.flags {
            // The exceed field is authoritative for the two exceed counts.
            if matches!(note.flag, Flag::InheritedExceed | Flag::LocalExceed) {
                continue;
            }
            if let Some(i) = counted_index(note.flag) {
                sample.counts[i] += 1;
            }
        }
        if row.role == Role::Hop {
            match row.exceed {
                Some(Exceed::Inherited) => sample.counts[0] += 1,
                Some(Exceed::Local) => sample.counts[1] += 1,
                None => {}
            }
        }
    }
    by_span.into_values().collect()
}

/// Per hop identity and minute: counts and histograms. `add` with weight −1 removes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rollup {
    pub requests: i64,
    pub counts: [i64; COUNTED.len()],
    pub wasted_ms: f64,
    pub budget: Histogram,
    pub burn: Histogram,
    pub self_ms: Histogram,
}

impl Rollup {
    pub fn add(&mut self, sample: &HopSample, weight: i64) {
        self.requests += weight;
        for (total, count) in self.counts.iter_mut().zip(sample.counts) {
            *total += weight * count;
        }
        self.wasted_ms += weight as f64 * sample.wasted_ms;
        if let Some(budget) = sample.budget_ms {
            self.budget.record(budget, weight);
        }
        if let Some(burn) = sample.burn {
            self.burn.record(burn, weight);
        }
        self.self_ms.record(sample.self_ms, weight);
    }

    pub fn merge(&mut self, other: &Rollup) {
        self.requests += other.requests;
        for (total, count) in self.counts.iter_mut().zip(other.counts) {
            *total += count;
        }
        self.wasted_ms += other.wasted_ms;
        self.budget.merge(&other.budget);
        self.burn.merge(&other.burn);
        self.self_ms.merge(&other.self_ms);
    }

    /// Takes `other` back out: the inverse of `merge` (a sliding window's oldest minute).
    pub fn unmerge(&mut self, other: &Rollup) {
        self.requests -= other.requests;
        for (total, count) in self.counts.iter_mut().zip(other.counts) {
            *total -= count;
        }
        self.wasted_ms -= other.wasted_ms;
        self.budget.unmerge(&other.budget);
        self.burn.unmerge(&other.burn);
        self.self_ms.unmerge(&other.self_ms);
    }

    pub fn count(&self, name: &str) -> i64 {
        COUNTED
            .iter()
            .position(|n| *n == name)
            .map_or(0, |i| self.counts[i])
    }
}

/// Who sent this hop requests that arrived already spent: (caller service, caller
/// operation) → (how many, an example trace id). Callers outside any instrumented hop are
/// keyed by empty strings.
pub fn spent_callers(
    spans: Vec<Span>,
    service: &str,
    operation: &str,
    options: &AnalyzeOptions,
) -> BTreeMap<(String, String), (usize, String)> {
    let mut by_trace: HashMap<TraceId, Vec<Span>> = HashMap::new();
    for span in spans {
        by_trace.entry(span.trace_id).or_default().push(span);
    }
    let mut out: BTreeMap<(String, String), (usize, String)> = BTreeMap::new();
    for (id, spans) in by_trace {
        let analysis = analyze(&spans, options);
        let row_of: HashMap<usize, usize> = analysis
            .rows
            .iter()
            .enumerate()
            .map(|(r, row)| (row.span, r))
            .collect();
        let index: HashMap<_, usize> = spans
            .iter()
            .enumerate()
            .map(|(i, s)| (s.span_id, i))
            .collect();
        for row in &analysis.rows {
            let span = &spans[row.span];
            if row.role != Role::Hop
                || row.exceed != Some(Exceed::Inherited)
                || span.service != service
                || span.name != operation
            {
                continue;
            }
            // The caller: the owner hop of the call span that reached this hop.
            let call = span.parent_span_id.and_then(|p| index.get(&p).copied());
            let owner = call
                .and_then(|c| row_of.get(&c))
                .and_then(|&r| analysis.rows[r].owner)
                .map(|o| (spans[o].service.clone(), spans[o].name.clone()))
                .unwrap_or_default();
            let entry = out.entry(owner).or_insert((0, id.to_hex()));
            entry.0 += 1;
        }
    }
    out
}

/// The minute a sample belongs to, as unix nanoseconds at the minute's start.
pub fn minute_of(unix_nano: u64) -> u64 {
    unix_nano - unix_nano % 60_000_000_000
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::fixture::parse;
    use crate::analyze::{AnalyzeOptions, analyze};

    #[test]
    fn quantiles_are_within_the_bucket_precision() {
        let mut histogram = Histogram::default();
        for value in 1..=1000 {
            histogram.record(f64::from(value), 1);
        }
        for (q, exact) in [(0.5, 500.0), (0.95, 950.0), (0.99, 990.0)] {
            let got = histogram.quantile(q).unwrap();
            assert!(
                (got - exact).abs() / exact < 0.045,
                "q{q}: {got} vs {exact}"
            );
        }
        let mut signed = Histogram::default();
        for value in [-100.0, -50.0, 0.0, 20.0, 700.0] {
            signed.record(value, 1);
        }
        assert!((signed.quantile(0.2).unwrap() + 100.0).abs() < 5.0);
        assert_eq!(signed.quantile(0.6), Some(0.0));
        assert_eq!(Histogram::decode(&signed.encode()), signed);
        assert_eq!(Histogram::default().quantile(0.5), None);
    }

    #[test]
    fn removing_a_sample_undoes_adding_it() {
        let spans = parse(
            r#"
edge server "GET /" 0 1200 budget=1000
  edge client "billing" 1100 60 budget=-100
    billing server "Charge" 1101 40 budget=-100
"#,
        );
        let samples = samples(&spans, &analyze(&spans, &AnalyzeOptions::default()));
        assert_eq!(samples.len(), 2);
        let edge = &samples[0];
        assert_eq!(
            (edge.service.as_str(), edge.operation.as_str()),
            ("edge", "GET /")
        );
        // overspent on the hop, doomed on its call, and the local exceed.
        assert_eq!(edge.counts, [0, 1, 1, 0, 0, 1, 0, 0]);
        assert_eq!(samples[1].counts[0], 1, "billing arrived already spent");

        let mut rollup = Rollup::default();
        rollup.add(&samples[0], 1);
        let snapshot = rollup.clone();
        rollup.add(&samples[1], 1);
        rollup.add(&samples[1], -1);
        assert_eq!(rollup, snapshot);
        let mut other = Rollup::default();
        other.add(&samples[1], 1);
        rollup.merge(&other);
        rollup.unmerge(&other);
        assert_eq!(rollup, snapshot, "unmerge undoes merge");
        assert_eq!(rollup.count("local_exceed"), 1);
    }
}

//! Per-hop statistics: what each hop of a trace contributes (`HopSample`, with its calls'
//! `EdgeSample`s), and the mergeable per-minute rollups they add up to (`Rollup`, and
//! `EdgeRollup` per call edge). Pure.

use std::collections::BTreeMap;

use std::collections::{HashMap, HashSet};

use super::advice_stats::{AdviceRollup, AdviceSample, advice_samples};
use super::edges::{EdgeKey, EdgeRollup, EdgeSample, call_edges, edge_samples};
use super::histogram::Histogram;
use super::{Analysis, Exceed, Flag, Outcome, Role};
use crate::core::model::{Span, TraceId};

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
    /// Every flag on the rows the hop owns (itself, its calls), as the trace page shows them:
    /// the hop page's "this hop" beside "elsewhere in the trace".
    pub flags: BTreeMap<Flag, usize>,
    /// Set when the hop arrived with its budget already spent.
    pub spent: Option<SpentArrival>,
    pub critical: CriticalSample,
    /// The calls the hop made, one sample per callee.
    pub calls: Vec<EdgeSample>,
    /// What the advisor's hop findings read (`advice_stats`).
    pub advice: AdviceSample,
}

/// A hop's part in one request's critical path (docs/budget-semantics.md, "The critical
/// path").
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CriticalSample {
    /// Its time on the path: its own and that of the rows it owns (`Analysis::critical_ms_of`).
    pub ms: f64,
    /// The request exceeded its budget.
    pub exceeded: bool,
    /// The hop is on the path.
    pub on_path: bool,
    /// The hop is the request's critical hop: the most time on the path.
    pub dominant: bool,
}

/// Per hop identity and minute: `CriticalSample`s added up.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CriticalCounts {
    /// Time on the critical path, summed over requests.
    pub ms: f64,
    /// Requests through the hop that exceeded their budget; of them, those whose critical
    /// path went through the hop, and those whose critical hop it was.
    pub exceeded: i64,
    pub exceeded_on_path: i64,
    pub exceeded_dominant: i64,
}

impl CriticalCounts {
    pub fn add(&mut self, sample: &CriticalSample, weight: i64) {
        self.ms += weight as f64 * sample.ms;
        if sample.exceeded {
            self.exceeded += weight;
            self.exceeded_on_path += weight * i64::from(sample.on_path);
            self.exceeded_dominant += weight * i64::from(sample.dominant);
        }
    }

    pub fn merge(&mut self, other: &CriticalCounts, weight: i64) {
        self.ms += weight as f64 * other.ms;
        self.exceeded += weight * other.exceeded;
        self.exceeded_on_path += weight * other.exceeded_on_path;
        self.exceeded_dominant += weight * other.exceeded_dominant;
    }

    /// `critical_share`: of the exceeded requests through the hop, the share whose critical
    /// hop it was; none without exceeded requests.
    pub fn share(&self) -> Option<f64> {
        (self.exceeded > 0).then(|| self.exceeded_dominant as f64 / self.exceeded as f64)
    }
}

/// A request that arrived at a hop already spent: who sent it, and where upstream its
/// budget ran out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpentArrival {
    /// (service, operation) of the hop that called it; empty strings for a caller outside
    /// any instrumented hop.
    pub caller: (String, String),
    /// The nearest origin hop upstream of it, when the request has one there.
    pub origin: Option<(String, String)>,
}

/// What a rollup counts, in column order: flags, and `origin`, the exceeded requests whose
/// budget ran out at the hop.
pub const COUNTED: [&str; 9] = [
    "inherited_exceed",
    "local_exceed",
    "overspent",
    "inflated",
    "dropped",
    "doomed",
    "refused",
    "retry",
    "origin",
];

fn counted_index(flag: Flag) -> Option<usize> {
    COUNTED.iter().position(|name| *name == flag.as_str())
}

/// The hop samples of an analysed trace. Flags of a call (inflated, doomed, retry) count
/// for the hop that made it; an origin counts for its own hop.
pub fn samples(spans: &[Span], analysis: &Analysis) -> Vec<HopSample> {
    let spent = spent_arrivals(spans, analysis);
    let edges = call_edges(spans, analysis);
    let mut calls = edge_samples(analysis, &edges, analysis.tolerance_ms);
    let mut advice = advice_samples(spans, analysis, &edges, &calls);
    let exceeded = analysis.outcome == Outcome::Exceeded;
    let mut by_span: BTreeMap<usize, HopSample> = BTreeMap::new();
    for (r, row) in analysis.rows.iter().enumerate() {
        if row.role != Role::Hop {
            continue;
        }
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
                flags: BTreeMap::new(),
                spent: spent.get(&row.span).cloned(),
                critical: CriticalSample {
                    ms: analysis.critical_ms_of(r),
                    exceeded,
                    on_path: row.critical_ms.is_some(),
                    dominant: analysis.critical_hop == Some(r),
                },
                calls: calls.remove(&row.span).unwrap_or_default(),
                advice: advice.remove(&r).unwrap_or_default(),
            },
        );
    }
    for row in &analysis.rows {
        let Some(sample) = row.owner.and_then(|o| by_span.get_mut(&o)) else {
            continue;
        };
        for note in &row.flags {
            *sample.flags.entry(note.flag).or_default() += 1;
        }
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
    let origin = COUNTED.len() - 1;
    for &r in &analysis.origins {
        if let Some(sample) = by_span.get_mut(&analysis.rows[r].span) {
            sample.counts[origin] += 1;
        }
    }
    let mut samples: Vec<HopSample> = by_span.into_values().collect();
    for sample in &mut samples {
        sample.round_to_nanoseconds();
    }
    samples
}

/// A time in milliseconds, or a ratio, to six decimals: a nanosecond, the precision of
/// span times, so that a stored sample's numbers stay short (BENCHMARKS.md, "Disk per
/// span"); one far beyond any span's (±9·10⁹ ms) is kept as it is.
fn six_decimals(value: f64) -> f64 {
    let scaled = (value * 1e6).round();
    if scaled.abs() < 9e15 {
        scaled / 1e6
    } else {
        value
    }
}

impl HopSample {
    /// Rounds its times and ratios (`six_decimals`) before anything adds it up or stores
    /// it, so that a re-analysis takes out exactly what it added.
    fn round_to_nanoseconds(&mut self) {
        self.budget_ms = self.budget_ms.map(six_decimals);
        self.burn = self.burn.map(six_decimals);
        self.self_ms = six_decimals(self.self_ms);
        self.wasted_ms = six_decimals(self.wasted_ms);
        self.critical.ms = six_decimals(self.critical.ms);
        self.advice.tail_ms = self.advice.tail_ms.map(six_decimals);
        self.advice.kept_ms = self.advice.kept_ms.map(six_decimals);
        if let Some(request) = &mut self.advice.request {
            request.need_ms = request.need_ms.map(six_decimals);
        }
    }
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
    pub critical: CriticalCounts,
    pub advice: AdviceRollup,
    /// What the hop's own deadline metrics reported (every request, not only sampled
    /// traces); never derived from spans, read beside the rollups (`Store::reported`).
    pub reported: Reported,
}

/// A hop's deadline metrics over some minutes, as exported over OTLP metrics: the
/// `deadline.exceeded` counter by origin and the `deadline.budget_received` and
/// `deadline.budget_remaining` histograms' counts and sums (milliseconds).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Reported {
    pub local_exceeds: i64,
    pub inherited_exceeds: i64,
    pub received_count: i64,
    pub received_sum_ms: f64,
    pub remaining_count: i64,
    pub remaining_sum_ms: f64,
}

impl Reported {
    pub fn merge(&mut self, other: &Reported, weight: i64) {
        self.local_exceeds += weight * other.local_exceeds;
        self.inherited_exceeds += weight * other.inherited_exceeds;
        self.received_count += weight * other.received_count;
        self.received_sum_ms += weight as f64 * other.received_sum_ms;
        self.remaining_count += weight * other.remaining_count;
        self.remaining_sum_ms += weight as f64 * other.remaining_sum_ms;
    }

    pub fn is_empty(&self) -> bool {
        *self == Reported::default()
    }

    /// Mean budget received, in milliseconds.
    pub fn received_mean_ms(&self) -> Option<f64> {
        (self.received_count > 0).then(|| self.received_sum_ms / self.received_count as f64)
    }

    /// Mean budget left when the hop answered, in milliseconds.
    pub fn remaining_mean_ms(&self) -> Option<f64> {
        (self.remaining_count > 0).then(|| self.remaining_sum_ms / self.remaining_count as f64)
    }
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
        self.critical.add(&sample.critical, weight);
        self.advice.add(&sample.advice, sample.budget_ms, weight);
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
        self.critical.merge(&other.critical, 1);
        self.advice.merge_weighted(&other.advice, 1);
        self.reported.merge(&other.reported, 1);
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
        self.critical.merge(&other.critical, -1);
        self.advice.merge_weighted(&other.advice, -1);
        self.reported.merge(&other.reported, -1);
    }

    pub fn count(&self, name: &str) -> i64 {
        COUNTED
            .iter()
            .position(|n| *n == name)
            .map_or(0, |i| self.counts[i])
    }
}

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

/// One hop's deadline metrics for one minute (writes and per-minute reads), or summed over
/// a range (reads, whose `minute_unix_nano` is the range's start).
#[derive(Debug, Clone, PartialEq)]
pub struct ReportedRow {
    pub service: String,
    pub operation: String,
    pub minute_unix_nano: u64,
    pub reported: Reported,
}

impl ReportedRow {
    /// As a rollup row of its hop and minute with nothing but `reported` set, to merge with
    /// the traces' rollups.
    pub fn into_rollup_row(self) -> HopRollupRow {
        HopRollupRow {
            service: self.service,
            operation: self.operation,
            minute_unix_nano: self.minute_unix_nano,
            rollup: Rollup {
                reported: self.reported,
                ..Rollup::default()
            },
        }
    }
}

/// Spans grouped by trace, each trace's spans in their original order.
pub fn by_trace(spans: Vec<Span>) -> HashMap<TraceId, Vec<Span>> {
    let mut by_trace: HashMap<TraceId, Vec<Span>> = HashMap::new();
    for span in spans {
        by_trace.entry(span.trace_id).or_default().push(span);
    }
    by_trace
}

/// Requests that arrived at a hop already spent: who sent them, and where their budget ran
/// out.
#[derive(Debug, Default, PartialEq)]
pub struct Spent {
    /// (caller service, caller operation) → (how many, an example trace id). Callers
    /// outside any instrumented hop are keyed by empty strings.
    pub callers: BTreeMap<(String, String), (usize, String)>,
    /// (service, operation) of the origin hop upstream of each arrival → how many.
    pub origins: BTreeMap<(String, String), usize>,
}

impl Spent {
    /// The origin hop most of the spent requests ran out at.
    pub fn top_origin(&self) -> Option<(String, String)> {
        self.origins
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
            .map(|(hop, _)| hop.clone())
    }

    /// Adds one trace's already-spent arrivals at the hop identity, from its stored samples.
    pub fn add(
        &mut self,
        trace_id: TraceId,
        samples: &[HopSample],
        service: &str,
        operation: &str,
    ) {
        for sample in samples {
            let Some(arrival) = &sample.spent else {
                continue;
            };
            if sample.service != service || sample.operation != operation {
                continue;
            }
            let entry = self
                .callers
                .entry(arrival.caller.clone())
                .or_insert((0, trace_id.to_hex()));
            entry.0 += 1;
            if let Some(origin) = &arrival.origin {
                *self.origins.entry(origin.clone()).or_default() += 1;
            }
        }
    }
}

/// Each inherited hop's `SpentArrival`, by the hop's span index.
fn spent_arrivals(spans: &[Span], analysis: &Analysis) -> HashMap<usize, SpentArrival> {
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
    let origins: HashSet<usize> = analysis
        .origins
        .iter()
        .map(|&r| analysis.rows[r].span)
        .collect();
    let parent = |i: usize| spans[i].parent_span_id.and_then(|p| index.get(&p).copied());
    let identity = |i: usize| (spans[i].service.clone(), spans[i].name.clone());
    let mut out = HashMap::new();
    for row in &analysis.rows {
        if row.role != Role::Hop || row.exceed != Some(Exceed::Inherited) {
            continue;
        }
        // The caller: the owner hop of the call span that reached this hop.
        let caller = parent(row.span)
            .and_then(|c| row_of.get(&c))
            .and_then(|&r| analysis.rows[r].owner)
            .map(identity)
            .unwrap_or_default();
        // The origin: the nearest ancestor where the request ran out. The walk is bounded
        // by the span count, so a parent cycle cannot loop.
        let mut origin = None;
        let mut at = parent(row.span);
        for _ in 0..spans.len() {
            let Some(i) = at else { break };
            if origins.contains(&i) {
                origin = Some(identity(i));
                break;
            }
            at = parent(i);
        }
        out.insert(row.span, SpentArrival { caller, origin });
    }
    out
}

/// One hop identity's part of a trace's flags: those on its hops and on the calls they
/// made, the rest of the trace's, and whether the request ran out at it.
#[derive(Debug, Default, PartialEq)]
pub struct FlagsAt {
    pub here: BTreeMap<Flag, usize>,
    pub elsewhere: BTreeMap<Flag, usize>,
    pub origin: bool,
}

impl FlagsAt {
    /// From a trace's stored samples and its summary's flag counts (every flag of the trace).
    pub fn of(
        samples: &[HopSample],
        flag_counts: &BTreeMap<Flag, usize>,
        service: &str,
        operation: &str,
    ) -> FlagsAt {
        let mut out = FlagsAt {
            elsewhere: flag_counts.clone(),
            ..FlagsAt::default()
        };
        let origin = COUNTED.len() - 1;
        for sample in samples
            .iter()
            .filter(|s| s.service == service && s.operation == operation)
        {
            out.origin |= sample.counts[origin] > 0;
            for (flag, n) in &sample.flags {
                *out.here.entry(*flag).or_default() += n;
                if let Some(left) = out.elsewhere.get_mut(flag) {
                    *left = left.saturating_sub(*n);
                }
            }
        }
        out.elsewhere.retain(|_, n| *n > 0);
        out
    }
}

/// Adds the edge samples of hop samples (weight +1) or takes them back out (−1).
pub fn add_edges(deltas: &mut BTreeMap<EdgeKey, EdgeRollup>, samples: &[HopSample], weight: i64) {
    for sample in samples {
        for edge in &sample.calls {
            let key = (
                sample.service.clone(),
                sample.operation.clone(),
                edge.callee_service.clone(),
                edge.callee_operation.clone(),
                minute_of(sample.start_unix_nano),
            );
            deltas.entry(key).or_default().add(edge, weight);
        }
    }
}

/// The minute a sample belongs to, as unix nanoseconds at the minute's start.
pub fn minute_of(unix_nano: u64) -> u64 {
    unix_nano - unix_nano % 60_000_000_000
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::analyze::edges::EDGE_COUNTED;
    use crate::core::analyze::fixture::parse;
    use crate::core::analyze::{AnalyzeOptions, analyze};

    #[test]
    fn sample_times_are_kept_to_the_nanosecond() {
        assert_eq!(six_decimals(73.31157999999999), 73.31158);
        assert_eq!(six_decimals(0.037027968678159814), 0.037028);
        assert_eq!(six_decimals(-0.14067687081637814), -0.140677);
        assert_eq!(six_decimals(38.759919), 38.759919);
        assert_eq!(six_decimals(1e300), 1e300);
        assert!(six_decimals(f64::NAN).is_nan());
        assert_eq!(
            format!("{}", six_decimals(1046.7741111291837)),
            "1046.774111"
        );
    }

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

    /// edge runs out in its own work, then calls billing with nothing left.
    const DOOMED_BILLING: &str = r#"
edge server "GET /" 0 1200 budget=1000
  edge client "billing" 1100 60 budget=-100
    billing server "Charge" 1101 40 budget=-100
"#;

    #[test]
    fn removing_a_sample_undoes_adding_it() {
        let spans = parse(DOOMED_BILLING);
        let samples = samples(&spans, &analyze(&spans, &AnalyzeOptions::default()));
        assert_eq!(samples.len(), 2);
        let edge = &samples[0];
        assert_eq!(
            (edge.service.as_str(), edge.operation.as_str()),
            ("edge", "GET /")
        );
        // overspent on the hop, doomed on its call, the local exceed, and the origin.
        assert_eq!(edge.counts, [0, 1, 1, 0, 0, 1, 0, 0, 1]);
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

    #[test]
    fn each_hop_counts_its_part_in_the_critical_path_of_an_exceeded_request() {
        let spans = parse(DOOMED_BILLING);
        let analysis = analyze(&spans, &AnalyzeOptions::default());
        let stored = samples(&spans, &analysis);
        // edge worked 1.1 s before calling billing: the critical hop.
        assert_eq!(
            stored[0].critical,
            CriticalSample {
                ms: analysis.critical_ms_of(analysis.edge.unwrap()),
                exceeded: true,
                on_path: true,
                dominant: true,
            }
        );
        assert!(stored[0].critical.ms > 1100.0, "{:?}", stored[0].critical);
        assert!(stored[1].critical.on_path && !stored[1].critical.dominant);
        let mut edge = Rollup::default();
        edge.add(&stored[0], 1);
        edge.add(&stored[0], 1);
        assert_eq!(edge.critical.share(), Some(1.0));
        let mut billing = Rollup::default();
        billing.add(&stored[1], 1);
        assert_eq!(billing.critical.share(), Some(0.0));
        assert_eq!(
            (billing.critical.exceeded, billing.critical.exceeded_on_path),
            (1, 1)
        );
        assert_eq!(Rollup::default().critical.share(), None);
    }

    #[test]
    fn a_hops_flags_are_told_apart_from_the_rest_of_the_trace() {
        let spans = parse(DOOMED_BILLING);
        let analysis = analyze(&spans, &AnalyzeOptions::default());
        let stored = samples(&spans, &analysis);
        let flags_at =
            |service, operation| FlagsAt::of(&stored, &analysis.flag_counts, service, operation);
        let edge = flags_at("edge", "GET /");
        assert!(edge.origin, "the request ran out at edge");
        assert_eq!(
            edge.here.keys().map(|f| f.as_str()).collect::<Vec<_>>(),
            ["overspent", "local_exceed", "doomed"],
            "the hop's own flags and its call's"
        );
        assert_eq!(
            edge.elsewhere
                .keys()
                .map(|f| f.as_str())
                .collect::<Vec<_>>(),
            ["inherited_exceed"]
        );
        let billing = flags_at("billing", "Charge");
        assert!(!billing.origin);
        assert_eq!(billing.here.len(), 1);
        assert_eq!(billing.here.get(&Flag::InheritedExceed), Some(&1));
        let total: usize = billing
            .here
            .values()
            .chain(billing.elsewhere.values())
            .sum();
        assert_eq!(total, analysis.flag_counts.values().sum::<usize>());
    }

    #[test]
    fn spent_arrivals_name_their_caller_and_the_origin_upstream() {
        let spans = parse(
            r#"
edge server "GET /" 0 1000 budget=700
  edge client "orders" 10 980 budget=690
    orders server "POST /orders" 12 970 budget=688
      orders client "billing" 900 60 budget=-200
        billing server "Charge" 901 50 budget=-201
          billing client "ledger" 910 30 budget=-210
            ledger server "Append" 911 28 budget=-211
"#,
        );
        let orders = ("orders".to_string(), "POST /orders".to_string());
        let stored = samples(&spans, &analyze(&spans, &AnalyzeOptions::default()));
        let spent_at = |service, operation| {
            let mut spent = Spent::default();
            spent.add(spans[0].trace_id, &stored, service, operation);
            spent
        };
        let spent = spent_at("billing", "Charge");
        assert_eq!(spent.callers.keys().collect::<Vec<_>>(), [&orders]);
        assert_eq!(spent.top_origin().as_ref(), Some(&orders), "{spent:?}");
        // Two hops down, the caller is billing; the budget still ran out at orders.
        let spent = spent_at("ledger", "Append");
        assert_eq!(
            spent.callers.keys().collect::<Vec<_>>(),
            [&("billing".to_string(), "Charge".to_string())]
        );
        assert_eq!(spent.top_origin().as_ref(), Some(&orders), "{spent:?}");
    }

    #[test]
    fn each_hop_counts_its_calls_per_callee() {
        let spans = parse(
            r#"
edge server "GET /" 0 900 budget=1000
  edge client "GET /stock" 10 100 budget=990 http-status=504
    inventory server "GET /stock" 12 96 budget=988 http-status=504
  edge client "GET /stock" 120 200 budget=870
    inventory server "GET /stock" 121 198 budget=400
  edge client "GET /price" 330 50 budget=5000
    pricing server "GET /price" 331 48
  edge client "SELECT" 400 20 attr:server.address=db.internal
"#,
        );
        let analysis = analyze(&spans, &AnalyzeOptions::default());
        let edge = &samples(&spans, &analysis)[0];
        let calls: Vec<(&str, &str, i64)> = edge
            .calls
            .iter()
            .map(|e| {
                (
                    e.callee_service.as_str(),
                    e.callee_operation.as_str(),
                    e.stats.calls,
                )
            })
            .collect();
        assert_eq!(
            calls,
            [
                ("db.internal", "", 1),
                ("inventory", "GET /stock", 2),
                ("pricing", "GET /price", 1),
            ]
        );
        let stock = &edge.calls[1];
        let counted = |e: &EdgeSample| -> Vec<&str> {
            EDGE_COUNTED
                .iter()
                .zip(e.stats.counts)
                .filter(|(_, n)| *n > 0)
                .map(|(name, _)| *name)
                .collect()
        };
        // The second attempt's callee got 400 ms of the 870 sent: a gateway cut it.
        assert_eq!(counted(stock), ["clamped", "retry"]);
        assert_eq!(stock.stats.forwarded.count(), 2);
        assert_eq!(stock.stats.shortfall.count(), 2);
        // 5000 ms sent with about 670 left, and the callee has no budget.
        assert_eq!(counted(&edge.calls[2]), ["inflated", "dropped"]);
        assert!(counted(&edge.calls[0]).is_empty());
        assert_eq!(edge.calls[0].stats.latency.count(), 1);

        let mut deltas = BTreeMap::new();
        let all = samples(&spans, &analysis);
        add_edges(&mut deltas, &all, 1);
        assert_eq!(deltas.len(), 3);
        let rollup = deltas
            .values()
            .find(|r| r.calls == 2)
            .expect("the inventory edge");
        assert_eq!((rollup.requests, rollup.count("retry")), (1, 1));
        add_edges(&mut deltas, &all, -1);
        assert!(deltas.values().all(|r| *r == EdgeRollup::default()));
    }
}

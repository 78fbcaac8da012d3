//! The deadline metrics a hop exports over OTLP, turned into per (service, hop, minute)
//! deltas: the `deadline.exceeded` counter (attributes `hop` and `origin` = `local` |
//! `inherited`) and the `deadline.budget_received` and `deadline.budget_remaining`
//! histograms (attribute `hop`; their counts and sums). Names and attribute keys are
//! configurable (`MetricNames`). Pure: a request and the cumulative series seen so far in,
//! rows and the series' new last points out.
//!
//! Every other metric is ignored, never an error. A data point of a deadline metric that
//! cannot be read (no hop, an unknown origin, a gauge where a counter is expected, an
//! unknown unit) is left out and counted in the answer's `partial_success`.
//!
//! Cumulative series become deltas against their last point held in memory: a point with
//! a new start time, or a count lower than the last, starts the series over (a restarted
//! process); the first point of a series that started before this server did is a
//! baseline and adds nothing (its earlier counts were this server's or another's to see).
//! With several servers behind a balancer, exporters should use delta temporality or stick
//! to one server, or each server's first point of a series is a baseline again.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{AggregationTemporality, metric::Data};

use crate::core::analyze::hops::ReportedRow;
use crate::core::analyze::hops::{Reported, minute_of};
use crate::otlp::normalize::{resource_service, stored_name};

/// The deadline metrics' names and attribute keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricNames {
    /// Histogram of the budget a hop received with each request.
    pub received: String,
    /// Histogram of the budget left when the hop answered.
    pub remaining: String,
    /// Counter of requests that ran out of budget, by origin.
    pub exceeded: String,
    /// The attribute naming the hop: the operation, as its server spans name it.
    pub hop_key: String,
    /// The attribute saying whose deadline ran out: `local` or `inherited`.
    pub origin_key: String,
}

impl Default for MetricNames {
    fn default() -> Self {
        MetricNames {
            received: "deadline.budget_received".into(),
            remaining: "deadline.budget_remaining".into(),
            exceeded: "deadline.exceeded".into(),
            hop_key: "hop".into(),
            origin_key: "origin".into(),
        }
    }
}

/// At most this many cumulative series are held: bounds the memory a misbehaving exporter
/// (an attribute with unbounded values) can take; beyond it, new series are refused.
pub const MAX_SERIES: usize = 100_000;

/// A series not seen for this long is forgotten when room is needed.
const STALE: Duration = Duration::from_secs(3600);

/// A data point's values: a histogram's count and sum (ms), or a counter's value (count).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Values {
    count: f64,
    sum: f64,
}

/// The last point of a cumulative series.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Last {
    start: u64,
    values: Values,
    /// When it arrived (wall clock, unix nanoseconds).
    seen: u64,
}

/// The cumulative series seen so far, each by its last point.
#[derive(Debug)]
pub struct Cumulative {
    series: HashMap<String, Last>,
    /// When this server started (unix nanoseconds).
    started: u64,
    max_series: usize,
}

impl Cumulative {
    pub fn new(started_unix_nano: u64) -> Cumulative {
        Cumulative::with_limit(started_unix_nano, MAX_SERIES)
    }

    pub fn with_limit(started_unix_nano: u64, max_series: usize) -> Cumulative {
        Cumulative {
            series: HashMap::new(),
            started: started_unix_nano,
            max_series,
        }
    }

    /// Takes the new last points of a request whose rows were stored; forgets series not
    /// seen for `STALE` once over the limit.
    pub fn advance(&mut self, updates: Vec<(String, Last)>, now: u64) {
        self.series.extend(updates);
        if self.series.len() >= self.max_series {
            let cutoff = now.saturating_sub(STALE.as_nanos() as u64);
            self.series.retain(|_, last| last.seen >= cutoff);
        }
    }

    pub fn len(&self) -> usize {
        self.series.len()
    }

    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }
}

/// What a request holds of the deadline metrics.
#[derive(Debug, Default)]
pub struct Extracted {
    /// Deltas per (service, hop, minute), keys distinct and sorted.
    pub rows: Vec<ReportedRow>,
    /// Data points of the deadline metrics read (baselines included), and left out.
    pub stored: i64,
    pub rejected: i64,
    /// Why, for the answer (empty when none was).
    pub message: String,
    /// The cumulative series' new last points, for `Cumulative::advance` once the rows
    /// are stored.
    pub advance: Vec<(String, Last)>,
}

#[derive(Clone, Copy, PartialEq)]
enum Which {
    Received,
    Remaining,
    Exceeded,
}

/// Milliseconds per unit of a histogram's values (UCUM units, as OpenTelemetry writes them).
fn ms_per_unit(unit: &str) -> Option<f64> {
    match unit.trim() {
        "" | "ms" | "{ms}" | "milliseconds" => Some(1.0),
        "s" | "seconds" => Some(1000.0),
        "us" | "µs" | "microseconds" => Some(0.001),
        "ns" | "nanoseconds" => Some(0.000_001),
        _ => None,
    }
}

fn string_attribute<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a str> {
    attributes.iter().find(|kv| kv.key == key).and_then(|kv| {
        match kv.value.as_ref()?.value.as_ref()? {
            any_value::Value::StringValue(text) if !text.is_empty() => Some(text.as_str()),
            _ => None,
        }
    })
}

/// Attributes in a canonical order, as text: part of a series' identity.
fn attributes_key(attributes: &[KeyValue]) -> String {
    let mut pairs: Vec<String> = attributes
        .iter()
        .map(|kv| format!("{:?}={:?}", kv.key, kv.value))
        .collect();
    pairs.sort();
    pairs.join(",")
}

/// One data point, whatever its metric type.
struct Point<'a> {
    attributes: &'a [KeyValue],
    start: u64,
    time: u64,
    flags: u32,
    /// `None`: the point has no value this reader can use (a histogram without a sum).
    values: Option<Values>,
}

impl<'a> Point<'a> {
    /// A histogram's point (explicit or exponential buckets: only the count and sum are read);
    /// `at` is (start, time, flags).
    fn histogram(
        attributes: &'a [KeyValue],
        (start, time, flags): (u64, u64, u32),
        count: u64,
        sum: Option<f64>,
    ) -> Point<'a> {
        Point {
            attributes,
            start,
            time,
            flags,
            values: sum.map(|sum| Values {
                count: count as f64,
                sum,
            }),
        }
    }
}

/// The request's rows, against the cumulative series seen so far (`now`: the wall clock).
pub fn extract(
    request: &ExportMetricsServiceRequest,
    names: &MetricNames,
    cumulative: &Cumulative,
    now: u64,
) -> Extracted {
    let mut rows: BTreeMap<(String, String, u64), Reported> = BTreeMap::new();
    let mut reasons: BTreeMap<String, i64> = BTreeMap::new();
    let mut advance: HashMap<String, Last> = HashMap::new();
    let mut stored = 0;
    // `n` data points left out for one reason.
    let mut reject_n = |reason: String, n: usize| *reasons.entry(reason).or_default() += n as i64;
    for resource_metrics in &request.resource_metrics {
        let resource = resource_metrics.resource.as_ref();
        let service = resource_service(resource);
        let resource_key = attributes_key(resource.map_or(&[], |r| &r.attributes[..]));
        for scope_metrics in &resource_metrics.scope_metrics {
            let scope = scope_metrics.scope.as_ref().map_or("", |s| s.name.as_str());
            for metric in &scope_metrics.metrics {
                let which = if metric.name == names.received {
                    Which::Received
                } else if metric.name == names.remaining {
                    Which::Remaining
                } else if metric.name == names.exceeded {
                    Which::Exceeded
                } else {
                    continue;
                };
                let (temporality, points): (i32, Vec<Point>) = match (&metric.data, which) {
                    (Some(Data::Histogram(h)), Which::Received | Which::Remaining) => (
                        h.aggregation_temporality,
                        h.data_points
                            .iter()
                            .map(|p| {
                                Point::histogram(
                                    &p.attributes,
                                    (p.start_time_unix_nano, p.time_unix_nano, p.flags),
                                    p.count,
                                    p.sum,
                                )
                            })
                            .collect(),
                    ),
                    (Some(Data::ExponentialHistogram(h)), Which::Received | Which::Remaining) => (
                        h.aggregation_temporality,
                        h.data_points
                            .iter()
                            .map(|p| {
                                Point::histogram(
                                    &p.attributes,
                                    (p.start_time_unix_nano, p.time_unix_nano, p.flags),
                                    p.count,
                                    p.sum,
                                )
                            })
                            .collect(),
                    ),
                    (Some(Data::Sum(s)), Which::Exceeded) => (
                        s.aggregation_temporality,
                        s.data_points
                            .iter()
                            .map(|p| {
                                use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value;
                                let value = match p.value {
                                    Some(Value::AsInt(v)) => Some(v as f64),
                                    Some(Value::AsDouble(v)) => Some(v),
                                    None => None,
                                };
                                Point {
                                    attributes: &p.attributes,
                                    start: p.start_time_unix_nano,
                                    time: p.time_unix_nano,
                                    flags: p.flags,
                                    values: value.map(|count| Values { count, sum: 0.0 }),
                                }
                            })
                            .collect(),
                    ),
                    (data, _) => {
                        let expected = if which == Which::Exceeded {
                            "a counter (Sum)"
                        } else {
                            "a histogram"
                        };
                        let got = match data {
                            Some(Data::Gauge(_)) => "a gauge",
                            Some(Data::Sum(_)) => "a counter",
                            Some(Data::Histogram(_) | Data::ExponentialHistogram(_)) => {
                                "a histogram"
                            }
                            Some(Data::Summary(_)) => "a summary",
                            None => "no data",
                        };
                        reject_n(
                            format!("{} must be {expected}, not {got}", metric.name),
                            data_point_count(data).max(1),
                        );
                        continue;
                    }
                };
                let scale = if which == Which::Exceeded {
                    Some(1.0)
                } else {
                    ms_per_unit(&metric.unit)
                };
                let Some(scale) = scale else {
                    reject_n(
                        format!("{} has unit {:?}; use ms or s", metric.name, metric.unit),
                        points.len(),
                    );
                    continue;
                };
                let cumulative_series = match AggregationTemporality::try_from(temporality) {
                    Ok(AggregationTemporality::Delta) => false,
                    Ok(AggregationTemporality::Cumulative) => true,
                    _ => {
                        reject_n(
                            format!(
                                "{} has no aggregation temporality (delta or cumulative)",
                                metric.name
                            ),
                            points.len(),
                        );
                        continue;
                    }
                };
                for point in points {
                    // No recorded value: the SDK says the series has a gap here.
                    if point.flags & 1 != 0 {
                        continue;
                    }
                    let Some(hop) = string_attribute(point.attributes, &names.hop_key) else {
                        reject_n(
                            format!(
                                "{} data points need a `{}` attribute naming the operation",
                                metric.name, names.hop_key
                            ),
                            1,
                        );
                        continue;
                    };
                    let origin = if which == Which::Exceeded {
                        match string_attribute(point.attributes, &names.origin_key)
                            .map(str::to_ascii_lowercase)
                            .as_deref()
                        {
                            Some("local") => Some(true),
                            Some("inherited") => Some(false),
                            _ => {
                                reject_n(
                                    format!(
                                        "{} data points need `{}` = local or inherited",
                                        metric.name, names.origin_key
                                    ),
                                    1,
                                );
                                continue;
                            }
                        }
                    } else {
                        None
                    };
                    let Some(values) = point
                        .values
                        .filter(|v| v.count.is_finite() && v.sum.is_finite() && v.count >= 0.0)
                    else {
                        reject_n(
                            format!("{} data points need a count and a sum", metric.name),
                            1,
                        );
                        continue;
                    };
                    if point.time == 0 {
                        reject_n(format!("{} data points need a time", metric.name), 1);
                        continue;
                    }
                    let delta = if cumulative_series {
                        let key = format!(
                            "{resource_key}\u{1}{scope}\u{1}{}\u{1}{}",
                            metric.name,
                            attributes_key(point.attributes)
                        );
                        let last = advance
                            .get(&key)
                            .or_else(|| cumulative.series.get(&key))
                            .copied();
                        let delta = match last {
                            Some(last)
                                if last.start == point.start
                                    && values.count >= last.values.count =>
                            {
                                Values {
                                    count: values.count - last.values.count,
                                    sum: values.sum - last.values.sum,
                                }
                            }
                            // A new start time or a lower count: the series started over.
                            Some(_) => values,
                            None if cumulative.series.len() + advance.len()
                                >= cumulative.max_series =>
                            {
                                reject_n(
                                    format!(
                                        "more than {} cumulative series are held; export with \
                                     delta temporality",
                                        cumulative.max_series
                                    ),
                                    1,
                                );
                                continue;
                            }
                            // The series began after this server started: all of it is new.
                            None if point.start != 0 && point.start >= cumulative.started => values,
                            // A baseline: what came before was not this server's to see.
                            None => Values {
                                count: 0.0,
                                sum: 0.0,
                            },
                        };
                        advance.insert(
                            key,
                            Last {
                                start: point.start,
                                values,
                                seen: now,
                            },
                        );
                        delta
                    } else {
                        values
                    };
                    stored += 1;
                    let row = rows
                        .entry((service.clone(), stored_name(hop), minute_of(point.time)))
                        .or_default();
                    match (which, origin) {
                        (Which::Exceeded, Some(true)) => {
                            row.local_exceeds += delta.count.round() as i64
                        }
                        (Which::Exceeded, _) => row.inherited_exceeds += delta.count.round() as i64,
                        (Which::Received, _) => {
                            row.received_count += delta.count.round() as i64;
                            row.received_sum_ms += delta.sum * scale;
                        }
                        (Which::Remaining, _) => {
                            row.remaining_count += delta.count.round() as i64;
                            row.remaining_sum_ms += delta.sum * scale;
                        }
                    }
                }
            }
        }
    }
    let rejected = reasons.values().sum();
    let message = if rejected == 0 {
        String::new()
    } else {
        let why: Vec<String> = reasons
            .iter()
            .map(|(reason, n)| format!("{n} × {reason}"))
            .collect();
        format!(
            "{rejected} data points of the deadline metrics were left out: {}",
            why.join("; ")
        )
    };
    Extracted {
        rows: rows
            .into_iter()
            .filter(|(_, reported)| !reported.is_empty())
            .map(|((service, operation, minute), reported)| ReportedRow {
                service,
                operation,
                minute_unix_nano: minute,
                reported,
            })
            .collect(),
        stored,
        rejected,
        message,
        advance: advance.into_iter().collect(),
    }
}

fn data_point_count(data: &Option<Data>) -> usize {
    match data {
        Some(Data::Gauge(g)) => g.data_points.len(),
        Some(Data::Sum(s)) => s.data_points.len(),
        Some(Data::Histogram(h)) => h.data_points.len(),
        Some(Data::ExponentialHistogram(h)) => h.data_points.len(),
        Some(Data::Summary(s)) => s.data_points.len(),
        None => 0,
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
    use opentelemetry_proto::tonic::metrics::v1::{
        Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint, ResourceMetrics,
        ScopeMetrics, Sum, metric::Data, number_data_point,
    };
    use opentelemetry_proto::tonic::resource::v1::Resource;

    use super::*;

    const MINUTE: u64 = 60_000_000_000;
    const T0: u64 = 1_000 * MINUTE;
    const DELTA: i32 = AggregationTemporality::Delta as i32;
    const CUMULATIVE: i32 = AggregationTemporality::Cumulative as i32;

    fn kv(key: &str, value: &str) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue(value.into())),
            }),
            ..KeyValue::default()
        }
    }

    fn request(service: &str, metrics: Vec<Metric>) -> ExportMetricsServiceRequest {
        ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: Some(Resource {
                    attributes: vec![kv("service.name", service)],
                    ..Resource::default()
                }),
                scope_metrics: vec![ScopeMetrics {
                    metrics,
                    ..ScopeMetrics::default()
                }],
                ..ResourceMetrics::default()
            }],
        }
    }

    fn exceeded(temporality: i32, points: &[(&str, &str, u64, u64, i64)]) -> Metric {
        Metric {
            name: "deadline.exceeded".into(),
            data: Some(Data::Sum(Sum {
                aggregation_temporality: temporality,
                is_monotonic: true,
                data_points: points
                    .iter()
                    .map(|(hop, origin, start, time, value)| NumberDataPoint {
                        attributes: vec![kv("hop", hop), kv("origin", origin)],
                        start_time_unix_nano: *start,
                        time_unix_nano: *time,
                        value: Some(number_data_point::Value::AsInt(*value)),
                        ..NumberDataPoint::default()
                    })
                    .collect(),
            })),
            ..Metric::default()
        }
    }

    fn histogram(
        name: &str,
        unit: &str,
        temporality: i32,
        points: &[(&str, u64, u64, u64, f64)],
    ) -> Metric {
        Metric {
            name: name.into(),
            unit: unit.into(),
            data: Some(Data::Histogram(Histogram {
                aggregation_temporality: temporality,
                data_points: points
                    .iter()
                    .map(|(hop, start, time, count, sum)| HistogramDataPoint {
                        attributes: vec![kv("hop", hop)],
                        start_time_unix_nano: *start,
                        time_unix_nano: *time,
                        count: *count,
                        sum: Some(*sum),
                        ..HistogramDataPoint::default()
                    })
                    .collect(),
            })),
            ..Metric::default()
        }
    }

    fn one(extracted: &Extracted) -> Reported {
        assert_eq!(extracted.rows.len(), 1, "{:?}", extracted.rows);
        extracted.rows[0].reported
    }

    #[test]
    fn delta_points_become_rows_per_service_hop_and_minute() {
        let names = MetricNames::default();
        let state = Cumulative::new(0);
        let req = request(
            "checkout",
            vec![
                exceeded(
                    DELTA,
                    &[
                        ("POST /pay", "local", T0, T0 + 5, 7),
                        ("POST /pay", "inherited", T0, T0 + 5, 3),
                        ("POST /pay", "LOCAL", T0, T0 + MINUTE + 1, 2),
                    ],
                ),
                histogram(
                    "deadline.budget_received",
                    "s",
                    DELTA,
                    &[("POST /pay", T0, T0 + 5, 10, 8.0)],
                ),
                histogram(
                    "deadline.budget_remaining",
                    "ms",
                    DELTA,
                    &[("POST /pay", T0, T0 + 5, 10, 1500.0)],
                ),
                // Not ours: ignored without a word.
                histogram(
                    "http.server.duration",
                    "ms",
                    DELTA,
                    &[("x", T0, T0 + 5, 1, 1.0)],
                ),
            ],
        );
        let out = extract(&req, &names, &state, 0);
        assert_eq!(out.rejected, 0, "{}", out.message);
        assert_eq!(out.message, "");
        assert_eq!(out.rows.len(), 2);
        let first = &out.rows[0];
        assert_eq!(
            (
                first.service.as_str(),
                first.operation.as_str(),
                first.minute_unix_nano
            ),
            ("checkout", "POST /pay", T0)
        );
        assert_eq!(
            first.reported,
            Reported {
                local_exceeds: 7,
                inherited_exceeds: 3,
                received_count: 10,
                received_sum_ms: 8000.0,
                remaining_count: 10,
                remaining_sum_ms: 1500.0,
            }
        );
        assert_eq!(out.rows[1].minute_unix_nano, T0 + MINUTE);
        assert_eq!(out.rows[1].reported.local_exceeds, 2);
        assert!(out.advance.is_empty(), "delta series hold no state");
    }

    #[test]
    fn cumulative_points_become_deltas_and_a_restart_starts_over() {
        let names = MetricNames::default();
        let mut state = Cumulative::new(T0 - MINUTE);
        // A series that started before this server: its first point is a baseline.
        let before = T0 - 2 * MINUTE;
        let out = extract(
            &request(
                "orders",
                vec![exceeded(
                    CUMULATIVE,
                    &[("GET /o", "local", before, T0, 100)],
                )],
            ),
            &names,
            &state,
            T0,
        );
        assert!(out.rows.is_empty(), "{:?}", out.rows);
        assert_eq!(out.rejected, 0);
        state.advance(out.advance, T0);
        let out = extract(
            &request(
                "orders",
                vec![exceeded(
                    CUMULATIVE,
                    &[("GET /o", "local", before, T0 + MINUTE, 130)],
                )],
            ),
            &names,
            &state,
            T0,
        );
        assert_eq!(one(&out).local_exceeds, 30);
        // Not advanced (the write failed): the same point gives the same delta again.
        let again = extract(
            &request(
                "orders",
                vec![exceeded(
                    CUMULATIVE,
                    &[("GET /o", "local", before, T0 + MINUTE, 130)],
                )],
            ),
            &names,
            &state,
            T0,
        );
        assert_eq!(one(&again).local_exceeds, 30);
        state.advance(out.advance, T0);
        // The process restarted: a new start time, all of it counts.
        let out = extract(
            &request(
                "orders",
                vec![exceeded(
                    CUMULATIVE,
                    &[("GET /o", "local", T0 + MINUTE, T0 + 2 * MINUTE, 4)],
                )],
            ),
            &names,
            &state,
            T0,
        );
        assert_eq!(one(&out).local_exceeds, 4);
        state.advance(out.advance, T0);
        // A series that began after this server started counts from its first point; two
        // points of one series in one request each count once.
        let out = extract(
            &request(
                "orders",
                vec![histogram(
                    "deadline.budget_received",
                    "ms",
                    CUMULATIVE,
                    &[
                        ("GET /o", T0, T0 + 10, 2, 300.0),
                        ("GET /o", T0, T0 + 20, 5, 800.0),
                    ],
                )],
            ),
            &names,
            &state,
            T0,
        );
        assert_eq!(one(&out).received_count, 5);
        assert_eq!(one(&out).received_sum_ms, 800.0);
    }

    #[test]
    fn unreadable_points_are_left_out_and_counted_never_the_good_ones() {
        let names = MetricNames::default();
        let state = Cumulative::new(0);
        let mut no_hop = exceeded(DELTA, &[("GET /", "local", T0, T0 + 1, 1)]);
        if let Some(Data::Sum(sum)) = &mut no_hop.data {
            sum.data_points[0].attributes.retain(|kv| kv.key != "hop");
        }
        let gauge = Metric {
            name: "deadline.exceeded".into(),
            data: Some(Data::Gauge(Gauge {
                data_points: vec![NumberDataPoint::default(), NumberDataPoint::default()],
            })),
            ..Metric::default()
        };
        let req = request(
            "api",
            vec![
                no_hop,
                exceeded(DELTA, &[("GET /", "upstream", T0, T0 + 1, 1)]),
                gauge,
                histogram(
                    "deadline.budget_received",
                    "furlongs",
                    DELTA,
                    &[("GET /", T0, T0 + 1, 1, 1.0)],
                ),
                exceeded(0, &[("GET /", "local", T0, T0 + 1, 1)]),
                exceeded(DELTA, &[("GET /", "local", T0, 0, 1)]),
                exceeded(DELTA, &[("GET /", "local", T0, T0 + 1, 9)]),
            ],
        );
        let out = extract(&req, &names, &state, 0);
        assert_eq!(one(&out).local_exceeds, 9, "the good point is kept");
        assert_eq!(out.rejected, 7, "{}", out.message);
        for part in [
            "need a `hop` attribute",
            "`origin` = local or inherited",
            "2 × deadline.exceeded must be a counter (Sum), not a gauge",
            "unit \"furlongs\"",
            "no aggregation temporality",
            "need a time",
        ] {
            assert!(out.message.contains(part), "{part:?} in {}", out.message);
        }
    }

    #[test]
    fn names_and_keys_are_configurable_and_names_match_the_spans() {
        let names = MetricNames {
            exceeded: "rpc.deadline_exceeded".into(),
            hop_key: "rpc.method".into(),
            origin_key: "cause".into(),
            ..MetricNames::default()
        };
        let mut metric = exceeded(DELTA, &[("ignored", "ignored", T0, T0 + 1, 5)]);
        metric.name = "rpc.deadline_exceeded".into();
        if let Some(Data::Sum(sum)) = &mut metric.data {
            sum.data_points[0].attributes =
                vec![kv("rpc.method", "Charge\0"), kv("cause", "inherited")];
        }
        let out = extract(
            &request("billing", vec![metric]),
            &names,
            &Cumulative::new(0),
            0,
        );
        assert_eq!(
            out.rows[0].operation, "Charge\u{FFFD}",
            "NULs replaced as in span names"
        );
        assert_eq!(one(&out).inherited_exceeds, 5);
        // No service.name: the spans' unknown_service.
        let mut req = request("x", vec![exceeded(DELTA, &[("a", "local", T0, T0 + 1, 1)])]);
        req.resource_metrics[0].resource = None;
        let out = extract(&req, &MetricNames::default(), &Cumulative::new(0), 0);
        assert_eq!(out.rows[0].service, crate::otlp::normalize::UNKNOWN_SERVICE);
    }

    #[test]
    fn cumulative_series_are_bounded() {
        let names = MetricNames::default();
        let mut state = Cumulative::with_limit(0, 2);
        let points: Vec<(&str, &str, u64, u64, i64)> = vec![
            ("a", "local", 1, T0, 1),
            ("b", "local", 1, T0, 1),
            ("c", "local", 1, T0, 1),
        ];
        let out = extract(
            &request("s", vec![exceeded(CUMULATIVE, &points)]),
            &names,
            &state,
            T0,
        );
        assert_eq!(out.rejected, 1, "{}", out.message);
        assert!(out.message.contains("delta temporality"), "{}", out.message);
        state.advance(out.advance, T0);
        assert_eq!(state.len(), 2);
        // An hour later the old series are forgotten when room is needed.
        let later = T0 + 2 * STALE.as_nanos() as u64;
        let out = extract(
            &request(
                "s",
                vec![exceeded(CUMULATIVE, &[("c", "local", 1, later, 1)])],
            ),
            &names,
            &state,
            later,
        );
        assert_eq!(out.rejected, 1);
        state.advance(out.advance, later);
        assert!(state.is_empty(), "stale series forgotten");
    }
}

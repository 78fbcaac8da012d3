//! `protobuf.rs` for OTLP metrics requests: a protobuf decoder that survives text that is not
//! UTF-8, so one badly encoded attribute or name does not lose the data points sent beside
//! it. The mirror messages hold what `deadline_metrics::extract` reads (names, units, the
//! kind of data, temporality, and each point's attributes, times, flags, count, sum or
//! value; of gauges and summaries only how many points they have), so a repaired request
//! is read as the same request would be with its text valid. `decode::decode_metrics` tries
//! the generated types first.
//!
//! Field numbers follow opentelemetry-proto's metrics.proto (v1); prost skips the others.

use opentelemetry_proto::tonic::collector::metrics::v1 as collector;
use opentelemetry_proto::tonic::common::v1 as common;
use opentelemetry_proto::tonic::metrics::v1 as metrics;
use opentelemetry_proto::tonic::resource::v1 as resource;
use prost::DecodeError;

use super::protobuf::{KeyValue, Resource, Scope, Text};

#[derive(Clone, PartialEq, prost::Message)]
pub struct ExportRequest {
    #[prost(message, repeated, tag = "1")]
    resource_metrics: Vec<ResourceMetrics>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ResourceMetrics {
    #[prost(message, optional, tag = "1")]
    resource: Option<Resource>,
    #[prost(message, repeated, tag = "2")]
    scope_metrics: Vec<ScopeMetrics>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ScopeMetrics {
    #[prost(message, optional, tag = "1")]
    scope: Option<Scope>,
    #[prost(message, repeated, tag = "2")]
    metrics: Vec<Metric>,
}

/// `Metric`, its `data` oneof as one optional field per kind (at most one is sent).
#[derive(Clone, PartialEq, prost::Message)]
struct Metric {
    #[prost(bytes = "vec", tag = "1")]
    name: Vec<u8>,
    #[prost(bytes = "vec", tag = "3")]
    unit: Vec<u8>,
    #[prost(message, optional, tag = "5")]
    gauge: Option<Points>,
    #[prost(message, optional, tag = "7")]
    sum: Option<Sum>,
    #[prost(message, optional, tag = "9")]
    histogram: Option<Histogram>,
    #[prost(message, optional, tag = "10")]
    exponential_histogram: Option<ExponentialHistogram>,
    #[prost(message, optional, tag = "11")]
    summary: Option<Points>,
}

/// A gauge's or a summary's points, only counted.
#[derive(Clone, PartialEq, prost::Message)]
struct Points {
    #[prost(message, repeated, tag = "1")]
    data_points: Vec<Counted>,
}

/// A data point whose fields are not read.
#[derive(Clone, PartialEq, prost::Message)]
struct Counted {}

#[derive(Clone, PartialEq, prost::Message)]
struct Sum {
    #[prost(message, repeated, tag = "1")]
    data_points: Vec<NumberDataPoint>,
    #[prost(int32, tag = "2")]
    aggregation_temporality: i32,
    #[prost(bool, tag = "3")]
    is_monotonic: bool,
}

/// `NumberDataPoint`, its `value` oneof as two optional fields.
#[derive(Clone, PartialEq, prost::Message)]
struct NumberDataPoint {
    #[prost(message, repeated, tag = "7")]
    attributes: Vec<KeyValue>,
    #[prost(fixed64, tag = "2")]
    start_time_unix_nano: u64,
    #[prost(fixed64, tag = "3")]
    time_unix_nano: u64,
    #[prost(double, optional, tag = "4")]
    as_double: Option<f64>,
    #[prost(sfixed64, optional, tag = "6")]
    as_int: Option<i64>,
    #[prost(uint32, tag = "8")]
    flags: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Histogram {
    #[prost(message, repeated, tag = "1")]
    data_points: Vec<HistogramDataPoint>,
    #[prost(int32, tag = "2")]
    aggregation_temporality: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
struct HistogramDataPoint {
    #[prost(message, repeated, tag = "9")]
    attributes: Vec<KeyValue>,
    #[prost(fixed64, tag = "2")]
    start_time_unix_nano: u64,
    #[prost(fixed64, tag = "3")]
    time_unix_nano: u64,
    #[prost(fixed64, tag = "4")]
    count: u64,
    #[prost(double, optional, tag = "5")]
    sum: Option<f64>,
    #[prost(uint32, tag = "10")]
    flags: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ExponentialHistogram {
    #[prost(message, repeated, tag = "1")]
    data_points: Vec<ExponentialHistogramDataPoint>,
    #[prost(int32, tag = "2")]
    aggregation_temporality: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ExponentialHistogramDataPoint {
    #[prost(message, repeated, tag = "1")]
    attributes: Vec<KeyValue>,
    #[prost(fixed64, tag = "2")]
    start_time_unix_nano: u64,
    #[prost(fixed64, tag = "3")]
    time_unix_nano: u64,
    #[prost(fixed64, tag = "4")]
    count: u64,
    #[prost(double, optional, tag = "5")]
    sum: Option<f64>,
    #[prost(uint32, tag = "10")]
    flags: u32,
}

/// An exponential histogram read as an explicit one: `extract` reads only the points'
/// counts and sums, alike for both kinds.
impl From<ExponentialHistogram> for Histogram {
    fn from(h: ExponentialHistogram) -> Histogram {
        Histogram {
            data_points: h
                .data_points
                .into_iter()
                .map(|p| HistogramDataPoint {
                    attributes: p.attributes,
                    start_time_unix_nano: p.start_time_unix_nano,
                    time_unix_nano: p.time_unix_nano,
                    count: p.count,
                    sum: p.sum,
                    flags: p.flags,
                })
                .collect(),
            aggregation_temporality: h.aggregation_temporality,
        }
    }
}

/// Decodes a body the generated OTLP types refused with the mirror types, and tells
/// whether text had to be repaired.
pub fn decode_mirror(
    body: bytes::Bytes,
) -> Result<(collector::ExportMetricsServiceRequest, bool), DecodeError> {
    use prost::Message as _;
    ExportRequest::decode(body)?.into_request()
}

impl ExportRequest {
    /// The OTLP request with what `extract` reads, and whether any text was not valid
    /// UTF-8 and was repaired; an error when an attribute value is not a valid `AnyValue`.
    pub fn into_request(
        self,
    ) -> Result<(collector::ExportMetricsServiceRequest, bool), DecodeError> {
        let mut text = Text::default();
        let mut resource_metrics = Vec::with_capacity(self.resource_metrics.len());
        for rm in self.resource_metrics {
            let resource = match rm.resource {
                Some(r) => Some(resource::Resource {
                    attributes: text.attributes(r.attributes)?,
                    ..Default::default()
                }),
                None => None,
            };
            let mut scope_metrics = Vec::with_capacity(rm.scope_metrics.len());
            for sm in rm.scope_metrics {
                let scope = sm.scope.map(|s| common::InstrumentationScope {
                    name: text.string(s.name),
                    version: text.string(s.version),
                    ..Default::default()
                });
                let metrics = sm
                    .metrics
                    .into_iter()
                    .map(|m| text.metric(m))
                    .collect::<Result<_, _>>()?;
                scope_metrics.push(metrics::ScopeMetrics {
                    scope,
                    metrics,
                    ..Default::default()
                });
            }
            resource_metrics.push(metrics::ResourceMetrics {
                resource,
                scope_metrics,
                ..Default::default()
            });
        }
        Ok((
            collector::ExportMetricsServiceRequest { resource_metrics },
            text.repaired,
        ))
    }
}

/// As many default points as `points` has.
fn counted<T: Default + Clone>(points: Points) -> Vec<T> {
    vec![T::default(); points.data_points.len()]
}

impl Text {
    fn metric(&mut self, metric: Metric) -> Result<metrics::Metric, DecodeError> {
        use metrics::metric::Data;
        let data = if let Some(sum) = metric.sum {
            let mut data_points = Vec::with_capacity(sum.data_points.len());
            for p in sum.data_points {
                use metrics::number_data_point::Value;
                data_points.push(metrics::NumberDataPoint {
                    attributes: self.attributes(p.attributes)?,
                    start_time_unix_nano: p.start_time_unix_nano,
                    time_unix_nano: p.time_unix_nano,
                    value: p
                        .as_int
                        .map(Value::AsInt)
                        .or(p.as_double.map(Value::AsDouble)),
                    flags: p.flags,
                    ..Default::default()
                });
            }
            Some(Data::Sum(metrics::Sum {
                data_points,
                aggregation_temporality: sum.aggregation_temporality,
                is_monotonic: sum.is_monotonic,
            }))
        } else if let Some(histogram) = metric
            .histogram
            .or(metric.exponential_histogram.map(Histogram::from))
        {
            let mut data_points = Vec::with_capacity(histogram.data_points.len());
            for p in histogram.data_points {
                data_points.push(metrics::HistogramDataPoint {
                    attributes: self.attributes(p.attributes)?,
                    start_time_unix_nano: p.start_time_unix_nano,
                    time_unix_nano: p.time_unix_nano,
                    count: p.count,
                    sum: p.sum,
                    flags: p.flags,
                    ..Default::default()
                });
            }
            Some(Data::Histogram(metrics::Histogram {
                data_points,
                aggregation_temporality: histogram.aggregation_temporality,
            }))
        } else if let Some(gauge) = metric.gauge {
            Some(Data::Gauge(metrics::Gauge {
                data_points: counted(gauge),
            }))
        } else {
            metric.summary.map(|summary| {
                Data::Summary(metrics::Summary {
                    data_points: counted(summary),
                })
            })
        };
        Ok(metrics::Metric {
            name: self.string(metric.name),
            unit: self.string(metric.unit),
            data,
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    fn kv(key: &str, value: &str) -> common::KeyValue {
        common::KeyValue {
            key: key.into(),
            value: Some(common::AnyValue {
                value: Some(common::any_value::Value::StringValue(value.into())),
            }),
            ..Default::default()
        }
    }

    /// A request with every kind of data `extract` reads, the fields it reads set.
    fn request(hop: &str) -> collector::ExportMetricsServiceRequest {
        use metrics::metric::Data;
        let metric = |name: &str, unit: &str, data| metrics::Metric {
            name: name.into(),
            unit: unit.into(),
            data: Some(data),
            ..Default::default()
        };
        collector::ExportMetricsServiceRequest {
            resource_metrics: vec![metrics::ResourceMetrics {
                resource: Some(resource::Resource {
                    attributes: vec![kv("service.name", "billing")],
                    ..Default::default()
                }),
                scope_metrics: vec![metrics::ScopeMetrics {
                    scope: Some(common::InstrumentationScope {
                        name: "s".into(),
                        version: "1".into(),
                        ..Default::default()
                    }),
                    metrics: vec![
                        metric(
                            "deadline.exceeded",
                            "",
                            Data::Sum(metrics::Sum {
                                data_points: vec![metrics::NumberDataPoint {
                                    attributes: vec![kv("hop", hop), kv("origin", "local")],
                                    start_time_unix_nano: 1,
                                    time_unix_nano: 2,
                                    value: Some(metrics::number_data_point::Value::AsInt(3)),
                                    flags: 0,
                                    ..Default::default()
                                }],
                                aggregation_temporality: 1,
                                is_monotonic: true,
                            }),
                        ),
                        metric(
                            "deadline.budget_received",
                            "ms",
                            Data::Histogram(metrics::Histogram {
                                data_points: vec![metrics::HistogramDataPoint {
                                    attributes: vec![kv("hop", hop)],
                                    start_time_unix_nano: 1,
                                    time_unix_nano: 2,
                                    count: 4,
                                    sum: Some(800.5),
                                    ..Default::default()
                                }],
                                aggregation_temporality: 2,
                            }),
                        ),
                        metric(
                            "deadline.budget_remaining",
                            "s",
                            Data::ExponentialHistogram(metrics::ExponentialHistogram {
                                data_points: vec![metrics::ExponentialHistogramDataPoint {
                                    attributes: vec![kv("hop", hop)],
                                    start_time_unix_nano: 1,
                                    time_unix_nano: 2,
                                    count: 4,
                                    sum: Some(0.25),
                                    flags: 1,
                                    ..Default::default()
                                }],
                                aggregation_temporality: 1,
                            }),
                        ),
                        metric(
                            "process.load",
                            "1",
                            Data::Gauge(metrics::Gauge {
                                data_points: vec![Default::default(); 2],
                            }),
                        ),
                    ],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    /// What the deadline metrics take from a request.
    fn extracted(request: &collector::ExportMetricsServiceRequest) -> String {
        use crate::otlp::deadline_metrics::{Cumulative, MetricNames, extract};
        let out = extract(request, &MetricNames::default(), &Cumulative::new(0), 10);
        format!("{:?} {} {}", out.rows, out.rejected, out.message)
    }

    /// The protobuf path of `decode::decode_metrics`, as (request, repaired).
    fn decode_metrics_request(
        body: bytes::Bytes,
    ) -> Result<(collector::ExportMetricsServiceRequest, bool), crate::otlp::decode::DecodeError>
    {
        crate::otlp::decode::decode_metrics(body, crate::otlp::decode::Format::Protobuf)
            .map(|d| (d.request, d.repaired))
    }

    #[test]
    fn valid_requests_decode_to_what_the_generated_types_give_the_metrics() {
        let original = request("POST /pay");
        let (decoded, repaired) = ExportRequest::decode(original.encode_to_vec().as_slice())
            .unwrap()
            .into_request()
            .unwrap();
        assert!(!repaired);
        assert_eq!(extracted(&decoded), extracted(&original));
        assert!(extracted(&original).contains("local_exceeds: 3"));
        assert_eq!(
            decode_metrics_request(original.encode_to_vec().into()).unwrap(),
            (original, false)
        );
    }

    #[test]
    fn text_that_is_not_utf8_is_repaired_and_the_points_kept() {
        // The same request with a hop name of the same length, then its bytes broken.
        let body = request("POST /p\u{7f}y").encode_to_vec();
        let at = body.windows(8).position(|w| w == b"POST /p\x7f").unwrap() + 7;
        let mut broken = body.clone();
        broken[at] = 0xff;
        assert!(collector::ExportMetricsServiceRequest::decode(broken.as_slice()).is_err());
        let (decoded, repaired) = decode_metrics_request(broken.into()).unwrap();
        assert!(repaired);
        let mut expected = request("POST /p\u{7f}y");
        let points = &mut expected.resource_metrics[0].scope_metrics[0].metrics[0];
        if let Some(metrics::metric::Data::Sum(sum)) = &mut points.data {
            sum.data_points[0].attributes[0] = kv("hop", "POST /p\u{fffd}y");
        }
        assert_eq!(extracted(&decoded), extracted(&expected));
        assert!(decode_metrics_request(bytes::Bytes::from_static(b"\xff\xff\xff")).is_err());
    }
}

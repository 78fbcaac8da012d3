//! `/metrics`: Prometheus (OpenMetrics) text. Per-hop counters and histograms fed by the
//! hop-rollup changes the background analyzer writes, the server's own counters, and
//! gauges read at scrape time (alert instances, the ingest queue).
//!
//! Architecture invariant: counters only go up. A re-analysed trace (a late span) changes
//! rollups by its new contribution minus its old; a per-hop counter takes the positive part
//! of that change and never goes down (ARCHITECTURE.md, "Known quirks"). Each instance
//! counts what it analysed itself, so several instances sum to the whole.

use std::collections::HashSet;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::core::alerts::eval::Instance;
use crate::core::analyze::hops::RollupKey;
use crate::core::analyze::hops::{COUNTED, Rollup};
use crate::store::Compacted;

/// The most hop identities with series of their own; further hops are counted in
/// `budgetscope_metrics_hops_over_limit_total` instead, so a service that puts ids in its
/// span names cannot blow up a Prometheus server.
pub const MAX_HOPS: usize = 10_000;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Hop {
    service: String,
    operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HopExceed {
    service: String,
    operation: String,
    origin: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HopFlag {
    service: String,
    operation: String,
    flag: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AlertLabels {
    alertname: String,
    service: String,
    operation: String,
    state: String,
    severity: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Deleted {
    reason: &'static str,
}

/// Why traces were deleted before `--retention` (`budgetscope_traces_deleted_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeletedFor {
    /// Healthy, and older than `--retention-healthy`.
    RetentionHealthy,
    /// Healthy, and the oldest when the store neared `--max-disk`.
    MaxDiskHealthy,
    /// With a problem, and the oldest when the store neared `--max-disk` with no healthy
    /// trace left.
    MaxDisk,
}

impl DeletedFor {
    fn as_str(self) -> &'static str {
        match self {
            DeletedFor::RetentionHealthy => "retention_healthy",
            DeletedFor::MaxDiskHealthy => "max_disk_healthy",
            DeletedFor::MaxDisk => "max_disk",
        }
    }
}

/// What `/metrics` reads at scrape time.
pub struct Gauges<'a> {
    pub alerts: &'a [Instance],
    pub queued_spans: u64,
    /// The last measurement of the store's disk (`status::Disk`).
    pub disk: Option<crate::pipeline::status::Disk>,
}

type HistogramFamily = Family<Hop, Histogram, fn() -> Histogram>;

fn budget_histogram() -> Histogram {
    Histogram::new([
        0.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0,
    ])
}

fn burn_histogram() -> Histogram {
    Histogram::new([0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.0])
}

/// The server's metrics, shared by the receivers, the analyzer and the `/metrics` handler.
#[derive(Debug)]
pub struct Metrics {
    hop_requests: Family<Hop, Counter>,
    hop_exceeded: Family<HopExceed, Counter>,
    hop_flags: Family<HopFlag, Counter>,
    hop_ran_out: Family<Hop, Counter>,
    hop_wasted_ms: Family<Hop, Counter<f64, std::sync::atomic::AtomicU64>>,
    hop_budget: HistogramFamily,
    hop_burn: HistogramFamily,
    hops: Mutex<HashSet<(String, String)>>,
    hops_over_limit: Counter,
    pub spans_received: Counter,
    pub spans_rejected: Counter,
    pub spans_refused: Counter,
    pub spans_stored: Counter,
    /// Data points of the deadline metrics stored, and left out (unreadable), by the OTLP
    /// metrics receivers.
    pub metric_points_stored: Counter,
    pub metric_points_rejected: Counter,
    pub traces_analysed: Counter,
    /// Of `traces_analysed`, those whose spans were all held in memory (not read back).
    pub traces_analysed_from_memory: Counter,
    /// Of `traces_analysed`, those too large to analyse (`Outcome::TooLarge`).
    pub traces_too_large: Counter,
    /// Span rows moved into compressed blocks, the text they held and the blocks' bytes.
    spans_compacted: Counter,
    compacted_row_bytes: Counter,
    compacted_block_bytes: Counter,
    pub alert_evaluations: Counter,
    traces_deleted: Family<Deleted, Counter>,
    /// Seconds from a request's spans entering the ingest queue to their commit.
    pub commit_seconds: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            hop_requests: Family::default(),
            hop_exceeded: Family::default(),
            hop_flags: Family::default(),
            hop_ran_out: Family::default(),
            hop_wasted_ms: Family::default(),
            hop_budget: Family::new_with_constructor(budget_histogram),
            hop_burn: Family::new_with_constructor(burn_histogram),
            hops: Mutex::new(HashSet::new()),
            hops_over_limit: Counter::default(),
            spans_received: Counter::default(),
            spans_rejected: Counter::default(),
            spans_refused: Counter::default(),
            spans_stored: Counter::default(),
            metric_points_stored: Counter::default(),
            metric_points_rejected: Counter::default(),
            traces_analysed: Counter::default(),
            traces_analysed_from_memory: Counter::default(),
            traces_too_large: Counter::default(),
            spans_compacted: Counter::default(),
            compacted_row_bytes: Counter::default(),
            compacted_block_bytes: Counter::default(),
            alert_evaluations: Counter::default(),
            traces_deleted: Family::default(),
            commit_seconds: Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(0.001, 2.0, 14),
            ),
        }
    }
}

/// The positive part of a count change.
fn up(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

impl Metrics {
    /// Adds what one analyzer pass moved into blocks.
    pub fn record_compacted(&self, compacted: &Compacted) {
        self.spans_compacted.inc_by(compacted.spans);
        self.compacted_row_bytes.inc_by(compacted.row_bytes);
        self.compacted_block_bytes.inc_by(compacted.block_bytes);
    }

    /// Adds the rollup changes one analyzer pass wrote.
    pub fn record_rollups(&self, deltas: &[(RollupKey, Rollup)]) {
        for ((service, operation, _), delta) in deltas {
            {
                let mut hops = self.hops.lock().unwrap_or_else(|p| p.into_inner());
                let key = (service.clone(), operation.clone());
                if !hops.contains(&key) {
                    if hops.len() >= MAX_HOPS {
                        self.hops_over_limit.inc_by(up(delta.requests));
                        continue;
                    }
                    hops.insert(key);
                }
            }
            let hop = Hop {
                service: service.clone(),
                operation: operation.clone(),
            };
            self.hop_requests
                .get_or_create(&hop)
                .inc_by(up(delta.requests));
            for (name, count) in COUNTED.iter().zip(delta.counts) {
                if count <= 0 {
                    continue;
                }
                match *name {
                    "inherited_exceed" | "local_exceed" => {
                        let origin = name.trim_end_matches("_exceed").to_string();
                        self.hop_exceeded
                            .get_or_create(&HopExceed {
                                service: service.clone(),
                                operation: operation.clone(),
                                origin,
                            })
                            .inc_by(up(count));
                    }
                    "origin" => {
                        self.hop_ran_out.get_or_create(&hop).inc_by(up(count));
                    }
                    flag => {
                        self.hop_flags
                            .get_or_create(&HopFlag {
                                service: service.clone(),
                                operation: operation.clone(),
                                flag: flag.to_string(),
                            })
                            .inc_by(up(count));
                    }
                }
            }
            if delta.wasted_ms > 0.0 {
                self.hop_wasted_ms
                    .get_or_create(&hop)
                    .inc_by(delta.wasted_ms);
            }
            let budget = self.hop_budget.get_or_create(&hop);
            for (value, count) in delta.budget.points() {
                for _ in 0..count.max(0) {
                    budget.observe(value);
                }
            }
            let burn = self.hop_burn.get_or_create(&hop);
            for (value, count) in delta.burn.points() {
                for _ in 0..count.max(0) {
                    burn.observe(value);
                }
            }
        }
    }

    /// Counts traces deleted before `--retention`.
    pub fn traces_deleted(&self, reason: DeletedFor, traces: u64) {
        self.traces_deleted
            .get_or_create(&Deleted {
                reason: reason.as_str(),
            })
            .inc_by(traces);
    }

    /// Traces deleted before `--retention` for `reason` by this process.
    pub fn traces_deleted_for(&self, reason: DeletedFor) -> u64 {
        self.traces_deleted
            .get(&Deleted {
                reason: reason.as_str(),
            })
            .map_or(0, |counter| counter.get())
    }

    /// The exposition, with the gauges read at scrape time.
    pub fn render(&self, gauges: Gauges<'_>) -> String {
        let Gauges {
            alerts,
            queued_spans,
            disk,
        } = gauges;
        let mut registry = Registry::with_prefix("budgetscope");
        registry.register(
            "hop_requests",
            "Requests each hop identity (service, hop span name) handled, as analysed",
            self.hop_requests.clone(),
        );
        registry.register(
            "hop_deadline_exceeded",
            "Requests that exceeded their deadline at a hop: origin=local (the hop's own work) or inherited (arrived already spent)",
            self.hop_exceeded.clone(),
        );
        registry.register(
            "hop_flags",
            "Flags counted for a hop (on the hop, or on calls it made), by flag name",
            self.hop_flags.clone(),
        );
        registry.register(
            "hop_budget_ran_out",
            "Exceeded requests whose budget ran out at the hop (their origin hop)",
            self.hop_ran_out.clone(),
        );
        registry.register(
            "hop_wasted_milliseconds",
            "Work a hop did after its caller had given up, in milliseconds",
            self.hop_wasted_ms.clone(),
        );
        registry.register(
            "hop_budget_received_milliseconds",
            "Budget each request arrived at the hop with, in milliseconds",
            self.hop_budget.clone(),
        );
        registry.register(
            "hop_burn_ratio",
            "Share of the request budget spent in the hop's own work",
            self.hop_burn.clone(),
        );
        registry.register(
            "metrics_hops_over_limit",
            "Requests of hop identities beyond the series limit, not counted per hop",
            self.hops_over_limit.clone(),
        );
        registry.register(
            "spans_received",
            "Spans in export requests that were admitted",
            self.spans_received.clone(),
        );
        registry.register(
            "spans_rejected",
            "Invalid spans rejected one by one (partial_success)",
            self.spans_rejected.clone(),
        );
        registry.register(
            "spans_refused",
            "Spans refused with a retryable error (queue full or database failing)",
            self.spans_refused.clone(),
        );
        registry.register(
            "spans_stored",
            "Spans committed to the database",
            self.spans_stored.clone(),
        );
        registry.register(
            "deadline_metric_points_stored",
            "Data points of the deadline metrics (OTLP metrics) stored",
            self.metric_points_stored.clone(),
        );
        registry.register(
            "deadline_metric_points_rejected",
            "Data points of the deadline metrics left out as unreadable (partial_success says why)",
            self.metric_points_rejected.clone(),
        );
        registry.register(
            "traces_analysed",
            "Trace analyses written by the background analyzer",
            self.traces_analysed.clone(),
        );
        registry.register(
            "traces_analysed_from_memory",
            "Trace analyses whose spans were all still held in memory, so not read back from the store",
            self.traces_analysed_from_memory.clone(),
        );
        registry.register(
            "traces_too_large",
            "Traces summarised without analysis: larger than one pass of the analyzer may hold under --memory-limit",
            self.traces_too_large.clone(),
        );
        registry.register(
            "spans_compacted",
            "Spans of analysed traces moved from rows into their trace's compressed block",
            self.spans_compacted.clone(),
        );
        registry.register(
            "compacted_row_bytes",
            "Text of the span rows moved into blocks (compare with compacted_block_bytes for the compression)",
            self.compacted_row_bytes.clone(),
        );
        registry.register(
            "compacted_block_bytes",
            "Bytes of the compressed span blocks written (a rewritten block counts again)",
            self.compacted_block_bytes.clone(),
        );
        registry.register(
            "alert_evaluations",
            "Evaluations of the alert rules this instance ran to the end (failed ones are logged)",
            self.alert_evaluations.clone(),
        );
        registry.register(
            "traces_deleted",
            "Traces deleted before --retention: reason=retention_healthy (older than --retention-healthy), max_disk_healthy or max_disk (the oldest, near --max-disk); their hop statistics stay",
            self.traces_deleted.clone(),
        );
        if let Some(disk) = disk {
            let gauge = |bytes: u64| {
                let gauge: Gauge = Gauge::default();
                gauge.set(i64::try_from(bytes).unwrap_or(i64::MAX));
                gauge
            };
            registry.register(
                "store_bytes",
                "Bytes the store's files take (SQLite: the database and its WAL; Postgres: this schema's tables and indexes)",
                gauge(disk.usage.bytes),
            );
            if let Some(in_use) = disk.usage.in_use_bytes {
                registry.register(
                    "store_in_use_bytes",
                    "SQLite pages that hold data (free pages are reused before the file grows): what --max-disk caps",
                    gauge(in_use),
                );
            }
            if let Some(max) = disk.max_bytes {
                registry.register("store_max_bytes", "--max-disk", gauge(max));
            }
            registry.register(
                "traces_waiting_compaction",
                "Analysed traces whose span rows still wait to move into their compressed block (counted every minute)",
                gauge(disk.traces_waiting_compaction),
            );
        }
        registry.register(
            "ingest_commit_seconds",
            "Seconds from an export request's spans entering the ingest queue to their commit",
            self.commit_seconds.clone(),
        );
        let queue: Gauge = Gauge::default();
        queue.set(i64::try_from(queued_spans).unwrap_or(i64::MAX));
        registry.register(
            "ingest_queue_spans",
            "Spans accepted but not yet committed",
            queue,
        );
        let instances: Family<AlertLabels, Gauge> = Family::default();
        for instance in alerts {
            instances
                .get_or_create(&AlertLabels {
                    alertname: instance.rule.clone(),
                    service: instance.service.clone(),
                    operation: instance.operation.clone(),
                    state: instance.state.as_str().to_string(),
                    severity: instance.severity.as_str().to_string(),
                })
                .set(1);
        }
        registry.register(
            "alert_instances",
            "Alert instances that are pending, firing or recently resolved (1 each)",
            instances,
        );
        let mut text = String::new();
        if let Err(error) = prometheus_client::encoding::text::encode(&mut text, &registry) {
            tracing::error!(%error, "encoding /metrics failed");
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::analyze::hops::HopSample;

    #[test]
    fn counters_take_the_positive_part_of_rollup_changes() {
        let metrics = Metrics::default();
        let mut delta = Rollup::default();
        let mut counts = [0; COUNTED.len()];
        counts[1] = 1;
        counts[COUNTED.len() - 1] = 1;
        delta.add(
            &HopSample {
                service: "inventory".into(),
                operation: "GET /items".into(),
                start_unix_nano: 0,
                budget_ms: Some(120.0),
                burn: Some(0.3),
                self_ms: 10.0,
                counts,
                wasted_ms: 4.0,
                flags: Default::default(),
                spent: None,
                critical: Default::default(),
                calls: Vec::new(),
                advice: Default::default(),
            },
            1,
        );
        let key = ("inventory".to_string(), "GET /items".to_string(), 0);
        metrics.record_rollups(&[(key.clone(), delta.clone())]);
        let mut back = Rollup::default();
        back.unmerge(&delta);
        metrics.record_rollups(&[(key, back)]);
        metrics.traces_deleted(DeletedFor::MaxDiskHealthy, 3);
        let text = metrics.render(Gauges {
            alerts: &[],
            queued_spans: 7,
            disk: Some(crate::pipeline::status::Disk {
                usage: crate::store::DiskUsage {
                    bytes: 5000,
                    in_use_bytes: Some(4096),
                },
                max_bytes: Some(1 << 30),
                traces_waiting_compaction: 12,
            }),
        });
        for line in [
            "budgetscope_hop_requests_total{service=\"inventory\",operation=\"GET /items\"} 1",
            "budgetscope_hop_deadline_exceeded_total{service=\"inventory\",operation=\"GET /items\",origin=\"local\"} 1",
            "budgetscope_hop_budget_ran_out_total{service=\"inventory\",operation=\"GET /items\"} 1",
            "budgetscope_hop_wasted_milliseconds_total{service=\"inventory\",operation=\"GET /items\"} 4.0",
            "budgetscope_hop_budget_received_milliseconds_bucket{le=\"250.0\",service=\"inventory\",operation=\"GET /items\"} 1",
            "budgetscope_ingest_queue_spans 7",
            "budgetscope_traces_deleted_total{reason=\"max_disk_healthy\"} 3",
            "budgetscope_store_bytes 5000",
            "budgetscope_store_in_use_bytes 4096",
            "budgetscope_store_max_bytes 1073741824",
            "budgetscope_traces_waiting_compaction 12",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }
}

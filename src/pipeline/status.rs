//! How far the background analyzer is behind ingest: `GET /api/status`, the overview's
//! banner and a warning in the server log. One task measures every `PERIOD` (`run`);
//! readers take the last measurement.
//!
//! A trace waits for analysis from its last commit until it has been quiet for the quiet
//! period and then until the analyzer writes its summary. The lag is how long the trace
//! waiting longest has been quiet beyond the quiet period: search, hop statistics, the
//! overview and alerts miss every trace that waits, so they are that far behind. A trace
//! still receiving spans is not quiet and not lag: it is counted apart (`active_traces`)
//! and analysed every `--max-trace-wait` while it lasts.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::clock::now_unix_nano;
use crate::pipeline::ingest::Ingestor;
use crate::pipeline::lease::Lease;
use crate::pipeline::metrics::Metrics;
use crate::pipeline::reanalysis::{Progress, Reanalysis};
use crate::store::{DiskUsage, Store, StoreError};

/// How often `run` measures.
pub const PERIOD: Duration = Duration::from_secs(2);

/// Statistics further behind than this are shown as behind: the overview's banner, and a
/// warning in the log (again every `LOG_EVERY` while it lasts).
pub const BEHIND: Duration = Duration::from_secs(60);

const LOG_EVERY: Duration = Duration::from_secs(60);

/// The analysis rate is averaged over this long.
const RATE_WINDOW: Duration = Duration::from_secs(60);

/// Counting spans reads a whole index: it is done this often, and the spans this process
/// committed since are added in between (retention's deletes show at the next count).
const COUNT_EVERY: Duration = Duration::from_secs(60);

/// One measurement, as `GET /api/status` returns it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Status {
    /// `sqlite` or `postgres`.
    pub store: &'static str,
    pub spans_stored: u64,
    /// Traces with spans not yet analysed (including those still within the quiet period).
    pub traces_pending: u64,
    /// Pending traces that have waited longer than the quiet period because they are still
    /// receiving spans (not lag: each is analysed at `--max-trace-wait` and again when it
    /// goes quiet).
    pub active_traces: u64,
    /// Seconds since the trace waiting longest last had spans committed (0 when none waits).
    pub oldest_pending_age_s: f64,
    /// How far analysed statistics are behind: `oldest_pending_age_s` beyond the quiet period.
    pub analysis_lag_s: f64,
    pub quiet_period_s: f64,
    /// Traces analysed per second over the last minute.
    pub analyzed_traces_per_s: f64,
    /// Spans accepted and not yet committed.
    pub ingest_queue_spans: u64,
    /// `analysis_lag_s` is past a minute.
    pub behind: bool,
    /// This server holds the lease on the work one server does at a time (retention, alert
    /// evaluation and delivery, compaction): with several servers on one database, one of them does.
    pub holds_lease: bool,
    /// When this was measured, unix milliseconds.
    pub measured_unix_ms: u64,
    /// The re-analysis of stored traces analysed with other rules (`reanalysis.rs`); null
    /// when none was needed since this server started.
    pub reanalysis: Option<Progress>,
    /// What the store takes on disk.
    pub disk: Disk,
}

/// What the store takes on disk, and its cap.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Disk {
    #[serde(flatten)]
    pub usage: DiskUsage,
    /// `--max-disk`, when given.
    pub max_bytes: Option<u64>,
    /// Analysed traces whose span rows still wait to move into their compressed block
    /// (counted every `COUNT_EVERY`, with the spans).
    pub traces_waiting_compaction: u64,
}

/// Measures the status and keeps the last measurement.
pub struct Monitor {
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    ingest: Option<Arc<Ingestor>>,
    lease: Option<Arc<Lease>>,
    reanalysis: Option<Arc<Reanalysis>>,
    quiet_period: Duration,
    max_disk: Option<u64>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    last: Option<Status>,
    /// (when, traces analysed so far), over `RATE_WINDOW`.
    analysed: VecDeque<(Instant, u64)>,
    /// The last count of stored spans: (when, count, this process's committed spans then,
    /// whether no commit finished while it was counted).
    counted: Option<(Instant, u64, u64, bool)>,
    /// The last count of traces waiting for compaction.
    waiting_compaction: u64,
    /// When the lag was last logged, while it lasts.
    logged: Option<Instant>,
}

impl Monitor {
    pub fn new(
        store: Arc<dyn Store>,
        metrics: Arc<Metrics>,
        ingest: Option<Arc<Ingestor>>,
        lease: Option<Arc<Lease>>,
        reanalysis: Option<Arc<Reanalysis>>,
        quiet_period: Duration,
        max_disk: Option<u64>,
    ) -> Arc<Monitor> {
        Arc::new(Monitor {
            store,
            metrics,
            ingest,
            lease,
            reanalysis,
            quiet_period,
            max_disk,
            state: Mutex::default(),
        })
    }

    /// The last measurement, or a new one when there is none yet.
    pub async fn current(&self) -> Result<Status, StoreError> {
        match self.latest() {
            Some(status) => Ok(status),
            None => self.measure().await,
        }
    }

    /// The last measurement.
    pub fn latest(&self) -> Option<Status> {
        self.lock().last.clone()
    }

    /// Measures now and keeps the result.
    pub async fn measure(&self) -> Result<Status, StoreError> {
        let recount = self
            .lock()
            .counted
            .is_none_or(|(at, _, _, clean)| !clean || at.elapsed() >= COUNT_EVERY);
        // A commit that finished while the count ran may be in it or not: such a count is
        // kept only until a clean one replaces it (measured again at the next tick).
        let before = self.metrics.spans_stored.get();
        let count = match recount {
            true => Some((
                self.store.span_count().await?,
                self.store.compaction_waiting().await?,
            )),
            false => None,
        };
        let committed = self.metrics.spans_stored.get();
        let wall = now_unix_nano();
        let quiet_before = wall.saturating_sub(self.quiet_period.as_nanos() as u64);
        let backlog = self.store.analysis_backlog(quiet_before).await?;
        let usage = self.store.disk_usage().await?;
        let now = Instant::now();
        let analysed = self.metrics.traces_analysed.get();
        let mut state = self.lock();
        if let Some((count, waiting)) = count {
            state.waiting_compaction = waiting;
            let clean = before == committed;
            if clean || state.counted.is_none_or(|(_, _, _, clean)| !clean) {
                state.counted = Some((now, count, committed, clean));
            }
        }
        let (_, base, then, _) = state.counted.unwrap_or((now, 0, committed, false));
        state.analysed.push_back((now, analysed));
        while state
            .analysed
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > RATE_WINDOW)
        {
            state.analysed.pop_front();
        }
        let rate = match (state.analysed.front(), state.analysed.back()) {
            (Some((t0, n0)), Some((t1, n1))) if t1 > t0 => {
                (n1 - n0) as f64 / t1.duration_since(*t0).as_secs_f64()
            }
            _ => 0.0,
        };
        let age = backlog
            .oldest_commit_unix_nano
            .map_or(0.0, |t| wall.saturating_sub(t) as f64 / 1e9);
        let lag = (age - self.quiet_period.as_secs_f64()).max(0.0);
        let status = Status {
            store: self.store.backend(),
            spans_stored: base + committed.saturating_sub(then),
            traces_pending: backlog.traces,
            active_traces: backlog.active,
            oldest_pending_age_s: round(age),
            analysis_lag_s: round(lag),
            quiet_period_s: self.quiet_period.as_secs_f64(),
            analyzed_traces_per_s: round(rate),
            ingest_queue_spans: self.ingest.as_ref().map_or(0, |i| i.queued_spans()),
            behind: lag > BEHIND.as_secs_f64(),
            holds_lease: self.lease.as_ref().is_some_and(|lease| lease.held()),
            measured_unix_ms: wall / 1_000_000,
            reanalysis: self.reanalysis.as_ref().and_then(|r| r.progress()),
            disk: Disk {
                usage,
                max_bytes: self.max_disk,
                traces_waiting_compaction: state.waiting_compaction,
            },
        };
        state.last = Some(status.clone());
        Ok(status)
    }

    /// Logs the status when analysis is behind (at once, then every `LOG_EVERY`), and once
    /// when it has caught up again.
    fn log(&self, status: &Status) {
        let mut state = self.lock();
        match (status.behind, state.logged) {
            (true, Some(at)) if at.elapsed() < LOG_EVERY => {}
            (true, _) => {
                state.logged = Some(Instant::now());
                tracing::warn!(
                    status.analysis_lag_s,
                    status.traces_pending,
                    status.oldest_pending_age_s,
                    status.analyzed_traces_per_s,
                    status.ingest_queue_spans,
                    status.spans_stored,
                    status.store,
                    "analysis is behind ingest: search, hop statistics and alerts miss the \
                     traces still waiting; if it keeps growing, lower the load or move to \
                     a faster disk or Postgres (GET /api/status shows it)"
                );
            }
            (false, Some(_)) => {
                state.logged = None;
                tracing::info!(
                    status.analysis_lag_s,
                    status.traces_pending,
                    "analysis has caught up"
                );
            }
            (false, None) => {}
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Hundredths are enough for people and charts.
fn round(value: f64) -> f64 {
    (value * 100.0).round() / 100.0
}

/// Measures every `PERIOD` until `stop`, logging when analysis is behind.
pub async fn run(monitor: Arc<Monitor>, stop: CancellationToken) {
    loop {
        match monitor.measure().await {
            Ok(status) => monitor.log(&status),
            Err(error) => {
                tracing::warn!(%error, "could not measure the analysis lag; will try again")
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(PERIOD) => {}
        }
    }
}

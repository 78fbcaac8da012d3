//! The background analyzer: summarises traces once they have been quiet for
//! `--quiet-period`, so search answers from summaries instead of analysing on the fly.
//!
//! Architecture invariant: it only reads spans and writes summaries through the `Store`
//! trait; marks are cleared compare-and-delete, so a span that arrives while its trace is
//! being analysed marks it again and the trace is analysed once more. Marks live in the
//! database, so traces committed before a restart are summarised after it.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio_util::sync::CancellationToken;

use crate::analyze::hops::samples;
use crate::analyze::summary::summarize;
use crate::analyze::{AnalyzeOptions, analyze};
use crate::store::{Store, StoreError};

/// Traces analysed per pass (one transaction of summaries).
const PASS_SIZE: u32 = 200;

#[derive(Debug, Clone)]
pub struct IndexerOptions {
    pub quiet_period: Duration,
    pub analyze: AnalyzeOptions,
}

pub async fn run(store: Arc<dyn Store>, options: IndexerOptions, stop: CancellationToken) {
    let poll = (options.quiet_period / 2).clamp(Duration::from_millis(50), Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(poll) => {}
        }
        match index_quiet_traces(store.as_ref(), &options, &stop).await {
            Ok(0) => {}
            Ok(traces) => tracing::debug!(traces, "summarised quiet traces"),
            Err(error) => tracing::warn!(%error, "summarising traces failed; will try again"),
        }
    }
}

/// Summarises every trace quiet now; returns how many.
pub async fn index_quiet_traces(
    store: &dyn Store,
    options: &IndexerOptions,
    stop: &CancellationToken,
) -> Result<usize, StoreError> {
    let mut done = 0;
    while !stop.is_cancelled() {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let cutoff = now.saturating_sub(options.quiet_period.as_nanos() as u64);
        let marks = store.quiet_traces(cutoff, PASS_SIZE).await?;
        let mut summaries = Vec::with_capacity(marks.len());
        for (trace_id, _) in &marks {
            let spans = store.trace(*trace_id).await?;
            if spans.is_empty() {
                continue; // Deleted by retention since it was marked: nothing to summarise.
            }
            let analyze_options = options.analyze.clone();
            let indexed = tokio::task::spawn_blocking(move || {
                let analysis = analyze(&spans, &analyze_options);
                summarize(&spans, &analysis).map(|summary| (summary, samples(&spans, &analysis)))
            })
            .await
            .map_err(|e| StoreError::Unavailable(format!("analysis task failed: {e}")))?;
            summaries.extend(indexed);
        }
        store.write_summaries(&summaries, &marks).await?;
        done += marks.len();
        if marks.len() < PASS_SIZE as usize {
            break;
        }
    }
    Ok(done)
}

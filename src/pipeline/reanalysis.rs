//! The re-analysis of stored traces after the rules changed: summaries carry the rules
//! version and τ that produced them (`core::analyze::AnalysisVersion`); a server whose own
//! differ re-analyses every stored trace whose summary was produced otherwise, newest first,
//! replacing its summary, index terms and rollup contributions exactly as a late span does.
//! Search, hop statistics, `/metrics` and alerts then agree with the trace page, which
//! analyses on read.
//!
//! Architecture invariant: it writes a summary only where the stored one is still stale, in
//! the transaction that checks it (`Store::rewrite_summaries`), so a trace the analyzer
//! summarised meanwhile, or that retention deleted, is left as it is and nothing is counted
//! twice; it touches no span. Its position is in memory: after a restart it starts again
//! from the newest stale summary, and what was done is no longer stale. It runs in the
//! analyzer's task, after the traces that are quiet now and only while ingest is not
//! saturated, so new traces and acknowledgements come first.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::core::analyze::AnalysisVersion;
use crate::pipeline::analyzer::{
    AnalyzerOptions, Pass, analyse_traces, outline_summaries, read_within,
};
use crate::pipeline::memory::PASS_BYTES_PER_ROW_BYTE;
use crate::store::query::{Cursor, StaleQuery};
use crate::store::{Store, StoreError};

/// Traces re-analysed per pass (one transaction), at most: fewer when their spans do not
/// fit in the pass's share of the memory budget.
const PASS_SIZE: u32 = 500;

/// How far the re-analysis has got, for `GET /api/status` and the overview's banner.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Progress {
    /// The rules version this server analyses with.
    pub rules_version: u32,
    pub tolerance_ms: f64,
    /// Summaries analysed otherwise when this server started.
    pub stale_at_start: u64,
    /// Of those, how many have been re-analysed (or found without spans).
    pub done: u64,
    /// Every stale summary has been visited.
    pub finished: bool,
}

/// The re-analysis' state: the version to bring summaries to, the count at start, and the
/// position reached.
pub struct Reanalysis {
    version: AnalysisVersion,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Counted at the first pass.
    stale_at_start: Option<u64>,
    done: u64,
    /// The last position visited; the next page starts after it.
    after: Option<Cursor>,
    finished: bool,
}

impl Reanalysis {
    pub fn new(version: AnalysisVersion) -> Reanalysis {
        Reanalysis {
            version,
            state: Mutex::default(),
        }
    }

    /// `None` until the first pass counted, and when nothing was stale at start.
    pub fn progress(&self) -> Option<Progress> {
        let state = self.lock();
        let stale_at_start = state.stale_at_start.filter(|n| *n > 0)?;
        Some(Progress {
            rules_version: self.version.rules,
            tolerance_ms: self.version.tolerance_ms,
            stale_at_start,
            done: state.done.min(stale_at_start),
            finished: state.finished,
        })
    }

    pub fn finished(&self) -> bool {
        self.lock().finished
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// One pass: re-analyses up to `PASS_SIZE` of the newest stale summaries not visited yet,
/// as many as fit in the memory the budget gives the pass (at least one).
pub async fn reanalysis_pass(
    store: &dyn Store,
    options: &AnalyzerOptions,
    reanalysis: &Reanalysis,
) -> Result<Pass, StoreError> {
    let nothing = Pass {
        analysed: 0,
        more: false,
        writing: Duration::ZERO,
        behind: Duration::ZERO,
    };
    if reanalysis.finished() {
        return Ok(nothing);
    }
    let version = reanalysis.version;
    if reanalysis.lock().stale_at_start.is_none() {
        let stale = store.stale_summary_count(version).await?;
        reanalysis.lock().stale_at_start = Some(stale);
        if stale > 0 {
            tracing::info!(
                stale,
                rules_version = version.rules,
                tolerance_ms = version.tolerance_ms,
                "stored traces were analysed with other rules; re-analysing them, newest first \
                 (GET /api/status shows how far it has got)"
            );
        }
    }
    let after = reanalysis.lock().after;
    let positions = store
        .stale_summaries(&StaleQuery {
            version,
            after,
            limit: PASS_SIZE,
        })
        .await?;
    if positions.is_empty() {
        let done = {
            let mut state = reanalysis.lock();
            state.finished = true;
            state.done
        };
        if done > 0 {
            tracing::info!(
                traces = done,
                "stored traces re-analysed with the current rules"
            );
        }
        return Ok(nothing);
    }
    let mut ids: Vec<_> = positions.iter().map(|p| p.trace_id).collect();
    ids.sort_unstable();
    let mut memory = options.memory.reserve_pass();
    let within = read_within(store, &ids, &memory, &options.memory).await?;
    memory.set(within.bytes * PASS_BYTES_PER_ROW_BYTE);
    // Traces are read in id order: when the reading stopped at the limit, those after the
    // last one read wait for the next pass. The position advances over the newest-first
    // run of traces that were read; traces without spans (retention) are passed over.
    let read_up_to = within.stopped_after.unwrap_or(ids[ids.len() - 1]);
    let read = ids.iter().filter(|id| **id <= read_up_to).count();
    let visited = positions
        .iter()
        .take_while(|p| p.trace_id <= read_up_to)
        .last()
        .copied();
    let mut summaries = outline_summaries(store, &within.too_large, &options.analyze).await?;
    summaries.extend(analyse_traces(HashMap::new(), within.spans, &options.analyze).await?);
    let writing = Instant::now();
    let deltas = store.rewrite_summaries(&summaries, version).await?;
    let writing = writing.elapsed();
    drop(memory);
    options.metrics.record_rollups(&deltas);
    let mut state = reanalysis.lock();
    // When the newest were not read, the position stays: what was rewritten is no longer
    // stale, so the next page moves on all the same.
    if visited.is_some() {
        state.after = visited;
    }
    state.done += read as u64;
    Ok(Pass {
        analysed: summaries.len(),
        more: true,
        writing,
        behind: Duration::ZERO,
    })
}

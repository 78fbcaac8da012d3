//! The background analyzer: summarises traces once they have been quiet for
//! `--quiet-period`, so search answers from summaries instead of analysing on the fly, and
//! a trace still receiving spans each time it has waited `--max-trace-wait`.
//!
//! Architecture invariant: it only reads spans and writes summaries through the `Store`
//! trait; marks are cleared compare-and-delete, so a span that arrives while its trace is
//! being analysed marks it again and the trace is analysed once more. Marks live in the
//! database, so traces committed before a restart are summarised after it. Ingest comes
//! first: while requests wait for the store, the analyzer rests between passes.
//!
//! A pass takes up to `PASS_SIZE` quiet traces; those whose spans are all held in memory
//! (`held.rs`; as many as the store counts, no repeated id) are not read back, the others
//! are read whole in id order until the pass's memory reservation is used. It analyses them
//! in one blocking task and writes summaries, index terms, hop contributions and rollup
//! deltas, `PACED_WRITE_CHUNK` or `WRITE_CHUNK` traces per transaction; the store queues
//! the traces it analysed whole for compaction in the same transaction. On Postgres,
//! servers sharing a database share the work: `due_traces` claims what it returns for
//! `store::CLAIM` (`FOR UPDATE SKIP LOCKED`) and a server that dies leaves its claims to
//! expire.
//!
//! Turns: analysis runs until no quiet trace is left or its turn ends (`PACE`); then the
//! lease holder moves queued traces' rows into blocks (`compact_queued`) and re-analysis
//! takes its turn, so that under a steady load each keeps a share.
//!
//! Ingest comes first at saturation: while `Ingestor::saturated` (ingest's own commits took
//! most of the last half second, or a quarter of `--max-queued-spans` waits), the analyzer
//! rests nine times as long as its last pass took (at most 10 s), so it still makes
//! progress and catches up when ingest eases. Below saturation it keeps pace: time ingest
//! waited behind the analyzer's writes is not counted as ingest's, so a load that needs
//! both near the writer's capacity is not taken for saturation. When ingest always had a
//! commit waiting but partly behind the analyzer's writes (`Load::Full`), the analyzer
//! pauses for one window to see which it is: a burst then takes the writer's time itself.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::core::analyze::hops::{HopSample, Rollup, RollupKey, samples};
use crate::core::analyze::summary::{TraceSummary, summarize};
use crate::core::analyze::{AnalyzeOptions, Outcome, analyze};
use crate::core::model::{Span, TraceId};
use crate::pipeline::held::{HeldSpan, HeldTraces};
use crate::pipeline::ingest::{DUTY_WINDOW, Ingestor, Load};
use crate::pipeline::lease::Lease;
use crate::pipeline::memory::{MemoryBudget, PASS_BYTES_PER_ROW_BYTE, Reservation};
use crate::pipeline::metrics::Metrics;
use crate::pipeline::reanalysis::{Reanalysis, reanalysis_pass};
use crate::store::query::{DueQuery, TraceOutline, TracesWithin};
use crate::store::{Compacted, Store, StoreError};

/// Traces analysed per pass, at most: fewer when their spans do not fit in the pass's
/// share of the memory budget. Against 200, finding the
/// quiet traces and counting their spans are paid a fifth as often, which keeps the lag
/// bounded at 50k spans/s (`budgetscope-bench sustained --rate 50000`).
const PASS_SIZE: u32 = 1000;

#[derive(Debug, Clone)]
pub struct AnalyzerOptions {
    pub quiet_period: Duration,
    /// A trace still receiving spans is analysed once it has waited this long, and again
    /// when it goes quiet (`--max-trace-wait`).
    pub max_trace_wait: Duration,
    pub analyze: AnalyzeOptions,
    /// Receives the rollup changes each pass writes (`/metrics`).
    pub metrics: Arc<Metrics>,
    /// Each pass reserves its working memory here (`MemoryBudget::reserve_pass`).
    pub memory: Arc<MemoryBudget>,
    /// Committed spans held in memory: a trace whose spans are all there is not read back.
    pub held: Arc<HeldTraces>,
}

/// Moves the rows of up to `WRITE_CHUNK` traces waiting for compaction into their blocks
/// (`Store::compact_due`); returns what it did, how many it took (0 when none waits) and
/// how long it took.
pub async fn compact_queued(
    store: &dyn Store,
    options: &AnalyzerOptions,
) -> Result<(Compacted, usize, Duration), StoreError> {
    let started = Instant::now();
    let (done, taken) = store
        .compact_due(WRITE_CHUNK as u32, max_trace_bytes(&options.memory))
        .await?;
    options.metrics.record_compacted(&done);
    if taken > 0 {
        tracing::debug!(
            taken,
            traces = done.traces,
            spans = done.spans,
            ms = started.elapsed().as_secs_f64() * 1e3,
            "compacted analysed traces"
        );
    }
    Ok((done, taken, started.elapsed()))
}

/// Analysis keeps pace while the trace waiting longest is at most this far past its
/// quiet period. While quiet traces keep coming, analysis then takes turns of one poll
/// interval and compaction of two; further behind, analysis takes up to `ANALYSIS_TURN`
/// and compaction one, so the lag settles near `PACE` and compaction has what analysis
/// leaves, a fifth of the analyzer's time at least (`budgetscope-bench sustained --rate
/// 40000`: the lag, and the traces still waiting for compaction when the servers stop).
const PACE: Duration = Duration::from_secs(3);

/// The longest turn of analysis while it is behind `PACE`, in poll intervals.
const ANALYSIS_TURN: u32 = 4;

/// While ingest is saturated, the analyzer rests this many times as long as its last pass
/// took: it then has at most a tenth of the time until ingest eases (burst ingest beside
/// the analyzer: `budgetscope-bench ingest --transport http-proto --spans 3000000`).
const REST_PER_PASS: u32 = 9;

/// The longest rest between two passes, so summaries still advance under sustained load.
const MAX_REST: Duration = Duration::from_secs(10);

/// What the analyzer yields to: ingest's writer. A closure answering whether it is
/// saturated does for tests.
pub trait WriterLoad: Sync {
    /// How much ingest needs the writer now: saturated, the analyzer rests between passes.
    fn load(&self) -> Load;
    /// The analyzer held the writer this long (so that ingest waiting behind it is not
    /// taken for ingest's own load).
    fn background_wrote(&self, _took: Duration) {}
}

impl WriterLoad for Ingestor {
    fn load(&self) -> Load {
        Ingestor::load(self)
    }

    fn background_wrote(&self, took: Duration) {
        Ingestor::background_wrote(self, took)
    }
}

impl<F: Fn() -> bool + Sync> WriterLoad for F {
    fn load(&self) -> Load {
        match self() {
            true => Load::Saturated,
            false => Load::Light,
        }
    }
}

/// Runs until `stop`. Passes yield to `ingest` whenever it is saturated:
/// a span not yet committed can be lost (its exporter gives up), a trace not yet
/// summarised only waits. Analysis takes turns while quiet traces keep coming (`PACE`);
/// after each, while ingest is not saturated, the server holding `lease` compacts analysed
/// traces (`compact_queued`) and then re-analyses stored traces analysed with other rules
/// (`reanalysis.rs`) for at most one poll interval, so neither holds up new traces for
/// long and neither starves under a steady load.
pub async fn run(
    store: Arc<dyn Store>,
    options: AnalyzerOptions,
    ingest: Arc<Ingestor>,
    reanalysis: Arc<Reanalysis>,
    lease: Arc<Lease>,
    stop: CancellationToken,
) {
    let poll = (options.quiet_period / 2).clamp(Duration::from_millis(50), Duration::from_secs(1));
    // Whether the last turn ended with quiet traces left: the next starts at once.
    let mut more = false;
    loop {
        if !more {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(poll) => {}
            }
        }
        // A fault of the database (`pipeline::health`) is logged once, there, not each poll.
        let turn =
            analyze_quiet_traces(store.as_ref(), &options, ingest.as_ref(), &stop, poll).await;
        let compaction_turn = match &turn {
            // A burst's commits never wait behind compaction, even when its load dips for
            // a moment.
            Ok(turn) if turn.rested => Duration::ZERO,
            Ok(turn) if turn.behind <= PACE => 2 * poll,
            _ => poll,
        };
        more = turn.as_ref().is_ok_and(|turn| turn.more);
        match turn {
            Ok(turn) if turn.analysed > 0 => {
                ingest.health().observe(&Ok(()));
                tracing::debug!(traces = turn.analysed, "summarised quiet traces")
            }
            Ok(_) => {}
            Err(error) => report(&ingest, error, "summarising traces"),
        }
        if stop.is_cancelled() {
            return;
        }
        // Then the rows of analysed traces move into blocks, on one server at a time.
        let started = Instant::now();
        while lease.held() && !ingest.saturated() && started.elapsed() < compaction_turn {
            match compact_queued(store.as_ref(), &options).await {
                Ok((_, 0, _)) => break,
                Ok((_, _, took)) => ingest.background_wrote(took),
                Err(error) => {
                    report(&ingest, error, "moving analysed traces into blocks");
                    break;
                }
            }
        }
        let started = Instant::now();
        while !reanalysis.finished()
            && !ingest.saturated()
            && !stop.is_cancelled()
            && started.elapsed() < poll
        {
            let pass = reanalysis_pass(store.as_ref(), &options, &reanalysis).await;
            if let Ok(pass) = &pass {
                ingest.background_wrote(pass.writing);
            }
            if let Err(error) = pass {
                report(&ingest, error, "re-analysing stored traces");
                break;
            }
        }
    }
}

/// Logs that `what` failed and will be tried again, unless `pipeline::health` takes the
/// error for a fault of the database, which it logs once itself.
fn report(ingest: &Ingestor, error: StoreError, what: &str) {
    let error = Err(error);
    if !ingest.health().observe(&error)
        && let Err(error) = error
    {
        tracing::warn!(%error, "{what} failed; will try again");
    }
}

/// What one turn of `analyze_quiet_traces` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turn {
    /// Traces summarised (or found deleted).
    pub analysed: usize,
    /// The turn ended with quiet traces left.
    pub more: bool,
    /// The last pass's `Pass::behind`.
    pub behind: Duration,
    /// It rested because ingest was saturated: compaction then waits for a turn without.
    pub rested: bool,
}

/// Summarises traces quiet now, pass after pass, until none is left, or `turn` has passed
/// and analysis keeps `PACE`, or `ANALYSIS_TURN` turns have passed. After each pass, while
/// `writer` is saturated, rests `REST_PER_PASS` times the pass's duration.
pub async fn analyze_quiet_traces(
    store: &dyn Store,
    options: &AnalyzerOptions,
    writer: &dyn WriterLoad,
    stop: &CancellationToken,
    turn: Duration,
) -> Result<Turn, StoreError> {
    let began = Instant::now();
    let mut done = Turn {
        analysed: 0,
        more: false,
        behind: Duration::ZERO,
        rested: false,
    };
    while !stop.is_cancelled() {
        let started = Instant::now();
        let pass = analysis_pass(store, options).await?;
        writer.background_wrote(pass.writing);
        done.analysed += pass.analysed;
        done.more = pass.more;
        done.behind = pass.behind;
        if !pass.more {
            break;
        }
        // The rest comes before the turn ends, so the next turn's first pass keeps it too.
        let mut load = writer.load();
        if load == Load::Full {
            // Ingest always had a commit waiting, partly behind this pass's writes: a pause
            // of one window shows whether it then takes the writer's time itself (a burst:
            // saturated) or not (a steady load the two share).
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(DUTY_WINDOW) => {}
            }
            load = writer.load();
        }
        if load == Load::Saturated {
            done.rested = true;
            let rest = (started.elapsed() * REST_PER_PASS).min(MAX_REST);
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(rest) => {}
            }
        }
        let took = began.elapsed();
        if (took >= turn && pass.behind <= PACE) || took >= turn.saturating_mul(ANALYSIS_TURN) {
            break;
        }
    }
    Ok(done)
}

/// Groups spans by trace, analyses and summarises each trace, in one blocking task.
pub(crate) async fn analyse_traces(
    held: HashMap<TraceId, Vec<HeldSpan>>,
    spans: Vec<Span>,
    options: &AnalyzeOptions,
) -> Result<Vec<(TraceSummary, Vec<HopSample>)>, StoreError> {
    let options = options.clone();
    tokio::task::spawn_blocking(move || {
        let mut by_trace: HashMap<TraceId, Vec<Span>> = held
            .into_iter()
            .map(|(id, spans)| (id, spans.iter().map(|span| span.to_span(id)).collect()))
            .collect();
        for span in spans {
            by_trace.entry(span.trace_id).or_default().push(span);
        }
        by_trace
            .into_values()
            .filter_map(|mut spans| {
                spans.sort_by_key(|s| (s.start_unix_nano, s.span_id));
                let analysis = analyze(&spans, &options);
                summarize(&spans, &analysis).map(|summary| (summary, samples(&spans, &analysis)))
            })
            .collect()
    })
    .await
    .map_err(|e| StoreError::Unavailable(format!("analysis task failed: {e}")))
}

/// The most row text of one trace the analyzer reads: what the largest pass holds. A
/// larger trace is not analysed (`Outcome::TooLarge`), so a pass stays within its share of
/// `--memory-limit` however large a trace grows.
pub(crate) fn max_trace_bytes(memory: &MemoryBudget) -> u64 {
    memory.max_pass() / PASS_BYTES_PER_ROW_BYTE
}

/// Reads whole traces among `ids` within `memory` (`TraceReader::traces_within`).
pub(crate) async fn read_within(
    store: &dyn Store,
    ids: &[TraceId],
    memory: &Reservation,
    budget: &MemoryBudget,
) -> Result<TracesWithin, StoreError> {
    store
        .traces_within(
            ids,
            memory.bytes() / PASS_BYTES_PER_ROW_BYTE,
            max_trace_bytes(budget),
        )
        .await
}

/// Summaries of traces too large to analyse, from what the database says of them: no
/// hops are counted, and search lists them as `outcome:too_large`.
pub(crate) async fn outline_summaries(
    store: &dyn Store,
    too_large: &[TraceId],
    options: &AnalyzeOptions,
) -> Result<Vec<(TraceSummary, Vec<HopSample>)>, StoreError> {
    let mut summaries = Vec::with_capacity(too_large.len());
    for &trace_id in too_large {
        let Some(outline) = store.trace_outline(trace_id).await? else {
            continue;
        };
        tracing::info!(
            trace_id = %trace_id,
            spans = outline.span_count,
            "a trace is too large to analyse within --memory-limit; it is listed as too_large"
        );
        summaries.push((outline_summary(outline, options), Vec::new()));
    }
    Ok(summaries)
}

fn outline_summary(outline: TraceOutline, options: &AnalyzeOptions) -> TraceSummary {
    let mut operations = outline.operations;
    operations.push((outline.root_service.clone(), outline.root_name.clone()));
    operations.sort();
    operations.dedup();
    TraceSummary {
        trace_id: outline.trace_id,
        root_service: outline.root_service,
        root_name: outline.root_name,
        start_unix_nano: outline.start_unix_nano,
        duration_ms: (outline.end_unix_nano - outline.start_unix_nano) as f64 / 1e6,
        answer_ms: None,
        budget_ms: outline.root_budget_ms,
        outcome: Outcome::TooLarge,
        origins: Vec::new(),
        burner: None,
        flag_counts: Default::default(),
        span_count: outline.span_count as usize,
        services: outline.services,
        operations,
        version: options.version(),
    }
}

/// Traces whose summaries are written per transaction, at most, while analysis is behind
/// `PACE`. The write takes the one writer that ingest commits through: a pass's thousand
/// traces in one transaction held exports behind it for hundreds of milliseconds, and in
/// chunks ingest gets its turn between them, while larger chunks keep the analyzer's
/// rollup merges few enough to keep pace (`budgetscope-bench sustained --rate 40000`,
/// export p99 and lag).
const WRITE_CHUNK: usize = 250;

/// Traces per transaction while analysis keeps `PACE`: each rollup merge is paid more
/// often, for a shorter wait of the exports behind it (`budgetscope-bench ingest --rate
/// 10000`, export p99).
const PACED_WRITE_CHUNK: usize = 100;

/// Writes a pass's summaries and clears its marks, `chunk` traces per transaction:
/// each trace's summary, hop samples and marks in the same one. Returns the rollup deltas
/// and how long the writes took.
async fn write_in_chunks(
    store: &dyn Store,
    mut summaries: Vec<(TraceSummary, Vec<HopSample>)>,
    mut marks: Vec<(TraceId, i64)>,
    chunk: usize,
) -> Result<(Vec<(RollupKey, Rollup)>, Duration), StoreError> {
    summaries.sort_unstable_by_key(|(summary, _)| summary.trace_id);
    marks.sort_unstable();
    let mut ids: Vec<TraceId> = marks.iter().map(|(id, _)| *id).collect();
    ids.extend(summaries.iter().map(|(summary, _)| summary.trace_id));
    ids.sort_unstable();
    ids.dedup();
    let (mut summaries, mut marks) = (summaries.as_slice(), marks.as_slice());
    let (mut deltas, mut writing) = (Vec::new(), Duration::ZERO);
    for chunk in ids.chunks(chunk) {
        let last = chunk[chunk.len() - 1];
        let (these, rest) =
            summaries.split_at(summaries.partition_point(|(s, _)| s.trace_id <= last));
        let (their_marks, other_marks) =
            marks.split_at(marks.partition_point(|(id, _)| *id <= last));
        let started = Instant::now();
        deltas.extend(store.write_summaries(these, their_marks).await?);
        writing += started.elapsed();
        (summaries, marks) = (rest, other_marks);
    }
    Ok((deltas, writing))
}

/// What one pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    /// Traces summarised (or found deleted).
    pub analysed: usize,
    /// Whether more traces may be quiet now.
    pub more: bool,
    /// How long its writes took (holding the database's writer).
    pub writing: Duration,
    /// How long past its quiet period the trace that waited longest of those it took had
    /// been quiet (zero when it took none): the analysis lag, as the pass saw it.
    pub behind: Duration,
}

/// One pass: summarises up to `PASS_SIZE` quiet traces, as many as fit
/// in the memory the budget gives the pass (at least one).
pub async fn analysis_pass(
    store: &dyn Store,
    options: &AnalyzerOptions,
) -> Result<Pass, StoreError> {
    let now = crate::clock::now_unix_nano();
    let cutoff = now.saturating_sub(options.quiet_period.as_nanos() as u64);
    let started = Instant::now();
    let mut marks = store
        .due_traces(&DueQuery {
            quiet_before: cutoff,
            waiting_before: now.saturating_sub(options.max_trace_wait.as_nanos() as u64),
            limit: PASS_SIZE,
        })
        .await?;
    let selected = started.elapsed();
    if marks.is_empty() {
        return Ok(Pass {
            analysed: 0,
            more: false,
            writing: Duration::ZERO,
            behind: Duration::ZERO,
        });
    }
    let full_page = marks.len() >= PASS_SIZE as usize;
    let oldest = marks.iter().map(|(_, mark)| *mark).min().unwrap_or(0);
    let behind = Duration::from_nanos(cutoff.saturating_sub(oldest.max(0) as u64));
    // A trace marked by several commits comes with each of its marks.
    let mut ids: Vec<_> = marks.iter().map(|(id, _)| *id).collect();
    ids.sort_unstable();
    ids.dedup();
    // Traces whose spans are all held in memory (as many as the store has) are not read.
    let mut held = options.held.take(&ids);
    if !held.is_empty() {
        let candidates: Vec<TraceId> = held.keys().copied().collect();
        let stored = store.span_counts(&candidates).await?;
        held.retain(|id, spans| stored.get(id) == Some(&(spans.len() as u64)));
    }
    // A trace past what one pass may read is not analysed from memory either.
    let max_trace_bytes = max_trace_bytes(&options.memory);
    held.retain(|_, spans| spans.iter().map(HeldSpan::bytes).sum::<u64>() <= max_trace_bytes);
    let from_memory = held.len() as u64;
    let counted = started.elapsed();
    let unheld: Vec<TraceId> = ids
        .iter()
        .filter(|id| !held.contains_key(id))
        .copied()
        .collect();
    let mut memory = options.memory.reserve_pass();
    let read = if unheld.is_empty() {
        TracesWithin::default()
    } else {
        read_within(store, &unheld, &memory, &options.memory).await?
    };
    let held_bytes: u64 = held.values().flatten().map(HeldSpan::bytes).sum();
    memory.set((read.bytes + held_bytes) * PASS_BYTES_PER_ROW_BYTE);
    // Traces are read in id order: when the reading stopped at the limit, traces after
    // the last one read wait for the next pass; the ones up to it without spans were
    // deleted by retention since they were marked (no summary; their marks are cleared).
    if let Some(last) = read.stopped_after {
        ids.retain(|id| *id <= last || held.contains_key(id));
        marks.retain(|(id, _)| *id <= last || held.contains_key(id));
    }
    let read_at = started.elapsed();
    let mut summaries = outline_summaries(store, &read.too_large, &options.analyze).await?;
    let too_large = summaries.len() as u64;
    summaries.extend(analyse_traces(held, read.spans, &options.analyze).await?);
    let analysed = started.elapsed();
    let written = summaries.len() as u64;
    let chunk = match behind <= PACE {
        true => PACED_WRITE_CHUNK,
        false => WRITE_CHUNK,
    };
    let (deltas, writing) = write_in_chunks(store, summaries, marks, chunk).await?;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    tracing::debug!(
        traces = ids.len(),
        from_memory,
        select_ms = ms(selected),
        count_ms = ms(counted - selected),
        read_ms = ms(read_at - counted),
        analyse_ms = ms(analysed - read_at),
        write_ms = ms(started.elapsed() - analysed),
        "analysis pass"
    );
    drop(memory);
    options.metrics.record_rollups(&deltas);
    options.metrics.traces_analysed.inc_by(written);
    options
        .metrics
        .traces_analysed_from_memory
        .inc_by(from_memory);
    options.metrics.traces_too_large.inc_by(too_large);
    Ok(Pass {
        analysed: ids.len(),
        more: full_page || read.stopped_after.is_some(),
        writing,
        behind,
    })
}

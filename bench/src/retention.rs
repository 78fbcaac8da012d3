//! `retention`: on Postgres, a day of analysed traces deleted row by row, as retention does
//! with traces no time partition holds, against a day's time partitions dropped whole
//! (src/store/partitions.rs), on one store holding both days.

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Args;

use budgetscope::core::analyze::AnalyzeOptions;
use budgetscope::core::budget::DEFAULT_BUDGET_KEYS;
use budgetscope::otlp::generate::generate_over;
use budgetscope::otlp::normalize::{NormalizeOptions, normalize};
use budgetscope::pipeline::analyzer::{AnalyzerOptions, analysis_pass, compact_queued};
use budgetscope::pipeline::held::HeldTraces;
use budgetscope::pipeline::memory::{DEFAULT_LIMIT, MemoryBudget};
use budgetscope::store::{self, PartitionPlan, Store, TraceSet};

use crate::BenchDatabases;

#[derive(Debug, Clone, Args)]
pub struct RetentionBench {
    /// A postgres:// URL (a fresh schema, dropped afterwards).
    #[arg(long)]
    pub db: String,
    /// Spans stored in all, half on each of the two days.
    #[arg(long, default_value = "10000000")]
    pub spans: usize,
}

const DAY: u64 = 86_400_000_000_000;
/// Spans per fill step, so memory stays flat.
const FILL_CHUNK: usize = 100_000;
/// Retention's batches (src/pipeline/retention.rs).
const HEALTHY_BATCH: u32 = 500;
const RETENTION_BATCH: u32 = 5_000;

pub async fn retention(bench: RetentionBench) -> anyhow::Result<()> {
    let databases = BenchDatabases::new(&bench.db).await?;
    if !databases.is_postgres() {
        bail!("retention measures Postgres's time partitions: pass --db postgres://…");
    }
    let url = databases.fresh("retention").await?;
    let result = run(&url, &bench).await;
    databases.cleanup().await;
    result
}

async fn run(url: &str, bench: &RetentionBench) -> anyhow::Result<()> {
    let store = store::open(url).await?;
    // Two days ending at a midnight two days ago: the first before any partition (its rows
    // in the default partitions, as with no partitions at all), the second in a day's
    // partitions (an eight-day retention's width).
    let now = budgetscope::clock::now_unix_nano();
    let second = (now / DAY - 2) * DAY;
    let plan = PartitionPlan {
        healthy: Duration::from_secs(8 * 86_400),
        all: Duration::from_secs(8 * 86_400),
    };
    store
        .keep_partitions(plan, second - DAY / 48)
        .await
        .context("creating the second day's partitions")?;
    let started = Instant::now();
    for day_end in [second, second + DAY] {
        fill(store.as_ref(), bench.spans / 2, day_end).await?;
    }
    eprintln!(
        "  stored {} spans in {:.0} s",
        bench.spans,
        started.elapsed().as_secs_f64()
    );
    let started = Instant::now();
    let traces = analyse_all(store.as_ref()).await?;
    eprintln!(
        "  analysed and compacted {traces} traces in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let disk = || async { anyhow::Ok(store.disk_usage().await?.bytes as f64 / 1e6) };
    let full = disk().await?;

    // Today's delete: what retention's pass does once a day has passed both retentions,
    // healthy traces first, then the rest with the old spans and rollups.
    let started = Instant::now();
    let (healthy, spans) = delete_rows(store.as_ref(), second).await?;
    let rows = started.elapsed();
    let after_rows = disk().await?;

    // The second day: one pass drops its partitions (and creates the next ones), then the
    // same row deletes take the summaries, all that is left of those traces.
    let started = Instant::now();
    let kept = store.keep_partitions(plan, second + DAY + 8 * DAY).await?;
    let dropped = started.elapsed();
    let (healthy_after, _) = delete_rows(store.as_ref(), second + DAY).await?;
    let dropped_all = started.elapsed();
    let after_drop = disk().await?;
    let left = store
        .search_traces(&store::query::TraceQuery {
            limit: 1,
            ..Default::default()
        })
        .await?
        .len();

    println!(
        "## retention of a day on Postgres, {} spans over two days ({traces} traces)",
        bench.spans
    );
    println!("| one day of traces | time | traces | store before → after |\n|---|---|---|---|");
    println!(
        "| deleted row by row (retention's batches) | {:.1} s | {healthy} healthy, then the others' {spans} spans | {full:.0} → {after_rows:.0} MB |",
        rows.as_secs_f64(),
    );
    println!(
        "| one pass: its summaries deleted by range, its blocks' and terms' partitions dropped ({} partitions, {} healthy traces, {:.2} s); then row deletes ({healthy_after} healthy left) | {:.1} s | | {after_rows:.0} → {after_drop:.0} MB |",
        kept.dropped,
        kept.healthy_traces,
        dropped.as_secs_f64(),
        dropped_all.as_secs_f64(),
    );
    if left != 0 {
        bail!("{left} traces are left after both days went");
    }
    Ok(())
}

/// Stores `spans` spans of generated traces spread over the day that ends at `day_end`.
async fn fill(store: &dyn Store, spans: usize, day_end: u64) -> anyhow::Result<()> {
    let options = NormalizeOptions {
        budget_keys: DEFAULT_BUDGET_KEYS.iter().map(|k| k.to_string()).collect(),
        retention: None,
    };
    let mut written = 0;
    while written < spans {
        let chunk = (spans - written).min(FILL_CHUNK);
        let now = budgetscope::clock::now_unix_nano();
        let back = now - day_end;
        let mut rows: Vec<_> = generate_over(chunk, 512, Duration::from_nanos(DAY), 0.2)
            .into_iter()
            .flat_map(|r| normalize(r, &options, now).spans)
            .collect();
        for span in &mut rows {
            span.start_unix_nano -= back;
            span.end_unix_nano -= back;
        }
        for batch in rows.chunks(20_000) {
            store.write_spans(batch).await?;
        }
        written += chunk;
        eprintln!("  stored {written}/{spans} spans of the day");
    }
    Ok(())
}

/// Analyses every stored trace with the background analyzer's pass, then moves the rows of
/// analysed traces into blocks, as a running server's analyzer does; returns the traces
/// analysed.
pub async fn analyse_all(store: &dyn Store) -> anyhow::Result<usize> {
    let memory = MemoryBudget::for_limit(DEFAULT_LIMIT);
    let options = AnalyzerOptions {
        quiet_period: Duration::ZERO,
        max_trace_wait: Duration::from_secs(300),
        analyze: AnalyzeOptions::default(),
        metrics: Default::default(),
        held: HeldTraces::new(&memory),
        memory,
    };
    let started = Instant::now();
    let mut traces = 0;
    let mut report = Instant::now();
    loop {
        let pass = analysis_pass(store, &options).await?;
        traces += pass.analysed;
        if report.elapsed() > Duration::from_secs(2) {
            eprintln!(
                "  summarised {traces} traces ({:.0} traces/s)",
                traces as f64 / started.elapsed().as_secs_f64()
            );
            report = Instant::now();
        }
        if !pass.more {
            break;
        }
    }
    while compact_queued(store, &options).await?.1 > 0 {
        if report.elapsed() > Duration::from_secs(10) {
            eprintln!("  compacting…");
            report = Instant::now();
        }
    }
    Ok(traces)
}

/// Deletes what started before `cutoff` through retention's own batches, as its pass does:
/// healthy traces first, then the rest with the old spans; returns the healthy traces and
/// the others' spans deleted.
async fn delete_rows(store: &dyn Store, cutoff: u64) -> anyhow::Result<(u64, u64)> {
    let mut healthy = 0;
    loop {
        let n = store
            .delete_traces_before(cutoff, TraceSet::Healthy, HEALTHY_BATCH)
            .await?;
        if n == 0 {
            break;
        }
        healthy += n;
    }
    let mut spans = 0;
    loop {
        let n = store.delete_before(cutoff, RETENTION_BATCH).await?;
        if n == 0
            && store
                .delete_traces_before(cutoff, TraceSet::Analysed, HEALTHY_BATCH)
                .await?
                == 0
        {
            break;
        }
        spans += n;
    }
    Ok((healthy, spans))
}

//! `budgetscope-bench sustained`: a fixed rate of realistic traces for minutes against a
//! real server process, and how far its analysis falls behind (BENCHMARKS.md).
//!
//! Method. Ten seconds' worth of traffic is generated up front: chains of `--hops`
//! services (5–49 spans by default), a `--trouble` share of them overspending or inflating
//! a budget. It is sent again and again, each time with fresh trace ids and times moved on
//! by ten seconds, re-encoded per request (a few percent of a core), paced to `--rate`
//! spans per second by `--concurrency` gRPC senders that retry refusals as exporters do.
//! Every second the harness reads the server's `GET /api/status`: `analysis_lag_s` is how
//! long the trace waiting longest has been quiet beyond the quiet period, an upper bound
//! on every waiting trace's lag. After the load it waits for the analyzer to drain (up to
//! `--drain` seconds), stops the server and counts the stored spans against those sent.
//! With `--servers N` (Postgres), N servers share the database and each request goes to
//! the next server in turn, so most traces' spans reach several servers; lag and waiting
//! traces are the shared store's, analysed/s, CPU and the queue are summed over servers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Args;
use prost::Message as _;

use budgetscope::otlp::generate::generate_chains;
use budgetscope::otlp::normalize::span_count;
use budgetscope::store;

use crate::ingest::{ChildServer, Prepared, Sender, futures_join, own_cpu_seconds};
use crate::{BenchDatabases, Transport, ms};

/// Seconds of traffic generated up front and sent again with fresh ids.
const POOL_SECONDS: u64 = 10;

#[derive(Debug, Clone, Args)]
pub struct SustainedBench {
    /// Database for the run: "sqlite" (a fresh file in a temp dir) or a postgres:// URL
    /// (a fresh schema, dropped afterwards).
    #[arg(long, default_value = "sqlite")]
    pub db: String,
    /// Spans per second, in total.
    #[arg(long, default_value = "50000")]
    pub rate: u64,
    /// Seconds of load.
    #[arg(long, default_value = "600")]
    pub seconds: u64,
    /// Services per trace, as MIN-MAX (a chain of n services has 2n − 1 spans).
    #[arg(long, default_value = "3-25")]
    pub hops: String,
    /// Share of traces that overspend or inflate a budget (0–1).
    #[arg(long, default_value = "0.3")]
    pub trouble: f64,
    /// Spans per export request.
    #[arg(long, default_value = "512")]
    pub batch: usize,
    /// Concurrent gRPC senders.
    #[arg(long, default_value = "8")]
    pub concurrency: usize,
    /// The server's --quiet-period.
    #[arg(long, default_value = "10s")]
    pub quiet_period: String,
    /// Seconds to wait after the load for the analyzer to catch up.
    #[arg(long, default_value = "300")]
    pub drain: u64,
    /// The `budgetscope` binary to run as the server (default: the one beside this program).
    #[arg(long)]
    pub server: Option<std::path::PathBuf>,
    /// Servers sharing the database (more than one needs Postgres); each request goes to
    /// the next one in turn.
    #[arg(long, default_value = "1")]
    pub servers: usize,
}

/// One reading of `/api/status` and the server process.
struct Sample {
    at: Duration,
    lag_s: f64,
    pending: u64,
    analysed_per_s: f64,
    queue: u64,
    rss: u64,
}

pub async fn sustained(bench: SustainedBench) -> anyhow::Result<()> {
    let hops = parse_hops(&bench.hops)?;
    if bench.rate == 0
        || bench.seconds == 0
        || bench.batch == 0
        || bench.concurrency == 0
        || bench.servers == 0
    {
        bail!("--rate, --seconds, --batch, --concurrency and --servers must be at least 1");
    }
    let pool_spans = (bench.rate * POOL_SECONDS) as usize;
    eprintln!("generating {pool_spans} spans ({POOL_SECONDS} s of traffic)…");
    let spread = Duration::from_secs(POOL_SECONDS);
    let pool: Vec<Prepared> = generate_chains(pool_spans, bench.batch, spread, bench.trouble, hops)
        .into_iter()
        .map(|request| Prepared {
            spans: span_count(&request),
            body: Default::default(),
            request,
        })
        .collect();
    let spans_before: Vec<u64> = pool
        .iter()
        .scan(0u64, |sum, p| {
            let before = *sum;
            *sum += p.spans as u64;
            Some(before)
        })
        .collect();
    let traces_per_pool = {
        let mut ids: Vec<&[u8]> = pool
            .iter()
            .flat_map(|p| &p.request.resource_spans)
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| &s.spans)
            .map(|s| s.trace_id.as_slice())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids.len()
    };

    let databases = BenchDatabases::new(&bench.db).await?;
    if bench.servers > 1 && !databases.is_postgres() {
        bail!(
            "--servers {} needs --db postgres://…: SQLite is one process's",
            bench.servers
        );
    }
    let serve_url = databases.fresh("sustained").await?;
    let exe = match &bench.server {
        Some(path) => path.clone(),
        None => crate::server_beside_harness()?,
    };
    let args = ["--quiet-period".to_string(), bench.quiet_period.clone()];
    let mut servers = Vec::new();
    for _ in 0..bench.servers {
        servers.push(ChildServer::start(&exe, &serve_url, &args).await?);
    }
    eprintln!(
        "server pids {:?}; {} spans/s for {} s, {traces_per_pool} traces per {POOL_SECONDS} s",
        servers.iter().map(|s| s.pid).collect::<Vec<_>>(),
        bench.rate,
        bench.seconds
    );
    let cpu_seconds = |servers: &[ChildServer]| -> anyhow::Result<f64> {
        servers.iter().map(|s| s.cpu_seconds()).sum()
    };

    let (pool, spans_before) = (Arc::new(pool), Arc::new(spans_before));
    let next = Arc::new(AtomicU64::new(0));
    let acked = Arc::new(AtomicU64::new(0));
    let refusals = Arc::new(AtomicU64::new(0));
    let load_over = Arc::new(AtomicBool::new(false));
    let length = Duration::from_secs(bench.seconds);
    let cpu_before = cpu_seconds(&servers)?;
    let sender_cpu_before = own_cpu_seconds()?;
    let started = Instant::now();
    let mut senders = Vec::new();
    for _ in 0..bench.concurrency {
        let (pool, spans_before, next, acked, refusals) = (
            pool.clone(),
            spans_before.clone(),
            next.clone(),
            acked.clone(),
            refusals.clone(),
        );
        let rate = bench.rate;
        let addrs: Vec<_> = servers
            .iter()
            .map(|s| (s.grpc_addr, s.http_otlp_addr))
            .collect();
        senders.push(tokio::spawn(async move {
            let mut connections = Vec::new();
            for (grpc_addr, http_addr) in addrs {
                connections
                    .push(Sender::connect(Transport::Grpc, false, grpc_addr, http_addr).await?);
            }
            let mut latencies = Vec::new();
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let (round, slot) = (
                    index / pool.len() as u64,
                    (index % pool.len() as u64) as usize,
                );
                let spans_due = round * rate * POOL_SECONDS + spans_before[slot];
                let due = Duration::from_secs_f64(spans_due as f64 / rate as f64);
                if due >= length {
                    break;
                }
                tokio::time::sleep_until((started + due).into()).await;
                let request = renewed(&pool[slot], round);
                let sent = Instant::now();
                let target = (index % connections.len() as u64) as usize;
                let sender = &mut connections[target];
                sender.send_until_stored(&request, &refusals).await?;
                latencies.push(sent.elapsed());
                acked.fetch_add(request.spans as u64, Ordering::Relaxed);
            }
            anyhow::Ok(latencies)
        }));
    }

    let status_urls: Vec<String> = servers
        .iter()
        .map(|s| format!("http://{}/api/status", s.http_addr))
        .collect();
    let client = reqwest::Client::new();
    let mut samples: Vec<Sample> = Vec::new();
    let mut peak_anon = 0u64;
    let mut latencies = Vec::new();
    let mut load_seconds = None;
    let mut cpu_during_load = None;
    let mut senders = Some(Box::pin(futures_join(senders)));
    // The drain is counted from the end of the load, however long a slow server made it.
    let mut drain_until = None;
    loop {
        tokio::select! {
            results = async { senders.as_mut().expect("polled while some").await }, if senders.is_some() => {
                senders = None;
                for result in results {
                    latencies.extend(result.context("sender task failed")??);
                }
                load_seconds = Some(started.elapsed().as_secs_f64());
                cpu_during_load = Some(cpu_seconds(&servers)? - cpu_before);
                load_over.store(true, Ordering::Relaxed);
                drain_until = Some(started.elapsed() + Duration::from_secs(bench.drain));
                eprintln!("load over after {:.1} s; waiting for analysis to drain…", started.elapsed().as_secs_f64());
            }
            _ = tokio::time::sleep(Duration::from_secs(1)) => {
                let mut statuses = Vec::new();
                for url in &status_urls {
                    let body = client.get(url).send().await?.bytes().await?;
                    statuses.push(serde_json::from_slice::<serde_json::Value>(&body)?);
                }
                // The backlog is the shared store's; the work done is each server's own.
                let number = |key: &str| statuses[0][key].as_f64().unwrap_or(0.0);
                let sum = |key: &str| statuses.iter().map(|s| s[key].as_f64().unwrap_or(0.0)).sum::<f64>();
                let sample = Sample {
                    at: started.elapsed(),
                    lag_s: number("analysis_lag_s"),
                    pending: number("traces_pending") as u64,
                    analysed_per_s: sum("analyzed_traces_per_s"),
                    queue: sum("ingest_queue_spans") as u64,
                    rss: servers.iter().map(|s| s.rss_bytes().unwrap_or(0)).sum(),
                };
                for server in &servers {
                    peak_anon = peak_anon.max(server.anon_rss_bytes().unwrap_or(0));
                }
                eprintln!(
                    "  {:>4.0} s: {} spans committed, analysis lag {:.1} s, {} traces waiting, {:.0} analysed/s, queue {}, RSS {:.0} MiB",
                    sample.at.as_secs_f64(), acked.load(Ordering::Relaxed), sample.lag_s, sample.pending,
                    sample.analysed_per_s, sample.queue, sample.rss as f64 / 1048576.0
                );
                let drained = load_over.load(Ordering::Relaxed) && sample.pending == 0;
                samples.push(sample);
                if drained || drain_until.is_some_and(|until| started.elapsed() > until) {
                    break;
                }
            }
        }
    }
    let load_seconds = load_seconds.expect("set when the senders finished");
    let drained_after = samples
        .last()
        .filter(|s| s.pending == 0)
        .map(|s| s.at.as_secs_f64() - load_seconds);
    let sender_cpu = own_cpu_seconds()? - sender_cpu_before;
    let mut peak_rss = 0;
    for server in servers {
        peak_rss = peak_rss.max(server.peak_rss_bytes()?);
        server.stop().await?;
    }
    let sent = acked.load(Ordering::Relaxed);
    let reopened = store::open(&serve_url).await?;
    let stored = reopened.span_count().await?;
    let to_compact = reopened.compaction_waiting().await?;
    drop(reopened);
    let counted = counted_once(&serve_url).await?;

    let during: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.at.as_secs_f64() <= load_seconds)
        .collect();
    let mut lags: Vec<f64> = during.iter().map(|s| s.lag_s).collect();
    lags.sort_by(f64::total_cmp);
    let quantile = |q: f64| {
        lags.get(((lags.len().max(1) - 1) as f64 * q).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    // Whether the backlog stayed bounded: the waiting traces' trend over the second half.
    let half: Vec<&&Sample> = during
        .iter()
        .filter(|s| s.at.as_secs_f64() > load_seconds / 2.0)
        .collect();
    let growth = match (half.first(), half.last()) {
        (Some(a), Some(b)) if b.at > a.at => {
            (b.pending as f64 - a.pending as f64) / (b.at - a.at).as_secs_f64()
        }
        _ => 0.0,
    };
    latencies.sort();
    let latency = |q: f64| {
        latencies
            .get(((latencies.len().max(1) - 1) as f64 * q).round() as usize)
            .copied()
            .unwrap_or_default()
    };
    let cpu = cpu_during_load.unwrap_or(0.0);
    println!(
        "## sustained: {} spans/s for {} s, {} hops, trouble {}, quiet period {}, {}, {} server(s)",
        bench.rate,
        bench.seconds,
        bench.hops,
        bench.trouble,
        bench.quiet_period,
        databases.backend(),
        bench.servers
    );
    println!("| measure | value |\n|---|---|");
    println!("| spans sent (acknowledged) / stored after shutdown | {sent} / {stored} |");
    for (what, expected, found) in &counted {
        println!("| {what} | {expected} / {found} |");
    }
    println!(
        "| committed spans/s during the load | {:.0} |",
        sent as f64 / load_seconds
    );
    println!(
        "| traces sent per second | {:.0} |",
        traces_per_pool as f64 / POOL_SECONDS as f64
    );
    println!(
        "| refusals retried | {} |",
        refusals.load(Ordering::Relaxed)
    );
    println!(
        "| export latency p50 / p99 | {:.1} ms / {:.1} ms |",
        ms(latency(0.5)),
        ms(latency(0.99))
    );
    println!(
        "| analysis lag beyond the quiet period, p50 / p99 / max (sampled each second) | {:.1} s / {:.1} s / {:.1} s |",
        quantile(0.5),
        quantile(0.99),
        quantile(1.0)
    );
    println!(
        "| traces waiting at the end of the load | {} |",
        during.last().map_or(0, |s| s.pending)
    );
    println!("| waiting traces' growth over the second half | {growth:+.0} traces/s |");
    println!(
        "| analysed traces whose rows still wait for compaction when the servers stopped | {to_compact} |"
    );
    match drained_after {
        Some(seconds) => println!("| analysis drained after the load in | {seconds:.0} s |"),
        None => println!(
            "| analysis drained after the load in | not within {} s |",
            bench.drain
        ),
    }
    println!(
        "| server CPU during the load (all servers) | {:.0}% of one core |",
        100.0 * cpu / load_seconds
    );
    println!(
        "| harness CPU (generation, encoding, senders) | {:.0}% of one core |",
        100.0 * sender_cpu / samples.last().map_or(1.0, |s| s.at.as_secs_f64())
    );
    println!(
        "| server peak RSS / peak anonymous RSS (the largest server) | {:.0} MiB / {:.0} MiB |",
        peak_rss as f64 / 1048576.0,
        peak_anon as f64 / 1048576.0
    );
    println!(
        "\n| time | analysis lag | traces waiting | analysed/s | ingest queue | RSS (all servers) |\n|---|---|---|---|---|---|"
    );
    let every = (samples.len() / 20).max(1);
    for sample in samples.iter().step_by(every) {
        println!(
            "| {:.0} s | {:.1} s | {} | {:.0} | {} | {:.0} MiB |",
            sample.at.as_secs_f64(),
            sample.lag_s,
            sample.pending,
            sample.analysed_per_s,
            sample.queue,
            sample.rss as f64 / 1048576.0
        );
    }
    databases.cleanup().await;
    if stored != sent {
        bail!("stored {stored} spans but {sent} were acknowledged: spans were lost or duplicated");
    }
    if drained_after.is_some()
        && let Some((what, _, _)) = counted
            .iter()
            .find(|(_, expected, found)| expected != found)
    {
        bail!("after the analysis drained, {what} differ: a trace was missed or counted twice");
    }
    Ok(())
}

/// Once analysis has drained, every stored trace is summarised once with all its spans, and
/// every hop sample of every trace counts once in the hop rollups: each pair
/// (what, expected, found) must agree.
async fn counted_once(url: &str) -> anyhow::Result<Vec<(&'static str, i64, i64)>> {
    let pairs = [
        (
            "traces stored / summarised",
            // An analysed trace's spans are in its block (trace_blocks), late ones in rows.
            "SELECT COUNT(*) FROM (SELECT trace_id FROM spans UNION SELECT trace_id FROM trace_blocks) t",
            "SELECT COUNT(*) FROM trace_summaries",
        ),
        (
            "spans stored / in summaries",
            "SELECT (SELECT COUNT(*) FROM spans) \
             + (SELECT CAST(COALESCE(SUM(span_count), 0) AS BIGINT) FROM trace_blocks)",
            "SELECT CAST(COALESCE(SUM(span_count), 0) AS BIGINT) FROM trace_summaries",
        ),
    ];
    // A summary keeps its trace's hop samples compressed: counted through the store.
    let summarised = "SELECT trace_id FROM trace_summaries";
    let requests = "SELECT CAST(COALESCE(SUM(requests), 0) AS BIGINT) FROM hop_rollups";
    let store = store::open(url).await?;
    let count = async |ids: Vec<Vec<u8>>| -> anyhow::Result<i64> {
        let ids = ids
            .iter()
            .map(|id| budgetscope::core::model::TraceId::from_bytes(id))
            .collect::<Result<Vec<_>, _>>()?;
        let mut samples = 0;
        for chunk in ids.chunks(10_000) {
            samples += store
                .hop_samples(chunk)
                .await?
                .values()
                .map(Vec::len)
                .sum::<usize>();
        }
        anyhow::Ok(samples as i64)
    };
    // The same reads on either database (sqlx's pools share no trait to be generic over).
    macro_rules! count_on {
        ($pool:expr) => {{
            let pool = $pool;
            let mut counted = Vec::new();
            for (what, expected, found) in pairs {
                let expected: i64 = sqlx::query_scalar(expected).fetch_one(&pool).await?;
                let found: i64 = sqlx::query_scalar(found).fetch_one(&pool).await?;
                counted.push((what, expected, found));
            }
            let expected = count(sqlx::query_scalar(summarised).fetch_all(&pool).await?).await?;
            let found: i64 = sqlx::query_scalar(requests).fetch_one(&pool).await?;
            counted.push((
                "hop samples in summaries / requests in hop rollups",
                expected,
                found,
            ));
            pool.close().await;
            counted
        }};
    }
    let counted = if url.starts_with("postgres") {
        count_on!(sqlx::PgPool::connect(url).await?)
    } else {
        count_on!(sqlx::SqlitePool::connect(url).await?)
    };
    Ok(counted)
}

/// `MIN-MAX` services per trace.
fn parse_hops(text: &str) -> anyhow::Result<std::ops::RangeInclusive<usize>> {
    let parsed = text
        .split_once('-')
        .and_then(|(a, b)| Some((a.trim().parse().ok()?, b.trim().parse().ok()?)));
    match parsed {
        Some((min, max)) if 2 <= min && min <= max => Ok(min..=max),
        _ => bail!("--hops takes MIN-MAX services per trace, at least 2, e.g. 3-25; got {text:?}"),
    }
}

/// The pooled request as round `round` sends it: trace ids changed (so every round's
/// traces are new ones) and times moved on by `round` pool lengths, encoded.
fn renewed(pooled: &Prepared, round: u64) -> Prepared {
    let mut request = pooled.request.clone();
    let shift = round * POOL_SECONDS * 1_000_000_000;
    for span in request
        .resource_spans
        .iter_mut()
        .flat_map(|r| &mut r.scope_spans)
        .flat_map(|s| &mut s.spans)
    {
        if let Some(tail) = span.trace_id.get_mut(8..16) {
            let id = u64::from_be_bytes(tail.try_into().expect("8 bytes")) ^ round;
            tail.copy_from_slice(&id.to_be_bytes());
        }
        span.start_time_unix_nano += shift;
        span.end_time_unix_nano += shift;
    }
    Prepared {
        body: request.encode_to_vec().into(),
        spans: pooled.spans,
        request,
    }
}

//! `budgetscope bench ingest`: end-to-end ingest throughput against a real server process,
//! and, in the same run, the raw insert ceiling of the same rows (BENCHMARKS.md).
//!
//! Method. Traces are generated up front (multi-hop chains with budgets, realistic
//! attributes) and grouped into requests of `--batch` spans. A child `budgetscope serve`
//! is started on a fresh database; `--concurrency` senders export every request over the
//! chosen transport, retrying refusals after the server's retry delay as exporters do.
//! "Committed" spans/s counts acknowledged spans over the wall time of the run: the server
//! acknowledges only after commit. Then the child is stopped with SIGTERM, the database is
//! reopened and its span count must equal the spans sent. Last, the same spans, already
//! normalised and encoded, are inserted straight into a fresh database of the same schema
//! (and, on Postgres, loaded with COPY): the ceiling the receiver path is compared with.

use std::collections::{HashMap, HashSet};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use clap::{Args, Subcommand, ValueEnum};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message as _;
use rand::Rng as _;

use crate::budget::DEFAULT_BUDGET_KEYS;
use crate::generate::{generate, generate_over, large_trace};
use crate::normalize::{NormalizeOptions, normalize, span_count};
use crate::store::{self, encode_rows};

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Ingest throughput, latency, server CPU and memory, against the raw insert ceiling.
    Ingest(IngestBench),
    /// Analysis time for one trace of each size, against indexing and sorting its spans.
    Analyze(AnalyzeBench),
    /// Trace fetch, search and hop statistics on a filled store, against a raw scan; the
    /// UI's overview, search and hop pages on the same store.
    Query(QueryBench),
    /// Server time of the trace page for large traces, against the trace API in the same run.
    Ui(UiBench),
    /// CPU per span of a request's work before the writer (decode, normalise, encode rows),
    /// on one thread, against decoding the same bytes with the generated OTLP types.
    Receive(ReceiveBench),
}

#[derive(Debug, Clone, Args)]
pub struct ReceiveBench {
    /// Spans per export request.
    #[arg(long, default_value = "512")]
    pub batch: usize,
    /// Spans per timed round.
    #[arg(long, default_value = "100000")]
    pub spans: usize,
    /// Timed rounds of each path, alternating (the median is reported).
    #[arg(long, default_value = "9")]
    pub rounds: usize,
    /// OTLP/JSON bodies (what `POST /v1/traces` with `application/json` does) instead of
    /// protobuf (OTLP/gRPC and `application/x-protobuf`).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Args)]
pub struct UiBench {
    /// Trace sizes in spans (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1_000, 10_000])]
    pub spans: Vec<usize>,
    /// Timed requests per size.
    #[arg(long, default_value = "20")]
    pub runs: usize,
}

#[derive(Debug, Clone, Args)]
pub struct QueryBench {
    /// Database for the run: "sqlite" (a fresh file in a temp dir) or a postgres:// URL
    /// (a fresh schema, dropped afterwards).
    #[arg(long, default_value = "sqlite")]
    pub db: String,
    /// Spans to store, spread over the last 24 hours.
    #[arg(long, default_value = "1000000")]
    pub spans: usize,
    /// Timed requests per measurement.
    #[arg(long, default_value = "100")]
    pub runs: usize,
}

#[derive(Debug, Clone, Args)]
pub struct AnalyzeBench {
    /// Trace sizes in spans (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1_000, 10_000, 100_000])]
    pub spans: Vec<usize>,
    /// Timed runs per size (the median is reported).
    #[arg(long, default_value = "15")]
    pub repeats: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Transport {
    Grpc,
    HttpProto,
    HttpJson,
}

#[derive(Debug, Clone, Args)]
pub struct IngestBench {
    /// Database for the run: "sqlite" (fresh files in a temp dir) or a postgres:// URL
    /// (fresh schemas, dropped afterwards).
    #[arg(long, default_value = "sqlite")]
    pub db: String,
    #[arg(long, value_enum, default_value = "grpc")]
    pub transport: Transport,
    /// Spans per export request.
    #[arg(long, default_value = "512")]
    pub batch: usize,
    /// Concurrent senders.
    #[arg(long, default_value = "4")]
    pub concurrency: usize,
    /// Total spans to send.
    #[arg(long, default_value = "200000")]
    pub spans: usize,
    /// gzip the requests.
    #[arg(long)]
    pub gzip: bool,
    /// Send at most this many spans per second in total (0: as fast as possible).
    #[arg(long, default_value = "0")]
    pub rate: u64,
    /// Passed to the server: spans accepted but not yet committed (small values show overload).
    #[arg(long, default_value = "200000")]
    pub max_queued_spans: usize,
    /// Skip the raw-insert ceiling (end-to-end figures only).
    #[arg(long)]
    pub no_ceiling: bool,
    /// Times the raw-insert ceiling is measured, each on a fresh database; the ratio uses
    /// the median. One insert of 200k rows lasts about a second, and whether a WAL reset
    /// falls inside it moved single figures by up to a third.
    #[arg(long, default_value = "3")]
    pub ceiling_runs: usize,
}

pub async fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Ingest(bench) => ingest(bench).await,
        BenchCommand::Query(bench) => query_bench(bench).await,
        BenchCommand::Ui(bench) => ui_bench(bench).await,
        BenchCommand::Receive(bench) => {
            tokio::task::spawn_blocking(move || receive_bench(&bench)).await?;
            Ok(())
        }
        BenchCommand::Analyze(bench) => {
            tokio::task::spawn_blocking(move || analyze_bench(&bench)).await?;
            Ok(())
        }
    }
}

/// One export request, encoded (and for HTTP, compressed) before the timed run: the load
/// generator shares the machine's two cores with the server, and its own encoding is not
/// what the benchmark measures.
struct Prepared {
    request: ExportTraceServiceRequest,
    body: Bytes,
    spans: usize,
}

async fn ingest(bench: IngestBench) -> anyhow::Result<()> {
    if bench.batch == 0 || bench.concurrency == 0 || bench.spans == 0 {
        bail!("--batch, --concurrency and --spans must be at least 1");
    }
    eprintln!(
        "generating {} spans in requests of {}…",
        bench.spans, bench.batch
    );
    let requests = generate(bench.spans, bench.batch);
    let prepared: Vec<Prepared> = requests
        .into_iter()
        .map(|request| {
            let spans = span_count(&request);
            let body = match bench.transport {
                Transport::HttpJson => serde_json::to_vec(&request).expect("request serialises"),
                _ => request.encode_to_vec(),
            };
            let body = if bench.gzip && bench.transport != Transport::Grpc {
                gzip(&body)
            } else {
                body
            };
            Prepared {
                request,
                body: body.into(),
                spans,
            }
        })
        .collect();
    let bytes: usize = prepared.iter().map(|p| p.body.len()).sum();
    let total_spans: usize = prepared.iter().map(|p| p.spans).sum();

    let databases = BenchDatabases::new(&bench.db).await?;
    let serve_url = databases.fresh("e2e").await?;
    let server = ChildServer::start(&serve_url, bench.max_queued_spans).await?;
    eprintln!(
        "server pid {} on {}; sending over {:?}{}",
        server.pid,
        serve_url_label(&serve_url),
        bench.transport,
        if bench.gzip { " + gzip" } else { "" }
    );

    // Spans in the requests before each one, for pacing with --rate.
    let spans_before: Arc<Vec<usize>> = Arc::new(
        prepared
            .iter()
            .scan(0, |sum, p| {
                let before = *sum;
                *sum += p.spans;
                Some(before)
            })
            .collect(),
    );
    let prepared = Arc::new(prepared);
    let next = Arc::new(AtomicU64::new(0));
    let acked = Arc::new(AtomicU64::new(0));
    let refusals = Arc::new(AtomicU64::new(0));
    let cpu_before = server.cpu_seconds()?;
    let sender_cpu_before = own_cpu_seconds()?;
    let threads_before = server.thread_cpu_seconds()?;
    let writer_before = server.writer_schedstat();
    let started = Instant::now();
    let mut senders = Vec::new();
    for _ in 0..bench.concurrency {
        let (prepared, spans_before, next, acked, refusals) = (
            prepared.clone(),
            spans_before.clone(),
            next.clone(),
            acked.clone(),
            refusals.clone(),
        );
        let (transport, gzip, rate) = (bench.transport, bench.gzip, bench.rate);
        let (grpc_addr, http_addr) = (server.grpc_addr, server.http_otlp_addr);
        senders.push(tokio::spawn(async move {
            let mut sender = Sender::connect(transport, gzip, grpc_addr, http_addr).await?;
            let mut latencies = Vec::new();
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed) as usize;
                let Some(request) = prepared.get(index) else {
                    break;
                };
                if rate > 0 {
                    // Pace the whole run: request i may start once i spans' worth of time passed.
                    let due = Duration::from_secs_f64(spans_before[index] as f64 / rate as f64);
                    tokio::time::sleep_until((started + due).into()).await;
                }
                let sent = Instant::now();
                loop {
                    match sender.send(request).await? {
                        Outcome::Stored => break,
                        Outcome::RetryAfter(delay) => {
                            refusals.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(delay).await;
                        }
                    }
                }
                latencies.push(sent.elapsed());
                acked.fetch_add(request.spans as u64, Ordering::Relaxed);
            }
            anyhow::Ok(latencies)
        }));
    }
    let mut peak_anon = 0u64;
    let progress = async {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let anon = server.anon_rss_bytes().unwrap_or(0);
            peak_anon = peak_anon.max(anon);
            let done = acked.load(Ordering::Relaxed);
            eprintln!(
                "  {done}/{total_spans} spans committed ({:.0} spans/s so far), server RSS {:.0} MiB ({:.0} MiB anonymous)",
                done as f64 / started.elapsed().as_secs_f64(),
                server.rss_bytes().unwrap_or(0) as f64 / 1048576.0,
                anon as f64 / 1048576.0,
            );
        }
    };
    let mut latencies = Vec::new();
    tokio::select! {
        results = futures_join(senders) => {
            for result in results {
                latencies.extend(result.context("sender task failed")??);
            }
        }
        _ = progress => unreachable!("progress never ends"),
    }
    let elapsed = started.elapsed();
    let cpu = server.cpu_seconds()? - cpu_before;
    let sender_cpu = own_cpu_seconds()? - sender_cpu_before;
    let cpu_by_thread = cpu_by_thread_name(&threads_before, &server.thread_cpu_seconds()?);
    let writer_times = writer_before.zip(server.writer_schedstat()).map(
        |((ran_before, waited_before), (ran, waited))| {
            let share = |ns: u64| ns as f64 / 1e9 / elapsed.as_secs_f64();
            let (ran, waited) = (
                share(ran.saturating_sub(ran_before)),
                share(waited.saturating_sub(waited_before)),
            );
            (ran, waited, (1.0 - ran - waited).max(0.0))
        },
    );
    let peak_rss = server.peak_rss_bytes()?;
    let peak_anon = peak_anon.max(server.anon_rss_bytes()?);
    server.stop().await?;

    let reopened = store::open(&serve_url).await?;
    let stored = reopened.span_count().await?;
    // Traces the server summarised while it ingested: the rest are still marked for the
    // background analyzer, which yields to ingest (ARCHITECTURE.md, indexer).
    let traces: HashSet<&[u8]> = prepared
        .iter()
        .flat_map(|p| &p.request.resource_spans)
        .flat_map(|r| &r.scope_spans)
        .flat_map(|s| &s.spans)
        .map(|span| span.trace_id.as_slice())
        .collect();
    let unsummarised = reopened
        .quiet_traces(u64::MAX, u32::MAX)
        .await?
        .into_iter()
        .map(|(trace, _)| trace)
        .collect::<HashSet<_>>()
        .len();
    drop(reopened);
    latencies.sort();
    let quantile = |q: f64| latencies[((latencies.len() as f64 - 1.0) * q).round() as usize];
    let e2e_rate = total_spans as f64 / elapsed.as_secs_f64();
    println!(
        "## ingest: {:?}{}, {} spans/request, {} senders, {}",
        bench.transport,
        if bench.gzip { " + gzip" } else { "" },
        bench.batch,
        bench.concurrency,
        databases.backend()
    );
    println!("| measure | value |\n|---|---|");
    println!("| spans sent / stored after shutdown | {total_spans} / {stored} |");
    println!(
        "| requests ({:.1} MiB on the wire) | {} |",
        bytes as f64 / 1048576.0,
        prepared.len()
    );
    println!(
        "| refusals retried (503 / UNAVAILABLE) | {} |",
        refusals.load(Ordering::Relaxed)
    );
    println!("| wall time | {:.2} s |", elapsed.as_secs_f64());
    println!(
        "| traces summarised during the run (background analyzer) | {} of {} |",
        traces.len().saturating_sub(unsummarised),
        traces.len()
    );
    println!("| committed spans/s (end to end) | {e2e_rate:.0} |");
    println!(
        "| export latency p50 / p99 | {:.1} ms / {:.1} ms |",
        ms(quantile(0.5)),
        ms(quantile(0.99))
    );
    println!(
        "| server CPU | {cpu:.2} s ({:.0}% of one core) |",
        100.0 * cpu / elapsed.as_secs_f64()
    );
    // The senders share the machine with the server: on two cores, what they use is not
    // there for the server, unlike an exporter on another host.
    println!(
        "| senders' CPU (this process, pre-encoded requests) | {sender_cpu:.2} s ({:.0}% of one core) |",
        100.0 * sender_cpu / elapsed.as_secs_f64()
    );
    println!(
        "| server CPU by thread name (threads that exited are missing) | {} |",
        cpu_by_thread
            .iter()
            .map(|(name, seconds)| format!("{name} {seconds:.2} s"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    // Whether the single writer, which bounds ingest, ran, waited for a CPU (the other
    // threads and processes had them) or waited for work (BENCHMARKS.md).
    if let Some((ran, waited, idle)) = writer_times {
        println!(
            "| ingest writer: on a CPU / runnable, waiting for one / asleep (share of wall time) | {:.0}% / {:.0}% / {:.0}% |",
            100.0 * ran,
            100.0 * waited,
            100.0 * idle
        );
    }
    println!(
        "| server peak RSS (VmHWM) | {:.1} MiB |",
        peak_rss as f64 / 1048576.0
    );
    // RSS also counts the pages of the memory-mapped SQLite file that the process touched:
    // shared page cache the kernel reclaims under pressure, not memory the server holds.
    println!(
        "| server peak anonymous RSS (RssAnon, sampled each second) | {:.1} MiB |",
        peak_anon as f64 / 1048576.0
    );
    if stored != total_spans as u64 {
        bail!("stored {stored} spans but sent {total_spans}: spans were lost or duplicated");
    }

    if !bench.no_ceiling {
        eprintln!("raw ceiling: normalising and encoding the same spans…");
        let options = NormalizeOptions {
            budget_keys: DEFAULT_BUDGET_KEYS.iter().map(|k| k.to_string()).collect(),
        };
        let now = store::now_unix_nano() as u64;
        let spans: Vec<_> = prepared
            .iter()
            .flat_map(|p| normalize(p.request.clone(), &options, now).spans)
            .collect();
        let operations = store::batch_operations(&spans);
        let rows = encode_rows(spans);
        let runs = bench.ceiling_runs.max(1);
        let mut rates = Vec::with_capacity(runs);
        for run in 0..runs {
            eprintln!("raw ceiling: insert {} of {runs}…", run + 1);
            let ceiling_url = databases.fresh(&format!("ceiling{run}")).await?;
            let started = Instant::now();
            databases
                .insert_rows(&ceiling_url, &rows, &operations)
                .await?;
            rates.push(rows.len() as f64 / started.elapsed().as_secs_f64());
        }
        let (insert_rate, slowest, fastest) = median_and_range(rates);
        println!(
            "| raw ceiling: same rows, store INSERT, 10k rows/transaction, median of {runs} | {insert_rate:.0} spans/s ({slowest:.0}–{fastest:.0}) |"
        );
        println!(
            "| end to end / raw INSERT ceiling | {:.2} |",
            e2e_rate / insert_rate
        );
        if databases.is_postgres() {
            let copy_url = databases.fresh("copy").await?;
            let started = Instant::now();
            databases.copy_rows(&copy_url, &rows).await?;
            let copy_rate = rows.len() as f64 / started.elapsed().as_secs_f64();
            println!("| raw ceiling: same rows, one COPY | {copy_rate:.0} spans/s |");
            println!("| end to end / COPY | {:.2} |", e2e_rate / copy_rate);
        }
    }
    databases.cleanup().await;
    Ok(())
}

async fn futures_join<T>(
    handles: Vec<tokio::task::JoinHandle<T>>,
) -> Vec<Result<T, tokio::task::JoinError>> {
    let mut results = Vec::with_capacity(handles.len());
    for handle in handles {
        results.push(handle.await);
    }
    results
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// What the generated `TraceServiceClient::export` does, with a body encoded beforehand.
async fn export_pre_encoded(
    client: &mut tonic::client::Grpc<tonic::transport::Channel>,
    body: Bytes,
) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
    client
        .ready()
        .await
        // As the generated client does: not retryable, so a broken channel fails the run.
        .map_err(|e| tonic::Status::unknown(format!("gRPC channel not ready: {e}")))?;
    client
        .unary(
            tonic::Request::new(body),
            tonic::codegen::http::uri::PathAndQuery::from_static(GRPC_EXPORT_PATH),
            PreEncodedCodec,
        )
        .await
}

fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(data).expect("in-memory write");
    encoder.finish().expect("in-memory write")
}

fn serve_url_label(url: &str) -> String {
    crate::server::redact(url)
}

enum Outcome {
    Stored,
    RetryAfter(Duration),
}

/// The path of OTLP's gRPC export method.
const GRPC_EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// A gRPC codec that sends a request body encoded before the run as it is, and decodes the
/// response as the generated OTLP client would.
struct PreEncodedCodec;

struct PreEncodedEncoder;

impl tonic::codec::Encoder for PreEncodedEncoder {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        body: Bytes,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use bytes::BufMut as _;
        dst.put_slice(&body);
        Ok(())
    }
}

impl tonic::codec::Codec for PreEncodedCodec {
    type Encode = Bytes;
    type Decode = ExportTraceServiceResponse;
    type Encoder = PreEncodedEncoder;
    type Decoder = tonic_prost::ProstDecoder<ExportTraceServiceResponse>;

    fn encoder(&mut self) -> PreEncodedEncoder {
        PreEncodedEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::new(tonic::codec::BufferSettings::default())
    }
}

enum Sender {
    Grpc(tonic::client::Grpc<tonic::transport::Channel>),
    Http {
        client: reqwest::Client,
        url: String,
        content_type: &'static str,
        gzip: bool,
    },
}

impl Sender {
    async fn connect(
        transport: Transport,
        gzip: bool,
        grpc: SocketAddr,
        http: SocketAddr,
    ) -> anyhow::Result<Sender> {
        Ok(match transport {
            Transport::Grpc => {
                let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))?
                    .connect()
                    .await?;
                let mut client =
                    tonic::client::Grpc::new(channel).max_encoding_message_size(usize::MAX);
                if gzip {
                    client = client.send_compressed(tonic::codec::CompressionEncoding::Gzip);
                }
                Sender::Grpc(client)
            }
            Transport::HttpProto | Transport::HttpJson => Sender::Http {
                client: reqwest::Client::new(),
                url: format!("http://{http}/v1/traces"),
                content_type: if transport == Transport::HttpJson {
                    "application/json"
                } else {
                    "application/x-protobuf"
                },
                gzip,
            },
        })
    }

    async fn send(&mut self, request: &Prepared) -> anyhow::Result<Outcome> {
        match self {
            Sender::Grpc(client) => match export_pre_encoded(client, request.body.clone()).await {
                Ok(_) => Ok(Outcome::Stored),
                Err(status) if status.code() == tonic::Code::Unavailable => {
                    use tonic_types::StatusExt as _;
                    let delay = status.get_details_retry_info().and_then(|r| r.retry_delay);
                    Ok(Outcome::RetryAfter(delay.unwrap_or(Duration::from_secs(1))))
                }
                Err(status) => bail!("export failed: {status}"),
            },
            Sender::Http {
                client,
                url,
                content_type,
                gzip,
            } => {
                let mut post = client
                    .post(url.as_str())
                    .header("content-type", *content_type)
                    .body(request.body.clone());
                if *gzip {
                    post = post.header("content-encoding", "gzip");
                }
                let response = post.send().await?;
                match response.status().as_u16() {
                    200 => Ok(Outcome::Stored),
                    429 | 502 | 503 | 504 => {
                        let seconds = response
                            .headers()
                            .get("retry-after")
                            .and_then(|v| v.to_str().ok()?.parse().ok())
                            .unwrap_or(1);
                        Ok(Outcome::RetryAfter(Duration::from_secs(seconds)))
                    }
                    status => bail!(
                        "export failed with HTTP {status}: {}",
                        response.text().await.unwrap_or_default()
                    ),
                }
            }
        }
    }
}

/// Fresh databases for each phase, on the backend the user chose.
struct BenchDatabases {
    postgres: Option<String>,
    dir: Option<tempfile::TempDir>,
    schemas: tokio::sync::Mutex<Vec<String>>,
}

impl BenchDatabases {
    async fn new(db: &str) -> anyhow::Result<Self> {
        if db == "sqlite" {
            Ok(BenchDatabases {
                postgres: None,
                dir: Some(tempfile::tempdir()?),
                schemas: Default::default(),
            })
        } else if db.starts_with("postgres://") || db.starts_with("postgresql://") {
            Ok(BenchDatabases {
                postgres: Some(db.to_string()),
                dir: None,
                schemas: Default::default(),
            })
        } else {
            bail!("--db must be \"sqlite\" or a postgres:// URL")
        }
    }

    fn backend(&self) -> &'static str {
        if self.postgres.is_some() {
            "postgres"
        } else {
            "sqlite"
        }
    }

    fn is_postgres(&self) -> bool {
        self.postgres.is_some()
    }

    async fn fresh(&self, name: &str) -> anyhow::Result<String> {
        match (&self.postgres, &self.dir) {
            (Some(base), _) => {
                let schema = format!("bench_{name}_{}", rand::rng().random::<u32>());
                crate::store::postgres::create_schema(base, &schema).await?;
                self.schemas.lock().await.push(schema.clone());
                let separator = if base.contains('?') { '&' } else { '?' };
                Ok(format!("{base}{separator}options[search_path]={schema}"))
            }
            (None, Some(dir)) => Ok(format!(
                "sqlite://{}",
                dir.path().join(format!("{name}.db")).display()
            )),
            (None, None) => unreachable!("one backend is chosen"),
        }
    }

    async fn insert_rows(
        &self,
        url: &str,
        rows: &[store::SpanRow],
        operations: &[(String, String, i16, i64)],
    ) -> anyhow::Result<()> {
        const ROWS_PER_TRANSACTION: usize = 10_000;
        if self.is_postgres() {
            let store = store::postgres::PostgresStore::connect(url).await?;
            for chunk in rows.chunks(ROWS_PER_TRANSACTION) {
                store.insert_rows(chunk, operations, &[]).await?;
            }
        } else {
            let store = store::sqlite::SqliteStore::connect(url).await?;
            for chunk in rows.chunks(ROWS_PER_TRANSACTION) {
                store.insert_rows(chunk, operations, &[]).await?;
            }
        }
        Ok(())
    }

    async fn raw_scanner(&self, url: &str) -> anyhow::Result<RawScanner> {
        Ok(if self.is_postgres() {
            RawScanner::Postgres(store::postgres::PostgresStore::connect(url).await?)
        } else {
            RawScanner::Sqlite(Box::new(store::sqlite::SqliteStore::connect(url).await?))
        })
    }

    async fn copy_rows(&self, url: &str, rows: &[store::SpanRow]) -> anyhow::Result<()> {
        let store = store::postgres::PostgresStore::connect(url).await?;
        store.copy_rows(rows).await?;
        Ok(())
    }

    async fn cleanup(&self) {
        if let Some(base) = &self.postgres {
            for schema in self.schemas.lock().await.iter() {
                if let Err(error) = crate::store::postgres::drop_schema(base, schema).await {
                    eprintln!("could not drop bench schema {schema}: {error}");
                }
            }
        }
    }
}

/// The raw-scan baseline's own connection to the benchmark database.
enum RawScanner {
    /// Boxed: a SQLite store is ten times the size of a Postgres one.
    Sqlite(Box<store::sqlite::SqliteStore>),
    Postgres(store::postgres::PostgresStore),
}

impl RawScanner {
    async fn scan(&self, since: u64, until: u64) -> anyhow::Result<usize> {
        Ok(match self {
            RawScanner::Sqlite(store) => store.raw_hop_scan(since, until).await?,
            RawScanner::Postgres(store) => store.raw_hop_scan(since, until).await?,
        })
    }
}

/// A `budgetscope serve` child process on free ports.
struct ChildServer {
    child: tokio::process::Child,
    pid: u32,
    grpc_addr: SocketAddr,
    http_otlp_addr: SocketAddr,
}

/// Three free local ports for the server. The listeners are all held until the three are
/// chosen: dropped one by one, the OS could hand the same port out twice.
fn free_ports() -> anyhow::Result<(SocketAddr, SocketAddr, SocketAddr)> {
    let bind = || TcpListener::bind("127.0.0.1:0");
    let listeners = [bind()?, bind()?, bind()?];
    let [a, b, c] = listeners.map(|listener| listener.local_addr());
    Ok((a?, b?, c?))
}

impl ChildServer {
    async fn start(db: &str, max_queued_spans: usize) -> anyhow::Result<ChildServer> {
        let exe: PathBuf = std::env::current_exe().context("cannot find the budgetscope binary")?;
        let (grpc_addr, http_otlp_addr, http_addr) = free_ports()?;
        let mut child = tokio::process::Command::new(exe)
            .arg("serve")
            .args([
                "--db",
                db,
                "--max-queued-spans",
                &max_queued_spans.to_string(),
            ])
            .args(["--otlp-grpc-addr", &grpc_addr.to_string()])
            .args(["--otlp-http-addr", &http_otlp_addr.to_string()])
            .args(["--http-addr", &http_addr.to_string()])
            .env(
                "RUST_LOG",
                std::env::var("BUDGETSCOPE_BENCH_SERVER_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("could not start budgetscope serve")?;
        let pid = child.id().context("server exited at once")?;
        let ready = format!("http://{http_addr}/readyz");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(response) = reqwest::get(&ready).await
                && response.status() == 200
            {
                break;
            }
            if let Some(status) = child.try_wait()? {
                bail!("budgetscope serve exited with {status} before it was ready");
            }
            if Instant::now() > deadline {
                bail!("budgetscope serve was not ready within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(ChildServer {
            child,
            pid,
            grpc_addr,
            http_otlp_addr,
        })
    }

    fn proc_file(&self, name: &str) -> anyhow::Result<String> {
        std::fs::read_to_string(format!("/proc/{}/{name}", self.pid))
            .with_context(|| format!("cannot read /proc/{}/{name} (Linux only)", self.pid))
    }

    /// User + system CPU seconds (/proc/PID/stat fields 14 and 15, in USER_HZ = 100).
    fn cpu_seconds(&self) -> anyhow::Result<f64> {
        stat_cpu_seconds(&self.proc_file("stat")?)
    }

    /// Each live thread: its id, its name and its `/proc/PID/task/TID` directory. A thread
    /// that exits between listing and reading its name is left out.
    fn threads(&self) -> anyhow::Result<Vec<(u32, String, PathBuf)>> {
        let mut threads = Vec::new();
        for entry in std::fs::read_dir(format!("/proc/{}/task", self.pid))? {
            let entry = entry?;
            let Ok(tid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(name) = std::fs::read_to_string(entry.path().join("comm")) else {
                continue;
            };
            threads.push((tid, name.trim().to_string(), entry.path()));
        }
        Ok(threads)
    }

    /// CPU seconds of each live thread, by thread id, with the thread's name.
    fn thread_cpu_seconds(&self) -> anyhow::Result<HashMap<u32, (String, f64)>> {
        let mut threads = HashMap::new();
        for (tid, name, dir) in self.threads()? {
            // A thread may exit between listing and reading: skip it.
            let Ok(stat) = std::fs::read_to_string(dir.join("stat")) else {
                continue;
            };
            threads.insert(tid, (name, stat_cpu_seconds(&stat)?));
        }
        Ok(threads)
    }

    /// The ingest writer thread's `/proc/PID/task/TID` directory, when it is found.
    fn writer_dir(&self) -> Option<PathBuf> {
        let (_, _, dir) = self
            .threads()
            .ok()?
            .into_iter()
            .find(|(_, name, _)| name == "ingest-writer")?;
        Some(dir)
    }

    /// The ingest writer thread's scheduler times so far (`/proc/PID/task/TID/schedstat`):
    /// nanoseconds on a CPU and runnable but waiting for one. `None` when the thread is not
    /// found or the kernel keeps no such statistics.
    fn writer_schedstat(&self) -> Option<(u64, u64)> {
        let schedstat = std::fs::read_to_string(self.writer_dir()?.join("schedstat")).ok()?;
        let mut fields = schedstat.split_whitespace().map(str::parse::<u64>);
        Some((fields.next()?.ok()?, fields.next()?.ok()?))
    }

    fn status_kib(&self, key: &str) -> anyhow::Result<u64> {
        let status = self.proc_file("status")?;
        let line = status
            .lines()
            .find(|l| l.starts_with(key))
            .with_context(|| format!("no {key}"))?;
        Ok(line
            .split_whitespace()
            .nth(1)
            .context("malformed status")?
            .parse()?)
    }

    fn rss_bytes(&self) -> anyhow::Result<u64> {
        Ok(self.status_kib("VmRSS:")? * 1024)
    }

    /// Resident memory that is not a mapped file: heap, stacks, SQLite's page cache.
    fn anon_rss_bytes(&self) -> anyhow::Result<u64> {
        Ok(self.status_kib("RssAnon:")? * 1024)
    }

    fn peak_rss_bytes(&self) -> anyhow::Result<u64> {
        Ok(self.status_kib("VmHWM:")? * 1024)
    }

    /// SIGTERM, then wait for the clean shutdown (which commits everything queued).
    async fn stop(mut self) -> anyhow::Result<()> {
        let status = std::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()?;
        if !status.success() {
            bail!("could not signal the server");
        }
        let exit = tokio::time::timeout(Duration::from_secs(60), self.child.wait()).await??;
        if !exit.success() {
            bail!("server exited with {exit}");
        }
        Ok(())
    }
}

/// The median of `values` (the upper one of an even count), with the least and the most.
fn median_and_range(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    (
        values[values.len() / 2],
        values[0],
        values[values.len() - 1],
    )
}

/// User + system CPU seconds this process has used.
fn own_cpu_seconds() -> anyhow::Result<f64> {
    stat_cpu_seconds(
        &std::fs::read_to_string("/proc/self/stat")
            .context("cannot read /proc/self/stat (Linux only)")?,
    )
}

/// Field `number` (1-based, as proc(5) numbers them) of a `/proc/…/stat` line.
fn proc_stat_field(stat: &str, number: usize) -> Option<&str> {
    // Fields 3 on follow the command name, which is in parentheses and may hold spaces.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(number.checked_sub(3)?)
}

/// User + system CPU seconds from a `/proc/…/stat` line (fields 14 and 15, in USER_HZ = 100).
fn stat_cpu_seconds(stat: &str) -> anyhow::Result<f64> {
    // utime and stime, in clock ticks (fields 14 and 15).
    let ticks = |number| -> anyhow::Result<u64> {
        Ok(proc_stat_field(stat, number)
            .context("malformed stat")?
            .parse()?)
    };
    Ok((ticks(14)? + ticks(15)?) as f64 / 100.0)
}

/// CPU seconds each kind of thread (by name) used between two readings, most first.
/// Threads that exited in between are missing from the second reading and not counted.
fn cpu_by_thread_name(
    before: &HashMap<u32, (String, f64)>,
    after: &HashMap<u32, (String, f64)>,
) -> Vec<(String, f64)> {
    let mut by_name: HashMap<&str, f64> = HashMap::new();
    for (tid, (name, seconds)) in after {
        let earlier = before.get(tid).map_or(0.0, |(_, s)| *s);
        *by_name.entry(name).or_default() += seconds - earlier;
    }
    let mut sorted: Vec<(String, f64)> = by_name
        .into_iter()
        .filter(|(_, seconds)| *seconds > 0.0)
        .map(|(name, seconds)| (name.to_string(), seconds))
        .collect();
    sorted.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    sorted
}

/// Times the request side of ingest on one thread: what the receivers do with a request
/// body before handing rows to the writer (the HTTP receiver's `decode`: for protobuf
/// `lenient::decode_request`, as gRPC too, for JSON `otlp_json::decode`; then
/// `receive::prepare`, and freeing it all, as the server does), against the least any
/// receiver does: decoding the body with the generated OTLP types (prost, or their serde
/// implementation for JSON).
fn receive_bench(bench: &ReceiveBench) {
    use crate::receive::http::{Format, LOSSY_UTF8_WARNING, decode};
    use crate::receive::{otlp_json, prepare};
    let format = if bench.json {
        Format::Json
    } else {
        Format::Protobuf
    };
    let batch = bench.batch.max(1);
    eprintln!("generating {} spans in requests of {batch}…", bench.spans);
    // As the receivers get a body: tonic's buffer or axum's, as `Bytes`.
    let bodies: Vec<Bytes> = generate(bench.spans.max(1), batch)
        .iter()
        .map(|request| {
            if bench.json {
                serde_json::to_vec(request)
                    .expect("requests serialise")
                    .into()
            } else {
                request.encode_to_vec().into()
            }
        })
        .collect();
    let spans = bench.spans.max(1) as f64;
    let options = NormalizeOptions {
        budget_keys: DEFAULT_BUDGET_KEYS.iter().map(|k| k.to_string()).collect(),
    };
    let now = store::now_unix_nano() as u64;
    let ns_per_span = |f: &dyn Fn(&Bytes)| {
        let started = Instant::now();
        for body in &bodies {
            f(body);
        }
        started.elapsed().as_secs_f64() * 1e9 / spans
    };
    fn text(body: &Bytes) -> &str {
        std::str::from_utf8(body).expect("JSON bodies are UTF-8")
    }
    let ours = |body: &Bytes| {
        let (request, repaired, rejected) =
            decode(body.clone(), format).expect("generated requests decode");
        std::hint::black_box(prepare(
            request,
            &options,
            now,
            repaired.then_some(LOSSY_UTF8_WARNING),
            rejected,
        ));
    };
    let baseline = |body: &Bytes| {
        let request = if bench.json {
            serde_json::from_str::<ExportTraceServiceRequest>(text(body))
                .expect("generated requests decode")
        } else {
            ExportTraceServiceRequest::decode(body.clone()).expect("generated requests decode")
        };
        std::hint::black_box(request);
    };
    // For JSON, our decoder alone (`otlp_json::decode`), against the same baseline.
    let decode_alone = |body: &Bytes| {
        std::hint::black_box(otlp_json::decode(text(body)).expect("generated requests decode"));
    };
    let (mut ours_ns, mut baseline_ns, mut decode_ns) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..bench.rounds.max(1) {
        eprintln!("round {} of {}…", round + 1, bench.rounds.max(1));
        ours_ns.push(ns_per_span(&ours));
        baseline_ns.push(ns_per_span(&baseline));
        if bench.json {
            decode_ns.push(ns_per_span(&decode_alone));
        }
    }
    let (ours_median, ours_min, ours_max) = median_and_range(ours_ns);
    let (base_median, base_min, base_max) = median_and_range(baseline_ns);
    println!(
        "## receive: {}, {batch} spans/request, {} spans per round, median of {} rounds (min–max)",
        if bench.json { "OTLP/JSON" } else { "protobuf" },
        bench.spans.max(1),
        bench.rounds.max(1)
    );
    println!("| path | ns per span |\n|---|---|");
    println!(
        "| decode + normalise + encode rows + free (the receivers' work) | {ours_median:.0} ({ours_min:.0}–{ours_max:.0}) |"
    );
    println!(
        "| baseline: decode with the generated OTLP types + free | {base_median:.0} ({base_min:.0}–{base_max:.0}) |"
    );
    println!(
        "| receivers' work ÷ baseline | {:.2} |",
        ours_median / base_median
    );
    if bench.json {
        let (decode_median, decode_min, decode_max) = median_and_range(decode_ns);
        println!(
            "| budgetscope's OTLP/JSON decoder (`otlp_json::decode`) + free | {decode_median:.0} ({decode_min:.0}–{decode_max:.0}) |"
        );
        println!(
            "| budgetscope's decoder ÷ baseline | {:.2} |",
            decode_median / base_median
        );
    }
}

/// Times `analyze` (and the API's JSON of it) on one generated trace per size.
fn analyze_bench(bench: &AnalyzeBench) {
    use crate::analyze::{AnalyzeOptions, analyze};
    let options = AnalyzeOptions::default();
    println!(
        "## analysis: median of {} runs (min–max)",
        bench.repeats.max(1)
    );
    println!(
        "| spans | analyze | analyze + API JSON | baseline: index ids + sort by start | analyze ÷ baseline | flags |"
    );
    println!("|---|---|---|---|---|---|");
    for &size in &bench.spans {
        eprintln!("generating a trace of {size} spans…");
        let spans = large_trace(size);
        let runs = bench.repeats.max(1);
        let time = |f: &dyn Fn()| {
            median_and_range(
                (0..runs)
                    .map(|_| {
                        let started = Instant::now();
                        f();
                        started.elapsed().as_secs_f64() * 1e3
                    })
                    .collect(),
            )
        };
        let analysis = analyze(&spans, &options);
        let flags: usize = analysis.flag_counts.values().sum();
        let (analyze_ms, analyze_min, analyze_max) = time(&|| {
            std::hint::black_box(analyze(&spans, &options));
        });
        let (json_ms, json_min, json_max) = time(&|| {
            let analysis = analyze(&spans, &options);
            std::hint::black_box(
                serde_json::to_string(&crate::web::api::AnalysisJson::new(&spans, &analysis))
                    .unwrap_or_default(),
            );
        });
        let (base_ms, base_min, base_max) = time(&|| {
            let index: std::collections::HashMap<_, _> = spans
                .iter()
                .enumerate()
                .map(|(i, s)| (s.span_id, i))
                .collect();
            let mut order: Vec<usize> = (0..spans.len()).collect();
            order.sort_by_key(|&i| spans[i].start_unix_nano);
            std::hint::black_box((index, order));
        });
        println!(
            "| {size} | {analyze_ms:.2} ms ({analyze_min:.2}–{analyze_max:.2}) | {json_ms:.2} ms ({json_min:.2}–{json_max:.2}) | {base_ms:.2} ms ({base_min:.2}–{base_max:.2}) | {:.1} | {flags} |",
            analyze_ms / base_ms
        );
    }
}

/// Fills a fresh store, indexes it with the background analyzer's code, then times the
/// API through the real router (no network): server time per request.
async fn query_bench(bench: QueryBench) -> anyhow::Result<()> {
    use crate::analyze::AnalyzeOptions;
    use crate::indexer::{IndexerOptions, index_pass};
    use tower::ServiceExt as _;

    let databases = BenchDatabases::new(&bench.db).await?;
    let url = databases.fresh("query").await?;
    let store = store::open(&url).await?;
    let options = NormalizeOptions {
        budget_keys: DEFAULT_BUDGET_KEYS.iter().map(|k| k.to_string()).collect(),
    };
    let day = Duration::from_secs(86_400);

    // 1. Spans, in chunks so memory stays flat.
    let started = Instant::now();
    let mut written = 0usize;
    while written < bench.spans {
        let chunk = (bench.spans - written).min(100_000);
        let now = store::now_unix_nano() as u64;
        let spans: Vec<_> = generate_over(chunk, 512, day, 0.0)
            .into_iter()
            .flat_map(|r| normalize(r, &options, now).spans)
            .collect();
        for batch in spans.chunks(20_000) {
            store.write_spans(batch).await?;
        }
        written += chunk;
        eprintln!(
            "  stored {written}/{} spans ({:.0} spans/s)",
            bench.spans,
            written as f64 / started.elapsed().as_secs_f64()
        );
    }
    // 200 traces of 100 spans, for the trace-fetch target.
    let mut fat_ids = Vec::new();
    for i in 0..200u32 {
        let mut trace = large_trace(100);
        let id = crate::model::TraceId(rand::rng().random());
        for span in &mut trace {
            span.trace_id = id;
            span.start_unix_nano -= u64::from(i) * 400_000_000_000;
            span.end_unix_nano -= u64::from(i) * 400_000_000_000;
        }
        store.write_spans(&trace).await?;
        fat_ids.push(id);
    }
    let fill_seconds = started.elapsed().as_secs_f64();

    // 2. Summaries and rollups, through the background analyzer's pass.
    let started = Instant::now();
    let indexer = IndexerOptions {
        quiet_period: Duration::ZERO,
        analyze: AnalyzeOptions::default(),
        metrics: Default::default(),
        memory: crate::memory::MemoryBudget::for_limit(crate::memory::DEFAULT_LIMIT),
    };
    let mut traces = 0usize;
    let mut last_report = Instant::now();
    loop {
        let pass = index_pass(store.as_ref(), &indexer).await?;
        traces += pass.analysed;
        if last_report.elapsed() > Duration::from_secs(2) {
            eprintln!(
                "  summarised {traces} traces ({:.0} traces/s)",
                traces as f64 / started.elapsed().as_secs_f64()
            );
            last_report = Instant::now();
        }
        if !pass.more {
            break;
        }
    }
    let index_seconds = started.elapsed().as_secs_f64();

    // 3. Queries through the router.
    let app = crate::web::app(crate::web::AppState::new(
        store.clone(),
        AnalyzeOptions::default(),
    ));
    let time = |uri: String| {
        let app = app.clone();
        async move {
            let started = Instant::now();
            let response = app
                .oneshot(axum::http::Request::get(uri.as_str()).body(axum::body::Body::empty())?)
                .await?;
            let status = response.status();
            let body = axum::body::to_bytes(response.into_body(), usize::MAX).await?;
            let elapsed = started.elapsed().as_secs_f64() * 1e3;
            if !status.is_success() {
                bail!(
                    "{uri} answered {status}: {}",
                    String::from_utf8_lossy(&body)
                );
            }
            anyhow::Ok(elapsed)
        }
    };
    let percentiles = |mut times: Vec<f64>| {
        times.sort_by(f64::total_cmp);
        let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
        (at(0.5), at(0.95), at(0.99))
    };
    println!(
        "## queries on {} spans ({}), {} runs each",
        bench.spans + 20_000,
        databases.backend(),
        bench.runs
    );
    println!(
        "fill: {:.0} spans/s; background analyzer: {traces} traces in {index_seconds:.1} s ({:.0} traces/s)",
        (bench.spans + 20_000) as f64 / fill_seconds,
        traces as f64 / index_seconds
    );
    println!("| request | p50 ms | p95 ms | p99 ms |\n|---|---|---|---|");
    let mut trace_times = Vec::new();
    for run in 0..bench.runs {
        trace_times.push(time(format!("/api/traces/{}", fat_ids[run % fat_ids.len()])).await?);
    }
    let (p50, p95, p99) = percentiles(trace_times);
    println!(
        "| GET /api/traces/{{id}} (100-span trace, with analysis) | {p50:.2} | {p95:.2} | {p99:.2} |"
    );
    let searches = [
        "",
        "service=inventory",
        "service=billing&operation=POST%20%2Fapi%2Fv1%2Fbilling%2F%7Bid%7D",
        "flag=inflated",
        "outcome=exceeded",
        "min_duration_ms=100",
        "since=-1h",
        "min_budget_ms=1500&limit=50",
        "attr=http.response.status_code%3E%3D500",
    ];
    let mut all_search = Vec::new();
    for query in searches {
        let mut times = Vec::new();
        for _ in 0..bench.runs.div_ceil(4).max(5) {
            times.push(time(format!("/api/traces?{query}")).await?);
        }
        all_search.extend(times.iter().copied());
        let (p50, p95, p99) = percentiles(times);
        println!(
            "| GET /api/traces?{} | {p50:.2} | {p95:.2} | {p99:.2} |",
            if query.is_empty() {
                "(no filter)"
            } else {
                query
            }
        );
    }
    let (p50, p95, p99) = percentiles(all_search);
    println!("| **search, all of the above** | {p50:.2} | **{p95:.2}** | {p99:.2} |");
    let mut hop_times = Vec::new();
    for _ in 0..bench.runs.div_ceil(4).max(5) {
        hop_times.push(time("/api/hops?since=-24h".to_string()).await?);
    }
    let (hops_p50, p95, p99) = percentiles(hop_times);
    println!("| GET /api/hops?since=-24h (rollups) | {hops_p50:.2} | {p95:.2} | {p99:.2} |");
    for page in [
        "/?range=1h",
        "/?range=24h",
        "/?range=7d",
        "/traces",
        "/traces?outcome=exceeded&service=inventory",
        "/hops/inventory/POST%20%2Fapi%2Fv1%2Finventory%2F%7Bid%7D?range=24h",
    ] {
        let mut times = Vec::new();
        for _ in 0..bench.runs.div_ceil(4).max(5) {
            times.push(time(page.to_string()).await?);
        }
        let (p50, p95, p99) = percentiles(times);
        println!("| page {page} | {p50:.2} | {p95:.2} | {p99:.2} |");
    }
    let mut page_times = Vec::new();
    for run in 0..bench.runs {
        page_times.push(time(format!("/traces/{}", fat_ids[run % fat_ids.len()])).await?);
    }
    let (p50, p95, p99) = percentiles(page_times);
    println!("| page /traces/{{id}} (100-span trace) | {p50:.2} | {p95:.2} | {p99:.2} |");
    let now = store::now_unix_nano() as u64;
    let mut raw_times = Vec::new();
    let scanner = databases.raw_scanner(&url).await?;
    for _ in 0..5 {
        let started = Instant::now();
        scanner.scan(now - day.as_nanos() as u64, now + 1).await?;
        raw_times.push(started.elapsed().as_secs_f64() * 1e3);
    }
    let (raw_p50, _, _) = percentiles(raw_times);
    println!(
        "| baseline: raw scan of the same 24 h of spans (GROUP BY service, name) | {raw_p50:.2} | | |"
    );
    println!(
        "| hops (rollups) ÷ raw scan, medians | {:.3} | | |",
        hops_p50 / raw_p50
    );
    databases.cleanup().await;
    Ok(())
}

/// Stores one generated trace per size in a fresh SQLite store, then times the trace page
/// and, as the same-run baseline, the trace API (same fetch and analysis, JSON instead of
/// HTML), both through the real router.
async fn ui_bench(bench: UiBench) -> anyhow::Result<()> {
    use crate::analyze::AnalyzeOptions;
    use tower::ServiceExt as _;

    let dir = tempfile::tempdir()?;
    let store = store::open(&format!("sqlite://{}", dir.path().join("ui.db").display())).await?;
    let app = crate::web::app(crate::web::AppState::new(
        store.clone(),
        AnalyzeOptions::default(),
    ));
    println!(
        "## trace page server time (SQLite, through the router), {} runs each",
        bench.runs
    );
    println!(
        "| spans | page p50 | page p95 | page size | baseline: GET /api/traces/{{id}} p50 | page ÷ API |"
    );
    println!("|---|---|---|---|---|---|");
    for &size in &bench.spans {
        eprintln!("storing a trace of {size} spans…");
        let spans = large_trace(size);
        let id = spans[0].trace_id.to_hex();
        for chunk in spans.chunks(20_000) {
            store.write_spans(chunk).await?;
        }
        let timed = |uri: String| {
            let app = app.clone();
            async move {
                let started = Instant::now();
                let response = app
                    .oneshot(
                        axum::http::Request::get(uri.as_str()).body(axum::body::Body::empty())?,
                    )
                    .await?;
                let status = response.status();
                let body = axum::body::to_bytes(response.into_body(), usize::MAX).await?;
                if !status.is_success() {
                    bail!("{uri} answered {status}");
                }
                anyhow::Ok((started.elapsed().as_secs_f64() * 1e3, body.len()))
            }
        };
        let (mut page, mut api, mut bytes) = (Vec::new(), Vec::new(), 0);
        for run in 0..bench.runs.max(1) {
            eprint!("\r  run {}/{}   ", run + 1, bench.runs);
            let (ms, len) = timed(format!("/traces/{id}")).await?;
            page.push(ms);
            bytes = len;
            api.push(timed(format!("/api/traces/{id}")).await?.0);
        }
        eprintln!();
        page.sort_by(f64::total_cmp);
        api.sort_by(f64::total_cmp);
        let at = |v: &[f64], q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        println!(
            "| {size} | {:.1} ms | {:.1} ms | {:.0} KiB | {:.1} ms | {:.2} |",
            at(&page, 0.5),
            at(&page, 0.95),
            bytes as f64 / 1024.0,
            at(&api, 0.5),
            at(&page, 0.5) / at(&api, 0.5)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_traces_are_valid_and_carry_budgets() {
        let requests = generate(1_000, 100);
        assert_eq!(requests.len(), 10);
        let options = NormalizeOptions {
            budget_keys: DEFAULT_BUDGET_KEYS.iter().map(|k| k.to_string()).collect(),
        };
        let now = store::now_unix_nano() as u64;
        let spans: Vec<_> = requests
            .into_iter()
            .flat_map(|r| normalize(r, &options, now).spans)
            .collect();
        assert_eq!(spans.len(), 1_000, "every generated span is valid");
        assert!(
            spans.iter().all(|s| s.budget.is_some()),
            "every hop and call has a budget"
        );
        assert!(
            spans
                .iter()
                .any(|s| s.service == "edge" && s.parent_span_id.is_none())
        );
    }
}

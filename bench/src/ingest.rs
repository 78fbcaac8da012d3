//! `budgetscope-bench ingest`: end-to-end ingest throughput against a real server process,
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
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message as _;

use budgetscope::core::budget::DEFAULT_BUDGET_KEYS;
use budgetscope::otlp::generate::{generate, generate_over};
use budgetscope::otlp::normalize::{NormalizeOptions, normalize, span_count};
use budgetscope::store::query::DueQuery;
use budgetscope::store::{self, encode_rows};

use crate::{BenchDatabases, IngestBench, Transport, median_and_range, ms};

/// At most how long before its request is sent a trace of a paced run (`--rate`) starts: an
/// SDK's batch exporter sends a span within 5 s of its end (`OTEL_BSP_SCHEDULE_DELAY`).
const EXPORT_DELAY: Duration = Duration::from_secs(5);

/// Requests whose spans start in the `EXPORT_DELAY` before each is due to be sent at `rate`
/// spans/s, as a fleet's arrive: in start order give or take the export delay. (Starts
/// spread at random over a whole run made every index keyed by start time take its
/// inserts at random places.)
fn paced(
    mut requests: Vec<ExportTraceServiceRequest>,
    rate: u64,
) -> Vec<ExportTraceServiceRequest> {
    let mut before = 0u64;
    for request in &mut requests {
        let shift = before * 1_000_000_000 / rate;
        before += span_count(request) as u64;
        for span in request
            .resource_spans
            .iter_mut()
            .flat_map(|r| &mut r.scope_spans)
            .flat_map(|s| &mut s.spans)
        {
            span.start_time_unix_nano += shift;
            span.end_time_unix_nano += shift;
        }
    }
    requests
}

/// One export request, encoded (and for HTTP, compressed) before the timed run: the load
/// generator shares the machine's two cores with the server, and its own encoding is not
/// what the benchmark measures.
pub(crate) struct Prepared {
    pub request: ExportTraceServiceRequest,
    pub body: Bytes,
    pub spans: usize,
}

pub async fn ingest(bench: IngestBench) -> anyhow::Result<()> {
    if bench.batch == 0 || bench.concurrency == 0 || bench.spans == 0 {
        bail!("--batch, --concurrency and --spans must be at least 1");
    }
    eprintln!(
        "generating {} spans in requests of {}…",
        bench.spans, bench.batch
    );
    let requests = match bench.rate {
        0 => generate(bench.spans, bench.batch),
        rate => paced(
            generate_over(bench.spans, bench.batch, EXPORT_DELAY, 0.0),
            rate,
        ),
    };
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
    let exe = match &bench.server {
        Some(path) => path.clone(),
        None => crate::server_beside_harness()?,
    };
    let mut args = vec![
        "--max-queued-spans".to_string(),
        bench.max_queued_spans.to_string(),
    ];
    if let Some(quiet) = &bench.quiet_period {
        args.extend(["--quiet-period".to_string(), quiet.clone()]);
    }
    let server = ChildServer::start(&exe, &serve_url, &args).await?;
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
                sender.send_until_stored(request, &refusals).await?;
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
    // background analyzer, which yields to ingest (`src/pipeline/analyzer.rs`).
    let traces: HashSet<&[u8]> = prepared
        .iter()
        .flat_map(|p| &p.request.resource_spans)
        .flat_map(|r| &r.scope_spans)
        .flat_map(|s| &s.spans)
        .map(|span| span.trace_id.as_slice())
        .collect();
    let unsummarised = reopened
        .due_traces(&DueQuery::quiet(u64::MAX, u32::MAX))
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
            retention: None,
        };
        let now = budgetscope::clock::now_unix_nano();
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

pub(crate) async fn futures_join<T>(
    handles: Vec<tokio::task::JoinHandle<T>>,
) -> Vec<Result<T, tokio::task::JoinError>> {
    let mut results = Vec::with_capacity(handles.len());
    for handle in handles {
        results.push(handle.await);
    }
    results
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
    budgetscope::server::redact(url)
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

pub(crate) enum Sender {
    Grpc(tonic::client::Grpc<tonic::transport::Channel>),
    Http {
        client: reqwest::Client,
        url: String,
        content_type: &'static str,
        gzip: bool,
    },
}

impl Sender {
    pub(crate) async fn connect(
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

    /// Sends `request` until it is stored, waiting out each refusal's retry delay as
    /// exporters do and counting the refusals.
    pub(crate) async fn send_until_stored(
        &mut self,
        request: &Prepared,
        refusals: &AtomicU64,
    ) -> anyhow::Result<()> {
        loop {
            match self.send(request).await? {
                Outcome::Stored => return Ok(()),
                Outcome::RetryAfter(delay) => {
                    refusals.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(delay).await;
                }
            }
        }
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

/// A `budgetscope serve` child process on free ports.
pub(crate) struct ChildServer {
    child: tokio::process::Child,
    pub pid: u32,
    pub grpc_addr: SocketAddr,
    pub http_otlp_addr: SocketAddr,
    /// The UI and API (`/api/status`).
    pub http_addr: SocketAddr,
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
    /// Starts `exe serve` on `db` with `args` besides the database and the ports.
    pub(crate) async fn start(
        exe: &std::path::Path,
        db: &str,
        args: &[String],
    ) -> anyhow::Result<ChildServer> {
        let (grpc_addr, http_otlp_addr, http_addr) = free_ports()?;
        let mut child = tokio::process::Command::new(exe)
            .arg("serve")
            .args(["--db", db])
            .args(args)
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
            http_addr,
        })
    }

    fn proc_file(&self, name: &str) -> anyhow::Result<String> {
        std::fs::read_to_string(format!("/proc/{}/{name}", self.pid))
            .with_context(|| format!("cannot read /proc/{}/{name} (Linux only)", self.pid))
    }

    /// User + system CPU seconds (/proc/PID/stat fields 14 and 15, in USER_HZ = 100).
    pub(crate) fn cpu_seconds(&self) -> anyhow::Result<f64> {
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
    pub(crate) fn thread_cpu_seconds(&self) -> anyhow::Result<HashMap<u32, (String, f64)>> {
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

    pub(crate) fn rss_bytes(&self) -> anyhow::Result<u64> {
        Ok(self.status_kib("VmRSS:")? * 1024)
    }

    /// Resident memory that is not a mapped file: heap, stacks, SQLite's page cache.
    pub(crate) fn anon_rss_bytes(&self) -> anyhow::Result<u64> {
        Ok(self.status_kib("RssAnon:")? * 1024)
    }

    pub(crate) fn peak_rss_bytes(&self) -> anyhow::Result<u64> {
        Ok(self.status_kib("VmHWM:")? * 1024)
    }

    /// SIGTERM, then wait for the clean shutdown (which commits everything queued).
    pub(crate) async fn stop(mut self) -> anyhow::Result<()> {
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

/// User + system CPU seconds this process has used.
pub(crate) fn own_cpu_seconds() -> anyhow::Result<f64> {
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
pub(crate) fn cpu_by_thread_name(
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

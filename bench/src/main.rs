//! `budgetscope-bench`: budgetscope's benchmark harness (BENCHMARKS.md has the method and
//! the current figures of each benchmark). It is its own binary, outside the product:
//! `ingest` starts the `budgetscope` binary that sits beside it (or `--server`) as a child
//! process and exports to it over real OTLP; the other benchmarks call the library in
//! process, through the same public paths a server uses.

mod ingest;
mod inproc;
mod reads;
mod retention;
mod sustained;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};
use rand::Rng as _;

use budgetscope::store;

/// Measure budgetscope (method and figures: BENCHMARKS.md).
#[derive(Debug, Parser)]
#[command(name = "budgetscope-bench", version)]
struct Cli {
    #[command(subcommand)]
    command: BenchCommand,
}

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
    /// A fixed rate of realistic traces for minutes: how far analysis falls behind ingest
    /// (from the server's /api/status), with the ingest figures, CPU and memory.
    Sustained(sustained::SustainedBench),
    /// Concurrent reads of one huge flat trace from a real server under --memory-limit:
    /// statuses, answer sizes and the server's peak anonymous memory per endpoint.
    Reads(ReadsBench),
    /// Postgres: a day of analysed traces deleted row by row against a day's time
    /// partitions dropped, on one store holding both days.
    Retention(retention::RetentionBench),
}

#[derive(Debug, Clone, Args)]
pub struct ReadsBench {
    /// Spans of the trace.
    #[arg(long, default_value = "300000")]
    pub spans: usize,
    /// Reads sent at once to each endpoint.
    #[arg(long, default_value = "3")]
    pub concurrency: usize,
    /// The server's --memory-limit.
    #[arg(long, default_value = "256MiB")]
    pub memory_limit: String,
    /// The server binary (default: the budgetscope beside this harness), for a baseline.
    #[arg(long)]
    pub server: Option<PathBuf>,
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
    /// Passed to the server: its --quiet-period (`1h` keeps the background analyzer idle
    /// through a run, for ingest alone).
    #[arg(long)]
    pub quiet_period: Option<String>,
    /// Skip the raw-insert ceiling (end-to-end figures only).
    #[arg(long)]
    pub no_ceiling: bool,
    /// Times the raw-insert ceiling is measured, each on a fresh database; the ratio uses
    /// the median. One insert of 200k rows lasts about a second, and whether a WAL reset
    /// falls inside it moved single figures by up to a third.
    #[arg(long, default_value = "3")]
    pub ceiling_runs: usize,
    /// The `budgetscope` binary to run as the server (default: the one beside this
    /// program), e.g. an older build to compare with (benches/ab.sh).
    #[arg(long)]
    pub server: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result = tokio::runtime::Runtime::new()
        .context("could not start the async runtime")
        .and_then(|runtime| runtime.block_on(run(cli.command)));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Ingest(bench) => ingest::ingest(bench).await,
        BenchCommand::Sustained(bench) => sustained::sustained(bench).await,
        BenchCommand::Reads(bench) => reads::reads(bench).await,
        BenchCommand::Retention(bench) => retention::retention(bench).await,
        BenchCommand::Query(bench) => inproc::query_bench(bench).await,
        BenchCommand::Ui(bench) => inproc::ui_bench(bench).await,
        BenchCommand::Receive(bench) => {
            tokio::task::spawn_blocking(move || inproc::receive_bench(&bench)).await?;
            Ok(())
        }
        BenchCommand::Analyze(bench) => {
            tokio::task::spawn_blocking(move || inproc::analyze_bench(&bench)).await?;
            Ok(())
        }
    }
}

/// The `budgetscope` binary in the same directory as this one (`cargo build` puts both in
/// `target/<profile>/`).
fn server_beside_harness() -> anyhow::Result<PathBuf> {
    let harness = std::env::current_exe().context("cannot find this program's path")?;
    let server = harness.with_file_name(format!("budgetscope{}", std::env::consts::EXE_SUFFIX));
    anyhow::ensure!(
        server.is_file(),
        "no budgetscope binary at {}: build it (cargo build --release) or pass --server PATH",
        server.display()
    );
    Ok(server)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
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
                budgetscope::store::postgres::create_schema(base, &schema).await?;
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
            let store = store::postgres::PostgresBackend::connect(url).await?;
            for chunk in rows.chunks(ROWS_PER_TRANSACTION) {
                store.insert_rows(chunk, operations, &[]).await?;
            }
        } else {
            let store = store::sqlite::SqliteBackend::connect(url).await?;
            for chunk in rows.chunks(ROWS_PER_TRANSACTION) {
                store.insert_rows(chunk, operations, &[]).await?;
            }
        }
        Ok(())
    }

    async fn copy_rows(&self, url: &str, rows: &[store::SpanRow]) -> anyhow::Result<()> {
        let store = store::postgres::PostgresBackend::connect(url).await?;
        store.copy_rows(rows).await?;
        Ok(())
    }

    async fn cleanup(&self) {
        if let Some(base) = &self.postgres {
            for schema in self.schemas.lock().await.iter() {
                if let Err(error) = budgetscope::store::postgres::drop_schema(base, schema).await {
                    eprintln!("could not drop bench schema {schema}: {error}");
                }
            }
        }
    }
}

/// The baseline of `GET /api/hops`: the same per-hop counts of a range computed by scanning
/// its spans instead of reading rollups, on a connection of its own to the benchmark's
/// database (read-only and memory-mapped on SQLite, as the server's readers are).
enum RawScanner {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
}

impl RawScanner {
    async fn connect(url: &str) -> anyhow::Result<RawScanner> {
        use std::str::FromStr as _;
        Ok(if url.starts_with("postgres") {
            RawScanner::Postgres(sqlx::PgPool::connect(url).await?)
        } else {
            let options = sqlx::sqlite::SqliteConnectOptions::from_str(url)?
                .read_only(true)
                .pragma("mmap_size", "1073741824");
            RawScanner::Sqlite(sqlx::SqlitePool::connect_with(options).await?)
        })
    }

    async fn scan(&self, since: u64, until: u64) -> anyhow::Result<usize> {
        let since = i64::try_from(since).unwrap_or(i64::MAX);
        let until = i64::try_from(until).unwrap_or(i64::MAX);
        Ok(match self {
            // The start index keys on `start_unix_nano >> 30` (`src/store/sqlite.rs`).
            RawScanner::Sqlite(pool) => sqlx::query(
                "SELECT service, name, count(*), avg(budget_ms) FROM spans \
                 WHERE kind IN (2, 5) AND (start_unix_nano >> 30) BETWEEN (?1 >> 30) AND (?2 >> 30) \
                 AND start_unix_nano >= ?1 AND start_unix_nano < ?2 \
                 GROUP BY service, name",
            )
            .bind(since)
            .bind(until)
            .fetch_all(pool)
            .await?
            .len(),
            RawScanner::Postgres(pool) => sqlx::query(
                "SELECT service, name, count(*), avg(budget_ms) FROM spans \
                 WHERE kind IN (2, 5) AND start_unix_nano >= $1 AND start_unix_nano < $2 \
                 GROUP BY service, name",
            )
            .bind(since)
            .bind(until)
            .fetch_all(pool)
            .await?
            .len(),
        })
    }

    /// On Postgres, the planner statistics of the bench's tables, as autovacuum gathers them
    /// within a minute of a load: without them, a just-filled and emptied spans table reads
    /// as matching most of any list of trace ids, and is scanned whole.
    async fn analyse(&self) -> anyhow::Result<()> {
        if let RawScanner::Postgres(pool) = self {
            let tables: Vec<String> = sqlx::query_scalar(
                "SELECT c.relname::text FROM pg_class c \
                 WHERE c.relnamespace = to_regnamespace(current_schema()) \
                 AND c.relkind IN ('r', 'p') AND NOT c.relispartition",
            )
            .fetch_all(pool)
            .await?;
            for table in tables {
                sqlx::query(sqlx::AssertSqlSafe(format!("ANALYZE \"{table}\"")))
                    .execute(pool)
                    .await?;
            }
        }
        Ok(())
    }
}

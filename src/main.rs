//! The `budgetscope` binary: parse the command line, then hand over to the library.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

/// jemalloc instead of glibc's malloc. Ingest allocates many small strings per span on one
/// thread and frees whole batches on another (`pipeline/ingest.rs`); with glibc, `malloc`, `free`
/// and `malloc_consolidate` were nearly half of the request threads' time; jemalloc uses
/// less server CPU and commits more spans/s in every ingest configuration, with the same
/// peak RSS at 10k spans/s (`benches/ab.sh`, `benches/ingest.sh`). SQLite keeps calling
/// glibc's allocator.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options (its `malloc_conf`, under tikv-jemalloc-sys's `_rjem_` prefix):
/// freed pages go back to the OS within a second instead of ten, so the process's RSS
/// follows the live bytes that `--memory-limit` accounts rather than the last ten
/// seconds' peak (BENCHMARKS.md, "Memory"). `_RJEM_MALLOC_CONF` still overrides them.
#[cfg(not(target_env = "msvc"))]
#[unsafe(export_name = "_rjem_malloc_conf")]
static JEMALLOC_OPTIONS: JemallocOptions =
    JemallocOptions(c"dirty_decay_ms:1000,muzzy_decay_ms:0".as_ptr());

/// A `const char *` that C reads; the string is static and never written.
#[cfg(not(target_env = "msvc"))]
#[repr(transparent)]
struct JemallocOptions(*const std::ffi::c_char);

#[cfg(not(target_env = "msvc"))]
// SAFETY: the pointer is to a static, immutable C string.
unsafe impl Sync for JemallocOptions {}

#[derive(Debug, Parser)]
#[command(
    name = "budgetscope",
    version,
    about = "An OTLP trace endpoint that shows where each request's deadline budget went",
    long_about = "budgetscope receives OpenTelemetry traces over OTLP (gRPC and HTTP), stores \
        them in SQLite (default) or Postgres, and reads the remaining deadline budget that \
        services record on their spans (deadline.remaining_ms and friends).\n\n\
        Every setting can also be given as an environment variable (shown as [env: …])."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Parsed once at start-up, so the size of its largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Command {
    /// Run the OTLP receivers, the UI and the JSON API.
    Serve(budgetscope::server::config::ServeArgs),
    /// Analyse traces from an OTLP/JSON file or stdin and print their budget waterfalls.
    Analyze(budgetscope::cli::analyze::AnalyzeArgs),
    /// Print the advisor's findings (what each hop's timeout, reserve, fail-fast threshold
    /// and retry policy should be) from a database or a running server.
    Advise(budgetscope::cli::advise::AdviseArgs),
    /// Start a server and a live shop of instrumented services that make every budget
    /// mistake, to try budgetscope; with --endpoint, send generated traces to a running server.
    Demo(budgetscope::cli::demo::DemoArgs),
    /// Work with alert rules files.
    #[command(subcommand)]
    Rules(RulesCommand),
}

#[derive(Debug, Subcommand)]
enum RulesCommand {
    /// Validate a rules file: prints every problem with its rule and field and exits
    /// non-zero when there is one.
    Check {
        /// The YAML rules file (top level `rules:` and `receivers:`).
        file: std::path::PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal, never in a file or a log collector.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: could not start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => serve(args).await,
            Command::Analyze(args) => budgetscope::cli::analyze::run(args),
            Command::Advise(args) => {
                let fail = args.fail_on_finding;
                if budgetscope::cli::advise::run(args).await? && fail {
                    return Err(FoundAdvice.into());
                }
                Ok(())
            }
            Command::Demo(args) => budgetscope::cli::demo::run(args, shutdown_signal()?).await,
            Command::Rules(RulesCommand::Check { file }) => rules_check(&file),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) if error.is::<FoundAdvice>() => ExitCode::from(3),
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// `budgetscope advise --fail-on-finding` found something: exit status 3, no error line
/// (the findings are printed).
#[derive(Debug)]
struct FoundAdvice;

impl std::fmt::Display for FoundAdvice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the advisor has findings")
    }
}

impl std::error::Error for FoundAdvice {}

async fn serve(args: budgetscope::server::config::ServeArgs) -> anyhow::Result<()> {
    let config = args.validate()?;
    let server = budgetscope::server::start(&config).await?;
    // Install the handlers before announcing readiness: whoever waits for "is up" may signal
    // at once, and a SIGTERM that arrives before the handler exists kills the process
    // without the drain.
    let signal = shutdown_signal()?;
    reload_on_hangup(server.reloader())?;
    eprintln!(
        "budgetscope is up: OTLP gRPC {}, OTLP HTTP http://{}/v1/traces, UI and API http://{}/",
        server.otlp_grpc_addr, server.otlp_http_addr, server.http_addr
    );
    signal.await;
    eprintln!("shutting down: finishing in-flight exports…");
    server.shutdown().await;
    Ok(())
}

/// `budgetscope rules check FILE`: every problem on its own line, non-zero when any.
fn rules_check(file: &std::path::Path) -> anyhow::Result<()> {
    let set = budgetscope::pipeline::alerter::read_rules_file(file)?;
    println!(
        "{}: {} rule{} and {} receiver{}, no problems",
        file.display(),
        set.rules.len(),
        if set.rules.len() == 1 { "" } else { "s" },
        set.receivers.len(),
        if set.receivers.len() == 1 { "" } else { "s" },
    );
    Ok(())
}

/// Re-reads the rules and tokens files and the TLS certificate on each SIGHUP; a file with
/// problems keeps what it gave before.
fn reload_on_hangup(reload: budgetscope::server::Reload) -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangup = signal(SignalKind::hangup())?;
        tokio::spawn(async move {
            while hangup.recv().await.is_some() {
                reload.reload();
            }
        });
    }
    #[cfg(not(unix))]
    let _ = reload;
    Ok(())
}

/// Registers SIGINT and SIGTERM handlers now and returns a future that resolves on either.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut terminate = signal(SignalKind::terminate())?;
        Ok(async move {
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
            }
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            let _ = tokio::signal::ctrl_c().await;
        })
    }
}

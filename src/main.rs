//! The `budgetscope` binary: parse the command line, then hand over to the library.

use std::process::ExitCode;

use budgetscope::config::{Cli, Command};
use clap::Parser as _;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
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
            Command::Bench(command) => budgetscope::bench::run(command).await,
            Command::Analyze(args) => budgetscope::offline::run(args),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: budgetscope::config::ServeArgs) -> anyhow::Result<()> {
    let config = args.validate()?;
    let server = budgetscope::server::start(&config).await?;
    eprintln!(
        "budgetscope is up: OTLP gRPC {}, OTLP HTTP http://{}/v1/traces, UI and API http://{}/",
        server.otlp_grpc_addr, server.otlp_http_addr, server.http_addr
    );
    wait_for_signal().await;
    eprintln!("shutting down: finishing in-flight exports…");
    server.shutdown().await;
    Ok(())
}

async fn wait_for_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = terminate => {}
    }
}

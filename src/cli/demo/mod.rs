//! `budgetscope demo`. On its own: starts a server (a temporary SQLite database unless
//! `--db`) and a live shop of four instrumented services that send it their traces over
//! OTLP, under a load generator that makes every budget mistake in turn (`shop`,
//! `traffic`). With `--endpoint`: sends generated traces to a running server (`generated`).
//!
//! Architecture invariant: the services are clients like any exporter; the demo knows the
//! server only through `server::start` and its addresses.

mod billing;
mod generated;
mod http;
mod service;
mod shop;
mod telemetry;
mod traffic;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args;
use tokio_util::sync::CancellationToken;

use crate::server::config::ServeArgs;

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Instead of starting a server and a live system: send generated traces, spread over
    /// the past, to a running server's OTLP/HTTP endpoint (e.g.
    /// http://127.0.0.1:4318/v1/traces).
    #[arg(long)]
    pub endpoint: Option<String>,
    /// With --endpoint: the server's UI, printed when the traces are sent.
    #[arg(long, requires = "endpoint", default_value = "http://127.0.0.1:8080/")]
    pub ui: String,
    /// With --endpoint: spans to send in total.
    #[arg(long, requires = "endpoint", default_value = "5000")]
    pub spans: usize,
    /// With --endpoint: spread the traces' start times over this period before now
    /// (e.g. 15m, 1h, 1d).
    #[arg(long, requires = "endpoint", default_value = "1h")]
    pub spread: String,
    /// With --endpoint: also send one trace of this many spans (a fan-out tree across
    /// services), to see how the waterfall handles large traces.
    #[arg(long, requires = "endpoint")]
    pub large_trace: Option<usize>,
    /// Address of the demo server's OTLP/gRPC receiver.
    #[arg(long, conflicts_with = "endpoint", default_value = "127.0.0.1:4317")]
    pub otlp_grpc_addr: String,
    /// Address of the demo server's OTLP/HTTP receiver.
    #[arg(long, conflicts_with = "endpoint", default_value = "127.0.0.1:4318")]
    pub otlp_http_addr: String,
    /// Address of the demo server's web UI and JSON API.
    #[arg(long, conflicts_with = "endpoint", default_value = "127.0.0.1:8080")]
    pub http_addr: String,
    /// The demo server's database: sqlite://PATH or postgres://USER@HOST/DB, kept after
    /// the demo. Default: a temporary SQLite file, removed when the demo stops.
    #[arg(long, conflicts_with = "endpoint")]
    pub db: Option<String>,
    /// Requests per second the load generator sends to the shop.
    #[arg(long, conflicts_with = "endpoint", default_value = "4")]
    pub rate: f64,
}

/// Runs the demo until `shutdown` resolves (the live system) or the traces are sent.
pub async fn run(args: DemoArgs, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    match &args.endpoint {
        Some(endpoint) => {
            generated::run(
                endpoint,
                &args.ui,
                args.spans,
                &args.spread,
                args.large_trace,
            )
            .await
        }
        None => live(&args, shutdown).await,
    }
}

/// A temporary SQLite database's files, removed when dropped.
struct TemporaryDb(PathBuf);

impl Drop for TemporaryDb {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm", ".lock"] {
            let mut path = self.0.clone().into_os_string();
            path.push(suffix);
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The address a local client dials for a listener bound to `addr`.
fn dial(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::from(([127, 0, 0, 1], addr.port()))
        }
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, addr.port()))
        }
        _ => addr,
    }
}

async fn live(args: &DemoArgs, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    if !(0.1..=1000.0).contains(&args.rate) {
        bail!(
            "invalid --rate {}: give requests per second between 0.1 and 1000, e.g. 4",
            args.rate
        );
    }
    let temporary = args.db.is_none().then(|| {
        TemporaryDb(
            std::env::temp_dir().join(format!("budgetscope-demo-{}.db", std::process::id())),
        )
    });
    let db = match (&args.db, &temporary) {
        (Some(db), _) => db.clone(),
        (None, Some(file)) => format!("sqlite://{}", file.0.display()),
        (None, None) => unreachable!("a temporary database is made when --db is absent"),
    };
    // The demo's server analyses a trace 3 s after its last span, so the overview fills
    // within seconds; the rest is `serve`'s defaults.
    let serve = ServeArgs::try_parse_from([
        "serve",
        "--otlp-grpc-addr",
        &args.otlp_grpc_addr,
        "--otlp-http-addr",
        &args.otlp_http_addr,
        "--http-addr",
        &args.http_addr,
        "--db",
        &db,
        "--quiet-period",
        "3s",
    ])
    .context("the demo's server settings")?;
    // The shop's exporters send plain OTLP without a token: settings for `serve` left in
    // the environment (BUDGETSCOPE_OTLP_TOKENS, BUDGETSCOPE_TLS_*) must not lock them out.
    let serve = ServeArgs {
        otlp_tokens: None,
        tls_cert: None,
        tls_key: None,
        ..serve
    };
    let config = serve.validate()?;
    let server = crate::server::start(&config).await.context(
        "the demo's server did not start; if another budgetscope uses these ports, give the \
         demo others (--otlp-grpc-addr, --otlp-http-addr, --http-addr), or send generated \
         traces to the running one with `budgetscope demo --endpoint \
         http://127.0.0.1:4318/v1/traces`",
    )?;
    let otlp_http = format!("http://{}", dial(server.otlp_http_addr));
    let otlp_grpc = format!("http://{}", dial(server.otlp_grpc_addr));
    let ui = format!("http://{}/", dial(server.http_addr));
    let shop = match shop::Shop::start(&otlp_http, &otlp_grpc).await {
        Ok(shop) => shop,
        Err(error) => {
            server.shutdown().await;
            return Err(error.context("the demo's services did not start"));
        }
    };
    let stop = CancellationToken::new();
    let tally = Arc::new(traffic::Tally::default());
    let load = tokio::spawn(traffic::run(
        shop.gateway.clone(),
        args.rate,
        stop.clone(),
        tally.clone(),
    ));
    eprintln!(
        "budgetscope demo is up: open {ui}\n\
         \n\
         A shop of four services sends its traces to it over OTLP: gateway, orders and \
         inventory over HTTP (budget in X-Request-Budget-Ms), billing over gRPC (its \
         deadline). A load generator sends {} requests/s: healthy ones, and in between each \
         budget mistake in turn (a slow leaf, a callee that ignores its deadline, a fixed \
         timeout, a server default, a proxy that strips the budget, a sidecar tracing \
         elsewhere, retries, calls with nothing left, admission control). Every flag shows \
         on the overview within about 20 s.\n\
         Database: {}. Ctrl-C stops the demo.",
        args.rate,
        if temporary.is_some() {
            "temporary, removed when the demo stops (give --db to keep it)".to_string()
        } else {
            crate::server::redact(&db)
        },
    );
    let progress = async {
        let mut every = tokio::time::interval(Duration::from_secs(10));
        every.tick().await;
        loop {
            every.tick().await;
            eprintln!("{}", tally.line());
        }
    };
    tokio::select! {
        _ = shutdown => {}
        _ = progress => {}
    }
    eprintln!(
        "stopping the demo: waiting for requests in flight, sending the last spans and metrics…"
    );
    stop.cancel();
    let _ = load.await;
    shop.shutdown().await;
    server.shutdown().await;
    eprintln!("demo stopped. {}", tally.line());
    drop(temporary);
    Ok(())
}

//! The process: `serve`'s configuration (`config.rs`), the listeners (`listen.rs`, `tls.rs`),
//! the OTLP endpoints (`otlp_grpc.rs`, `otlp_http.rs`), and `start`, which wires the store,
//! the pipeline, the endpoints, the web app and retention together and takes them down in
//! order.
//!
//! Architecture invariant: the only place that wires layers together; it holds no analysis
//! rule and no SQL.
//!
//! Shutdown order: stop accepting connections and let in-flight requests finish (each one
//! waits for its commit), then close the ingest queue and let the writers drain it, then
//! stop retention. So every span acknowledged to an exporter is committed before exit.

pub mod config;
pub mod listen;
pub mod otlp_grpc;
pub mod otlp_http;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::core::analyze::AnalyzeOptions;
use crate::otlp::normalize::NormalizeOptions;
use crate::pipeline::alerter::{self, AlerterOptions, RuleBook};
use crate::pipeline::analyzer::{self, AnalyzerOptions};
use crate::pipeline::held::HeldTraces;
use crate::pipeline::ingest::{IngestOptions, Ingestor};
use crate::pipeline::lease::Lease;
use crate::pipeline::memory::MemoryBudget;
use crate::pipeline::metrics::Metrics;
use crate::pipeline::reanalysis::Reanalysis;
use crate::pipeline::receiver::{Receiver, ReceiverParts};
use crate::pipeline::retention::{self, Retention};
use crate::pipeline::status::{self, Monitor};
use crate::server::config::{DbUrl, ServeConfig};
use crate::server::tls::Certificate;
use crate::store::{self, Store};
use crate::web::access::{Tokens, UiAccess};
use crate::web::{self, AppState};
use listen::Limits;

/// How often queued notifications are looked for (retries wait at least 1 s).
const DELIVERY_POLL: Duration = Duration::from_millis(500);

/// A started server and the addresses it actually bound (port 0 picks a free one).
pub struct RunningServer {
    pub otlp_grpc_addr: SocketAddr,
    pub otlp_http_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub store: Arc<dyn Store>,
    /// The alert rules in force; `reload` re-reads the rules file.
    pub rules: Arc<RuleBook>,
    /// The tokens of `--otlp-tokens` and `--ui-tokens`; `reload` re-reads their files.
    pub otlp_tokens: Arc<Tokens>,
    pub ui_tokens: Arc<Tokens>,
    /// The certificate of `--tls-cert`; `reload` re-reads it.
    pub certificate: Option<Arc<Certificate>>,
    stop_accepting: CancellationToken,
    stop_background: CancellationToken,
    listeners: Vec<JoinHandle<()>>,
    /// Retention, the background analyzer, the alerter and the lease's renewals.
    background: Vec<JoinHandle<()>>,
    ingestor: Arc<Ingestor>,
    /// The lease on retention and alerts, given up once they have stopped.
    lease: Arc<Lease>,
}

pub fn ingest_options(db: &DbUrl, max_queued_spans: usize) -> IngestOptions {
    // SQLite takes one writer at a time, on a thread of its own; Postgres commits in
    // parallel from tasks of the main runtime, which owns its sockets.
    let (writers, own_threads) = match db {
        DbUrl::Sqlite(_) => (1, true),
        DbUrl::Postgres(_) => (4, false),
    };
    IngestOptions {
        max_queued_spans,
        max_batch_spans: 20_000,
        writers,
        own_threads,
    }
}

/// Opens the store and starts every listener.
pub async fn start(config: &ServeConfig) -> anyhow::Result<RunningServer> {
    // Before anything is opened or bound: a rules file with problems stops start-up.
    let rules = Arc::new(RuleBook::load(config.rules.clone()).context(
        "the rules file (--rules) has problems; `budgetscope rules check FILE` lists them",
    )?);
    let tokens = |path: &Option<std::path::PathBuf>, flag: &str| {
        Tokens::load(path.clone())
            .map(Arc::new)
            .with_context(|| format!("--{flag} names a file that cannot be used"))
    };
    let otlp_tokens = tokens(&config.otlp_tokens, "otlp-tokens")?;
    let ui_tokens = tokens(&config.ui_tokens, "ui-tokens")?;
    let ui_access = Arc::new(UiAccess::new(
        ui_tokens.clone(),
        config.trusted_proxies.clone(),
        config.proxy_user_header.clone(),
    ));
    let certificate = match &config.tls {
        Some((cert, key)) => Some(
            Certificate::load(cert.clone(), key.clone())
                .context("--tls-cert and --tls-key must name a PEM certificate and its key")?,
        ),
        None => None,
    };
    for (addr, required, flag) in [
        (config.otlp_grpc_addr, otlp_tokens.required(), "otlp-tokens"),
        (config.otlp_http_addr, otlp_tokens.required(), "otlp-tokens"),
        (config.http_addr, ui_access.required(), "ui-tokens"),
    ] {
        if !addr.ip().is_loopback() && !required {
            tracing::warn!(
                %addr,
                "listening beyond loopback without authentication: anyone who reaches {addr} \
                 gets in; give --{flag} a file of tokens, or put an authenticating proxy in front"
            );
        }
    }
    // Listeners first: a port in use stops start-up before a database file is created.
    let bind = |addr: SocketAddr, flag: &'static str| async move {
        TcpListener::bind(addr).await.with_context(|| {
            format!("could not listen on {addr} (--{flag}); is another process using it?")
        })
    };
    let grpc_listener = bind(config.otlp_grpc_addr, "otlp-grpc-addr").await?;
    let otlp_http_listener = bind(config.otlp_http_addr, "otlp-http-addr").await?;
    let http_listener = bind(config.http_addr, "http-addr").await?;
    let otlp_grpc_addr = grpc_listener.local_addr()?;
    let otlp_http_addr = otlp_http_listener.local_addr()?;
    let http_addr = http_listener.local_addr()?;

    let store = store::open(config.db.as_str()).await.with_context(|| {
        format!(
            "could not open the database {}; check --db (BUDGETSCOPE_DB)",
            redact(config.db.as_str())
        )
    })?;
    let ingestor = Ingestor::start(
        store.clone(),
        &ingest_options(&config.db, config.max_queued_spans),
    );
    let metrics = Arc::new(Metrics::default());
    let memory = MemoryBudget::for_limit(config.memory_limit);
    let held = HeldTraces::new(&memory);
    let receiver = Receiver::new(ReceiverParts {
        ingestor: ingestor.clone(),
        store: store.clone(),
        options: NormalizeOptions {
            budget_keys: config.budget_keys.clone(),
            retention: Some(config.retention),
        },
        metric_names: config.metric_names.clone(),
        metrics: metrics.clone(),
        memory: memory.clone(),
        held: held.clone(),
    });

    let stop_accepting = CancellationToken::new();
    let open_files = listen::raise_open_files_limit();
    let max_connections = listen::fit_connections(config.max_connections, open_files, 3);
    if max_connections < config.max_connections {
        tracing::warn!(
            max_connections,
            open_files,
            "--max-connections lowered to fit the open-files limit (ulimit -n) over 3 listeners"
        );
    }
    let limits = Limits {
        max_connections,
        http2_only: false,
    };
    let grpc = listen::serve(
        grpc_listener,
        otlp_grpc::service(
            receiver.clone(),
            config.max_request_bytes,
            otlp_tokens.clone(),
        ),
        Limits {
            http2_only: true,
            ..limits
        },
        certificate.as_ref().map(|c| c.acceptor(true)),
        stop_accepting.clone(),
        "otlp grpc",
    );
    let otlp_http = listen::serve(
        otlp_http_listener,
        otlp_http::router(
            receiver,
            config.max_request_bytes,
            &config.cors_origins,
            otlp_tokens.clone(),
        ),
        limits,
        certificate.as_ref().map(|c| c.acceptor(false)),
        stop_accepting.clone(),
        "otlp http",
    );
    // Asked for before the work it guards starts, so a lone server does it at once.
    let lease = Arc::new(Lease::new("background", Lease::holder_name(http_addr)));
    lease.renew(store.as_ref()).await;
    let analyze_options = AnalyzeOptions {
        tolerance_ms: config.tolerance_ms,
    };
    let reanalysis = Arc::new(Reanalysis::new(analyze_options.version()));
    let status = Monitor::new(
        store.clone(),
        metrics.clone(),
        Some(ingestor.clone()),
        Some(lease.clone()),
        Some(reanalysis.clone()),
        config.quiet_period,
        config.max_disk,
    );
    let http = listen::serve(
        http_listener,
        web::app(AppState {
            store: store.clone(),
            analyze: AnalyzeOptions {
                tolerance_ms: config.tolerance_ms,
            },
            rules: rules.clone(),
            external_url: config.external_url.clone(),
            metrics: metrics.clone(),
            ingest: Some(ingestor.clone()),
            allowed_hosts: web::allowed_hosts(config.http_addr, &config.allowed_hosts),
            status: status.clone(),
            access: ui_access,
            memory: memory.clone(),
            retention_healthy: (config.retention_healthy < config.retention)
                .then_some(config.retention_healthy),
        }),
        limits,
        certificate.as_ref().map(|c| c.acceptor(false)),
        stop_accepting.clone(),
        "ui and api",
    );
    let stop_background = CancellationToken::new();
    let alerter_options = AlerterOptions {
        interval: config.alert_interval,
        delay: config.alert_delay,
        external_url: config.external_url.clone(),
        analyze: AnalyzeOptions {
            tolerance_ms: config.tolerance_ms,
        },
    };
    let background = vec![
        tokio::spawn({
            let (lease, store, stop) = (lease.clone(), store.clone(), stop_background.clone());
            async move { lease.run(store.as_ref(), stop).await }
        }),
        tokio::spawn(retention::run(
            store.clone(),
            Retention {
                all: config.retention,
                healthy: config.retention_healthy,
                max_disk: config.max_disk,
            },
            metrics.clone(),
            lease.clone(),
            stop_background.clone(),
        )),
        tokio::spawn(analyzer::run(
            store.clone(),
            AnalyzerOptions {
                quiet_period: config.quiet_period,
                max_trace_wait: config.max_trace_wait,
                analyze: AnalyzeOptions {
                    tolerance_ms: config.tolerance_ms,
                },
                metrics: metrics.clone(),
                memory,
                held,
            },
            ingestor.clone(),
            reanalysis,
            lease.clone(),
            stop_background.clone(),
        )),
        tokio::spawn(status::run(status, stop_background.clone())),
        tokio::spawn(alerter::run(
            store.clone(),
            rules.clone(),
            alerter_options.clone(),
            metrics.clone(),
            lease.clone(),
            stop_background.clone(),
        )),
        tokio::spawn(alerter::deliver(
            store.clone(),
            rules.clone(),
            alerter_options,
            DELIVERY_POLL,
            lease.clone(),
            stop_background.clone(),
        )),
    ];
    tracing::info!(
        %otlp_grpc_addr, %otlp_http_addr, %http_addr, store = store.backend(),
        tls = certificate.is_some(), "budgetscope listening"
    );
    Ok(RunningServer {
        otlp_grpc_addr,
        otlp_http_addr,
        http_addr,
        store,
        rules,
        otlp_tokens,
        ui_tokens,
        certificate,
        stop_accepting,
        stop_background,
        listeners: vec![grpc, otlp_http, http],
        background,
        ingestor,
        lease,
    })
}

/// What SIGHUP re-reads: the rules file, the tokens files and the TLS certificate. A file
/// with problems keeps what it gave before, and says so in the log.
#[derive(Clone)]
pub struct Reload {
    rules: Arc<RuleBook>,
    otlp_tokens: Arc<Tokens>,
    ui_tokens: Arc<Tokens>,
    certificate: Option<Arc<Certificate>>,
}

impl Reload {
    pub fn reload(&self) {
        match self.rules.reload() {
            Ok(count) => tracing::info!(rules = count, "reloaded the rules file"),
            Err(error) => tracing::error!(
                "the rules file was not reloaded; the previous rules stay in force: {error}"
            ),
        }
        for (tokens, flag) in [
            (&self.otlp_tokens, "--otlp-tokens"),
            (&self.ui_tokens, "--ui-tokens"),
        ] {
            if !tokens.required() {
                continue;
            }
            match tokens.reload() {
                Ok(count) => tracing::info!(tokens = count, "reloaded the {flag} file"),
                Err(error) => tracing::error!(
                    "the {flag} file was not reloaded; the previous tokens stay in force: {error}"
                ),
            }
        }
        if let Some(certificate) = &self.certificate {
            match certificate.reload() {
                Ok(()) => tracing::info!("reloaded the TLS certificate and key"),
                Err(error) => tracing::error!(
                    "the TLS certificate was not reloaded; the previous one stays in force: {error}"
                ),
            }
        }
    }
}

impl RunningServer {
    /// The files SIGHUP re-reads.
    pub fn reloader(&self) -> Reload {
        Reload {
            rules: self.rules.clone(),
            otlp_tokens: self.otlp_tokens.clone(),
            ui_tokens: self.ui_tokens.clone(),
            certificate: self.certificate.clone(),
        }
    }

    /// Stops accepting, finishes in-flight requests, commits everything queued.
    pub async fn shutdown(self) {
        self.stop_accepting.cancel();
        for listener in self.listeners {
            let _ = listener.await;
        }
        self.ingestor.shutdown().await;
        self.stop_background.cancel();
        for task in self.background {
            let _ = task.await;
        }
        self.lease.release(self.store.as_ref()).await;
        tracing::info!("budgetscope stopped; every acknowledged span is committed");
    }
}

/// A database URL without its password, for messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let credentials = &url[scheme + 3..at];
            match credentials.find(':') {
                Some(colon) => format!(
                    "{}{}:***{}",
                    &url[..scheme + 3],
                    &credentials[..colon],
                    &url[at..]
                ),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn redact_hides_passwords_only() {
        assert_eq!(redact("postgres://u:secret@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("sqlite://x.db"), "sqlite://x.db");
    }
}

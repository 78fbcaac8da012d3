//! Command-line and environment settings, validated once into `ServeConfig`.
//!
//! Architecture invariant: nothing runs until parsing succeeded; every invalid setting is
//! reported with its flag and environment variable names. The validated config is passed
//! down explicitly, in parts, never kept in a global.

use std::net::SocketAddr;
use std::time::Duration;

use axum::http::{HeaderName, HeaderValue};
use clap::Args;

use crate::core::budget::DEFAULT_BUDGET_KEYS;
use crate::otlp::deadline_metrics::MetricNames;
use crate::pipeline::memory;

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address for OTLP/gRPC (TraceService/Export).
    #[arg(
        long,
        env = "BUDGETSCOPE_OTLP_GRPC_ADDR",
        default_value = "127.0.0.1:4317"
    )]
    pub otlp_grpc_addr: String,

    /// Address for OTLP/HTTP (POST /v1/traces).
    #[arg(
        long,
        env = "BUDGETSCOPE_OTLP_HTTP_ADDR",
        default_value = "127.0.0.1:4318"
    )]
    pub otlp_http_addr: String,

    /// Address for the web UI and the JSON API.
    #[arg(long, env = "BUDGETSCOPE_HTTP_ADDR", default_value = "127.0.0.1:8080")]
    pub http_addr: String,

    /// Database URL: sqlite://PATH (created if missing) or postgres://USER@HOST/DB.
    #[arg(
        long,
        env = "BUDGETSCOPE_DB",
        default_value = "sqlite://budgetscope.db"
    )]
    pub db: String,

    /// Span attributes read for the remaining budget, first match wins (comma-separated).
    /// Keys ending in grpc-timeout are read in gRPC's format (850m); others as milliseconds.
    #[arg(
        long,
        env = "BUDGETSCOPE_BUDGET_KEYS",
        value_delimiter = ',',
        default_values_t = DEFAULT_BUDGET_KEYS.iter().map(|k| k.to_string()).collect::<Vec<_>>()
    )]
    pub budget_keys: Vec<String>,

    /// Name of the histogram of the budget each hop received (OTLP metrics; in ms or s).
    #[arg(
        long,
        env = "BUDGETSCOPE_METRIC_RECEIVED",
        default_value = "deadline.budget_received"
    )]
    pub metric_received: String,

    /// Name of the histogram of the budget left when each hop answered (OTLP metrics).
    #[arg(
        long,
        env = "BUDGETSCOPE_METRIC_REMAINING",
        default_value = "deadline.budget_remaining"
    )]
    pub metric_remaining: String,

    /// Name of the counter of requests that ran out of budget (OTLP metrics).
    #[arg(
        long,
        env = "BUDGETSCOPE_METRIC_EXCEEDED",
        default_value = "deadline.exceeded"
    )]
    pub metric_exceeded: String,

    /// Attribute of the deadline metrics naming the hop (the operation, as spans name it).
    #[arg(long, env = "BUDGETSCOPE_METRIC_HOP_KEY", default_value = "hop")]
    pub metric_hop_key: String,

    /// Attribute of the exceeded counter saying whose deadline ran out: local or inherited.
    #[arg(long, env = "BUDGETSCOPE_METRIC_ORIGIN_KEY", default_value = "origin")]
    pub metric_origin_key: String,

    /// Tolerance in milliseconds under which budget differences are never flagged.
    #[arg(
        long,
        env = "BUDGETSCOPE_TOLERANCE_MS",
        default_value = "50",
        allow_negative_numbers = true
    )]
    pub tolerance_ms: f64,

    /// Largest OTLP request accepted, after decompression (e.g. 20MiB, 512KiB, 1000000).
    #[arg(long, env = "BUDGETSCOPE_MAX_REQUEST_BYTES", default_value = "20MiB")]
    pub max_request_bytes: String,

    /// How long spans are kept (e.g. 7d, 12h, 30m).
    #[arg(long, env = "BUDGETSCOPE_RETENTION", default_value = "7d")]
    pub retention: String,

    /// How long healthy traces (no flag, not exceeded) are kept, at most --retention (e.g.
    /// 1d); the hop statistics keep counting them for the full --retention. Default: 1d, or
    /// --retention when shorter.
    #[arg(long, env = "BUDGETSCOPE_RETENTION_HEALTHY")]
    pub retention_healthy: Option<String>,

    /// A soft cap on the SQLite store's disk (e.g. 50GB, 500MiB; at least 64MiB): near it,
    /// the oldest healthy traces are deleted first, then the oldest others, so the file
    /// stops growing (it does not shrink). Not on Postgres. Default: none.
    #[arg(long, env = "BUDGETSCOPE_MAX_DISK")]
    pub max_disk: Option<String>,

    /// Browser origins allowed to export over OTLP/HTTP (comma-separated; none by default).
    #[arg(long, env = "BUDGETSCOPE_CORS_ORIGINS", value_delimiter = ',')]
    pub cors_origins: Vec<String>,

    /// How long a trace must receive no spans before it is analysed for search (e.g. 10s).
    /// While exporters wait on the store, analysis yields to ingest and catches up later.
    #[arg(long, env = "BUDGETSCOPE_QUIET_PERIOD", default_value = "10s")]
    pub quiet_period: String,

    /// How long a trace that keeps receiving spans waits for analysis, at most: it is
    /// analysed at that age, again every time it waits that long, and when it goes quiet
    /// (streams, batch jobs, a client reusing a trace id). At least the quiet period.
    /// Default: 5m, or the quiet period when that is longer.
    #[arg(long, env = "BUDGETSCOPE_MAX_TRACE_WAIT")]
    pub max_trace_wait: Option<String>,

    /// Open connections per listener, at most; beyond it new connections are closed at once
    /// (clients retry). Lowered at start to fit the open-files limit.
    #[arg(long, env = "BUDGETSCOPE_MAX_CONNECTIONS", default_value = "4096")]
    pub max_connections: usize,

    /// Spans accepted but not yet committed, at most; beyond it exporters are told to retry.
    #[arg(long, env = "BUDGETSCOPE_MAX_QUEUED_SPANS", default_value = "200000")]
    pub max_queued_spans: usize,

    /// Memory the process aims to stay within (e.g. 512MiB, 2GiB; at least 256MiB). 128 MiB
    /// of it is kept for fixed costs; export requests, from their first byte until their
    /// spans are committed, and the background analyzer share the rest: past it exporters
    /// are told to retry and the analyzer works in smaller passes.
    #[arg(long, env = "BUDGETSCOPE_MEMORY_LIMIT", default_value = "512MiB")]
    pub memory_limit: String,

    /// Alert rules and receivers, in YAML (top level rules: and receivers:; see
    /// docs/alerts.md). Re-read on SIGHUP; `budgetscope rules check FILE` validates one.
    #[arg(long, env = "BUDGETSCOPE_RULES")]
    pub rules: Option<std::path::PathBuf>,

    /// How often alert rules are evaluated.
    #[arg(long, env = "BUDGETSCOPE_ALERT_INTERVAL", default_value = "30s")]
    pub alert_interval: String,

    /// How far behind the clock an alert window ends, so that traces are summarised before
    /// they are judged. Default: the quiet period plus 30s.
    #[arg(long, env = "BUDGETSCOPE_ALERT_DELAY")]
    pub alert_delay: Option<String>,

    /// The UI's address as people reach it, for links in notifications.
    /// Default: http:// and --http-addr.
    #[arg(long, env = "BUDGETSCOPE_EXTERNAL_URL")]
    pub external_url: Option<String>,

    /// Host names the UI and API answer to besides localhost and the literal loopback
    /// addresses, when bound to loopback (comma-separated; the external URL's host is
    /// added). Bound elsewhere: when given, the only names answered. Others get 421.
    #[arg(long, env = "BUDGETSCOPE_ALLOWED_HOSTS", value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,

    /// A file of tokens for the OTLP receivers, one per line: exporters then send
    /// `Authorization: Bearer TOKEN` (gRPC metadata or HTTP header), others get 401 or
    /// UNAUTHENTICATED. Re-read on SIGHUP. Default: no token needed.
    #[arg(long, env = "BUDGETSCOPE_OTLP_TOKENS")]
    pub otlp_tokens: Option<std::path::PathBuf>,

    /// A file of tokens for the UI and API, one per line, sent as `Authorization: Bearer
    /// TOKEN` or as the password of HTTP basic authentication (any user name, so a browser
    /// can log in); /healthz and /readyz stay open. Re-read on SIGHUP. Default: none needed.
    #[arg(long, env = "BUDGETSCOPE_UI_TOKENS")]
    pub ui_tokens: Option<std::path::PathBuf>,

    /// Addresses of authenticating proxies in front of the UI and API (IPs or CIDR blocks,
    /// comma-separated): a request from one of them that carries --proxy-user-header is let
    /// in as that user. The header is ignored from every other address. Default: none.
    #[arg(long, env = "BUDGETSCOPE_TRUSTED_PROXIES", value_delimiter = ',')]
    pub trusted_proxies: Vec<String>,

    /// The header in which a trusted proxy names the user it authenticated.
    #[arg(
        long,
        env = "BUDGETSCOPE_PROXY_USER_HEADER",
        default_value = "X-Forwarded-User"
    )]
    pub proxy_user_header: String,

    /// A PEM certificate chain (the server's certificate first): all three listeners then
    /// speak TLS only. Needs --tls-key. Re-read on SIGHUP. Default: plain TCP.
    #[arg(long, env = "BUDGETSCOPE_TLS_CERT")]
    pub tls_cert: Option<std::path::PathBuf>,

    /// The PEM private key of --tls-cert (PKCS#8, PKCS#1 or SEC1). Re-read on SIGHUP.
    #[arg(long, env = "BUDGETSCOPE_TLS_KEY")]
    pub tls_key: Option<std::path::PathBuf>,
}

/// Which database a URL names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DbUrl {
    Sqlite(String),
    Postgres(String),
}

impl DbUrl {
    pub fn as_str(&self) -> &str {
        match self {
            DbUrl::Sqlite(url) | DbUrl::Postgres(url) => url,
        }
    }
}

/// Serve settings after validation.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub otlp_grpc_addr: SocketAddr,
    pub otlp_http_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub db: DbUrl,
    pub budget_keys: Vec<String>,
    pub metric_names: MetricNames,
    pub tolerance_ms: f64,
    pub max_request_bytes: usize,
    pub retention: Duration,
    /// How long healthy traces are kept: at most `retention`.
    pub retention_healthy: Duration,
    /// `--max-disk` in bytes (SQLite only).
    pub max_disk: Option<u64>,
    pub quiet_period: Duration,
    pub max_trace_wait: Duration,
    pub cors_origins: Vec<HeaderValue>,
    pub max_queued_spans: usize,
    /// Bytes; see `memory::MemoryBudget::for_limit`.
    pub memory_limit: u64,
    pub max_connections: usize,
    pub rules: Option<std::path::PathBuf>,
    pub alert_interval: Duration,
    pub alert_delay: Duration,
    pub external_url: String,
    /// `--allowed-hosts` plus the external URL's host.
    pub allowed_hosts: Vec<String>,
    pub otlp_tokens: Option<std::path::PathBuf>,
    pub ui_tokens: Option<std::path::PathBuf>,
    /// `--trusted-proxies`: peers whose `proxy_user_header` is believed.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    pub proxy_user_header: HeaderName,
    /// `--tls-cert` and `--tls-key`, both or neither.
    pub tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

/// A setting that failed validation, named as the user wrote it.
#[derive(Debug, thiserror::Error)]
#[error("invalid --{flag} (env {env}) {value:?}: {problem}")]
pub struct ConfigError {
    pub flag: &'static str,
    pub env: &'static str,
    pub value: String,
    pub problem: String,
}

fn invalid(
    flag: &'static str,
    env: &'static str,
    value: &str,
    problem: impl Into<String>,
) -> ConfigError {
    ConfigError {
        flag,
        env,
        value: value.to_string(),
        problem: problem.into(),
    }
}

impl ServeArgs {
    /// `serve`'s flags parsed from `argv` (the first item is the program's name) as the
    /// binary parses them, for tests and embedders.
    pub fn try_parse_from<I, T>(argv: I) -> Result<ServeArgs, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        #[derive(clap::Parser)]
        struct Serve {
            #[command(flatten)]
            args: ServeArgs,
        }
        <Serve as clap::Parser>::try_parse_from(argv).map(|serve| serve.args)
    }

    pub fn validate(&self) -> Result<ServeConfig, ConfigError> {
        let addr = |flag, env, value: &str| {
            parse_addr(value).ok_or_else(|| {
                invalid(
                    flag,
                    env,
                    value,
                    "expected IP:PORT, e.g. 127.0.0.1:4317 or 0.0.0.0:4317",
                )
            })
        };
        let db =
            parse_db_url(&self.db).map_err(|p| invalid("db", "BUDGETSCOPE_DB", &self.db, p))?;
        let budget_keys: Vec<String> = self
            .budget_keys
            .iter()
            .map(|k| k.trim().to_string())
            .filter(|k| !k.is_empty())
            .collect();
        if budget_keys.is_empty() {
            return Err(invalid(
                "budget-keys",
                "BUDGETSCOPE_BUDGET_KEYS",
                "",
                "name at least one attribute key",
            ));
        }
        let metric_names = {
            let name = |flag: &'static str, env: &'static str, value: &str| {
                let value = value.trim();
                if value.is_empty() {
                    Err(invalid(flag, env, "", "name a metric or attribute"))
                } else {
                    Ok(value.to_string())
                }
            };
            MetricNames {
                received: name(
                    "metric-received",
                    "BUDGETSCOPE_METRIC_RECEIVED",
                    &self.metric_received,
                )?,
                remaining: name(
                    "metric-remaining",
                    "BUDGETSCOPE_METRIC_REMAINING",
                    &self.metric_remaining,
                )?,
                exceeded: name(
                    "metric-exceeded",
                    "BUDGETSCOPE_METRIC_EXCEEDED",
                    &self.metric_exceeded,
                )?,
                hop_key: name(
                    "metric-hop-key",
                    "BUDGETSCOPE_METRIC_HOP_KEY",
                    &self.metric_hop_key,
                )?,
                origin_key: name(
                    "metric-origin-key",
                    "BUDGETSCOPE_METRIC_ORIGIN_KEY",
                    &self.metric_origin_key,
                )?,
            }
        };
        if !(self.tolerance_ms.is_finite() && self.tolerance_ms >= 0.0) {
            return Err(invalid(
                "tolerance-ms",
                "BUDGETSCOPE_TOLERANCE_MS",
                &self.tolerance_ms.to_string(),
                "expected a number of milliseconds ≥ 0",
            ));
        }
        let max_request_bytes = parse_size(&self.max_request_bytes)
            .filter(|n| (1024..=1 << 30).contains(n))
            .ok_or_else(|| {
                invalid(
                    "max-request-bytes",
                    "BUDGETSCOPE_MAX_REQUEST_BYTES",
                    &self.max_request_bytes,
                    "expected a size from 1KiB to 1GiB, e.g. 20MiB",
                )
            })?;
        let retention = humantime::parse_duration(&self.retention)
            .ok()
            .filter(|d| *d >= Duration::from_secs(60))
            .ok_or_else(|| {
                invalid(
                    "retention",
                    "BUDGETSCOPE_RETENTION",
                    &self.retention,
                    "expected a duration of at least 1m, e.g. 7d or 12h",
                )
            })?;
        let retention_healthy = match &self.retention_healthy {
            None => retention.min(Duration::from_secs(86_400)),
            Some(text) => humantime::parse_duration(text)
                .ok()
                .filter(|d| *d >= Duration::from_secs(60) && *d <= retention)
                .ok_or_else(|| {
                    invalid(
                        "retention-healthy",
                        "BUDGETSCOPE_RETENTION_HEALTHY",
                        text,
                        "expected a duration from 1m up to --retention, e.g. 1d",
                    )
                })?,
        };
        let max_disk = match &self.max_disk {
            None => None,
            Some(text) => {
                let invalid =
                    |problem: &str| invalid("max-disk", "BUDGETSCOPE_MAX_DISK", text, problem);
                if matches!(db, DbUrl::Postgres(_)) {
                    return Err(invalid(
                        "applies to the embedded SQLite store only: Postgres does not say how \
                         much of its tables' space is free for reuse, so a cap there could \
                         only guess; size its disk, shorten --retention or \
                         --retention-healthy, and leave --max-disk out",
                    ));
                }
                let bytes = parse_size(text)
                    .map(|n| n as u64)
                    .filter(|n| *n >= MIN_MAX_DISK)
                    .ok_or_else(|| {
                        invalid("expected a size of at least 64MiB, e.g. 50GB or 500MiB")
                    })?;
                Some(bytes)
            }
        };
        let quiet_period = parse_duration_or_zero(&self.quiet_period).ok_or_else(|| {
            invalid(
                "quiet-period",
                "BUDGETSCOPE_QUIET_PERIOD",
                &self.quiet_period,
                "expected a duration such as 10s or 500ms",
            )
        })?;
        let max_trace_wait = match &self.max_trace_wait {
            None => quiet_period.max(Duration::from_secs(300)),
            Some(text) => humantime::parse_duration(text.trim())
                .ok()
                .filter(|d| *d >= quiet_period && !d.is_zero())
                .ok_or_else(|| {
                    invalid(
                        "max-trace-wait",
                        "BUDGETSCOPE_MAX_TRACE_WAIT",
                        text,
                        "expected a duration of at least the quiet period, e.g. 5m",
                    )
                })?,
        };
        let cors_origins = self
            .cors_origins
            .iter()
            .map(|o| o.trim())
            .filter(|o| !o.is_empty())
            .map(|o| {
                let valid =
                    (o.starts_with("http://") || o.starts_with("https://")) && !o.ends_with('/');
                HeaderValue::from_str(o)
                    .ok()
                    .filter(|_| valid)
                    .ok_or_else(|| {
                        invalid(
                            "cors-origins",
                            "BUDGETSCOPE_CORS_ORIGINS",
                            o,
                            "expected origins like https://app.example.com",
                        )
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let alert_interval = humantime::parse_duration(self.alert_interval.trim())
            .ok()
            .filter(|d| *d >= Duration::from_secs(1))
            .ok_or_else(|| {
                invalid(
                    "alert-interval",
                    "BUDGETSCOPE_ALERT_INTERVAL",
                    &self.alert_interval,
                    "expected a duration of at least 1s, e.g. 30s",
                )
            })?;
        let alert_delay = match &self.alert_delay {
            None => quiet_period + Duration::from_secs(30),
            Some(text) => parse_duration_or_zero(text).ok_or_else(|| {
                invalid(
                    "alert-delay",
                    "BUDGETSCOPE_ALERT_DELAY",
                    text,
                    "expected a duration such as 40s, or 0",
                )
            })?,
        };
        if let Some(url) = &self.external_url {
            let url = url.trim();
            if !(url.starts_with("http://") || url.starts_with("https://"))
                || url.contains(char::is_whitespace)
            {
                return Err(invalid(
                    "external-url",
                    "BUDGETSCOPE_EXTERNAL_URL",
                    url,
                    "expected an http:// or https:// URL, e.g. https://budgets.example.com",
                ));
            }
        }
        if self.max_connections == 0 {
            return Err(invalid(
                "max-connections",
                "BUDGETSCOPE_MAX_CONNECTIONS",
                "0",
                "expected at least 1",
            ));
        }
        if self.max_queued_spans == 0 {
            return Err(invalid(
                "max-queued-spans",
                "BUDGETSCOPE_MAX_QUEUED_SPANS",
                "0",
                "expected at least 1",
            ));
        }
        let memory_limit = parse_size(&self.memory_limit)
            .map(|n| n as u64)
            .filter(|n| *n >= memory::MIN_LIMIT)
            .ok_or_else(|| {
                invalid(
                    "memory-limit",
                    "BUDGETSCOPE_MEMORY_LIMIT",
                    &self.memory_limit,
                    "expected a size of at least 256MiB, e.g. 512MiB or 2GiB",
                )
            })?;
        // The largest request must fit in what requests may take.
        let largest_request = max_request_bytes as u64 * memory::REQUEST_BYTES_PER_BODY_BYTE;
        if largest_request > memory::MemoryBudget::for_limit(memory_limit).pool() {
            return Err(invalid(
                "memory-limit",
                "BUDGETSCOPE_MEMORY_LIMIT",
                &self.memory_limit,
                format!(
                    "too small for requests of --max-request-bytes {}: a request takes up to \
                     {} times its size while it is decoded, and what --memory-limit leaves \
                     after 128 MiB of fixed costs must hold one; raise --memory-limit or lower \
                     --max-request-bytes",
                    self.max_request_bytes,
                    memory::REQUEST_BYTES_PER_BODY_BYTE
                ),
            ));
        }
        let http_addr = addr("http-addr", "BUDGETSCOPE_HTTP_ADDR", &self.http_addr)?;
        let trusted_proxies = self
            .trusted_proxies
            .iter()
            .map(|p| p.trim())
            .filter(|p| !p.is_empty())
            .map(|p| {
                parse_network(p).ok_or_else(|| {
                    invalid(
                        "trusted-proxies",
                        "BUDGETSCOPE_TRUSTED_PROXIES",
                        p,
                        "expected IP addresses or CIDR blocks, e.g. 10.0.0.7 or 10.0.0.0/24",
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let proxy_user_header = HeaderName::from_bytes(self.proxy_user_header.trim().as_bytes())
            .map_err(|_| {
                invalid(
                    "proxy-user-header",
                    "BUDGETSCOPE_PROXY_USER_HEADER",
                    &self.proxy_user_header,
                    "expected an HTTP header name, e.g. X-Forwarded-User",
                )
            })?;
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
            (None, None) => None,
            (Some(cert), None) => {
                return Err(invalid(
                    "tls-key",
                    "BUDGETSCOPE_TLS_KEY",
                    "",
                    format!(
                        "--tls-cert {} needs its private key: give --tls-key",
                        cert.display()
                    ),
                ));
            }
            (None, Some(key)) => {
                return Err(invalid(
                    "tls-cert",
                    "BUDGETSCOPE_TLS_CERT",
                    "",
                    format!(
                        "--tls-key {} needs its certificate: give --tls-cert",
                        key.display()
                    ),
                ));
            }
        };
        Ok(ServeConfig {
            otlp_grpc_addr: addr(
                "otlp-grpc-addr",
                "BUDGETSCOPE_OTLP_GRPC_ADDR",
                &self.otlp_grpc_addr,
            )?,
            otlp_http_addr: addr(
                "otlp-http-addr",
                "BUDGETSCOPE_OTLP_HTTP_ADDR",
                &self.otlp_http_addr,
            )?,
            http_addr,
            db,
            budget_keys,
            metric_names,
            tolerance_ms: self.tolerance_ms,
            max_request_bytes,
            retention,
            retention_healthy,
            max_disk,
            quiet_period,
            max_trace_wait,
            cors_origins,
            max_queued_spans: self.max_queued_spans,
            memory_limit,
            max_connections: self.max_connections,
            rules: self.rules.clone(),
            alert_interval,
            alert_delay,
            external_url: match &self.external_url {
                Some(url) => url.trim().trim_end_matches('/').to_string(),
                None if tls.is_some() => format!("https://{http_addr}"),
                None => format!("http://{http_addr}"),
            },
            allowed_hosts: self
                .allowed_hosts
                .iter()
                .map(|h| h.trim().to_string())
                .filter(|h| !h.is_empty())
                .chain(self.external_url.as_deref().and_then(url_host))
                .collect(),
            otlp_tokens: self.otlp_tokens.clone(),
            ui_tokens: self.ui_tokens.clone(),
            trusted_proxies,
            proxy_user_header,
            tls,
        })
    }
}

/// The host of an http(s) URL: `https://b.example.com:8443/x` → `b.example.com`.
fn url_host(url: &str) -> Option<String> {
    crate::web::authority_host(url.trim().split_once("://")?.1.split('/').next()?)
}

fn parse_duration_or_zero(text: &str) -> Option<Duration> {
    match text.trim() {
        "0" => Some(Duration::ZERO),
        text => humantime::parse_duration(text).ok(),
    }
}

/// An address or a block of them: `10.0.0.7` (that address alone) or `10.0.0.0/24`.
fn parse_network(text: &str) -> Option<ipnet::IpNet> {
    text.parse::<ipnet::IpNet>()
        .ok()
        .or_else(|| {
            text.parse::<std::net::IpAddr>()
                .ok()
                .map(ipnet::IpNet::from)
        })
        .map(|net| net.trunc())
}

fn parse_addr(text: &str) -> Option<SocketAddr> {
    let text = text.trim();
    text.parse().ok().or_else(|| {
        let port = text.strip_prefix("localhost:")?;
        format!("127.0.0.1:{port}").parse().ok()
    })
}

pub fn parse_db_url(url: &str) -> Result<DbUrl, String> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(DbUrl::Postgres(url.to_string()))
    } else if let Some(rest) = url.strip_prefix("sqlite:") {
        if rest.trim_start_matches('/').is_empty() {
            return Err(
                "sqlite URL names no file; expected sqlite://PATH, e.g. sqlite://budgetscope.db"
                    .into(),
            );
        }
        Ok(DbUrl::Sqlite(url.to_string()))
    } else {
        Err("expected sqlite://PATH or postgres://USER@HOST/DB".into())
    }
}

/// `--max-disk`'s least: the WAL alone takes 64 MiB between two restarts.
const MIN_MAX_DISK: u64 = 64 << 20;

/// Parses `20MiB`, `512KiB`, `1GiB`, `1MB`, `1000`.
pub fn parse_size(text: &str) -> Option<usize> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let n: usize = digits.parse().ok()?;
    let multiplier: usize = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return None,
    };
    n.checked_mul(multiplier)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Result<ServeConfig, String> {
        let mut argv = vec!["serve"];
        argv.extend_from_slice(extra);
        let serve = ServeArgs::try_parse_from(argv).map_err(|e| e.to_string())?;
        serve.validate().map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_are_valid_and_local() {
        let config = args(&[]).unwrap();
        assert_eq!(config.otlp_grpc_addr.to_string(), "127.0.0.1:4317");
        assert_eq!(config.otlp_http_addr.to_string(), "127.0.0.1:4318");
        assert_eq!(config.http_addr.to_string(), "127.0.0.1:8080");
        assert_eq!(config.db, DbUrl::Sqlite("sqlite://budgetscope.db".into()));
        assert_eq!(config.max_request_bytes, 20 << 20);
        assert_eq!(config.memory_limit, 512 << 20);
        assert_eq!(config.retention, Duration::from_secs(7 * 86400));
        assert_eq!(config.retention_healthy, Duration::from_secs(86400));
        // Healthy traces are never kept longer than the rest.
        let short = args(&["--retention", "6h"]).unwrap();
        assert_eq!(short.retention_healthy, Duration::from_secs(6 * 3600));
        assert_eq!(config.max_disk, None);
        let capped = args(&["--max-disk", "50GB"]).unwrap();
        assert_eq!(capped.max_disk, Some(50_000_000_000));
        assert_eq!(config.budget_keys.len(), DEFAULT_BUDGET_KEYS.len());
        assert!(config.cors_origins.is_empty());
        assert_eq!(config.alert_interval, Duration::from_secs(30));
        assert_eq!(config.max_trace_wait, Duration::from_secs(300));
        assert_eq!(
            config.alert_delay,
            Duration::from_secs(40),
            "quiet period + 30s"
        );
        assert_eq!(config.external_url, "http://127.0.0.1:8080");
    }

    #[test]
    fn invalid_settings_name_flag_and_env() {
        let cases = [
            (
                vec!["--otlp-grpc-addr", "nope"],
                "invalid --otlp-grpc-addr (env BUDGETSCOPE_OTLP_GRPC_ADDR) \"nope\"",
            ),
            (
                vec!["--db", "mysql://x"],
                "invalid --db (env BUDGETSCOPE_DB)",
            ),
            (vec!["--db", "sqlite://"], "sqlite URL names no file"),
            (
                vec!["--memory-limit", "100MiB"],
                "invalid --memory-limit (env BUDGETSCOPE_MEMORY_LIMIT) \"100MiB\": expected a size of at least 256MiB",
            ),
            (
                vec!["--memory-limit", "256MiB", "--max-request-bytes", "1GiB"],
                "raise --memory-limit or lower --max-request-bytes",
            ),
            (
                vec!["--max-request-bytes", "20XB"],
                "invalid --max-request-bytes",
            ),
            (vec!["--retention", "5s"], "at least 1m"),
            (
                vec!["--retention", "12h", "--retention-healthy", "2d"],
                "invalid --retention-healthy (env BUDGETSCOPE_RETENTION_HEALTHY) \"2d\": expected a duration from 1m up to --retention",
            ),
            (
                vec!["--max-disk", "10MiB"],
                "invalid --max-disk (env BUDGETSCOPE_MAX_DISK) \"10MiB\": expected a size of at least 64MiB",
            ),
            (
                vec!["--db", "postgres://x@localhost/db", "--max-disk", "1TB"],
                "applies to the embedded SQLite store only",
            ),
            (vec!["--tolerance-ms", "-1"], "invalid --tolerance-ms"),
            (
                vec!["--cors-origins", "example.com"],
                "invalid --cors-origins",
            ),
            (
                vec!["--budget-keys", ","],
                "name at least one attribute key",
            ),
            (
                vec!["--alert-interval", "100ms"],
                "invalid --alert-interval (env BUDGETSCOPE_ALERT_INTERVAL)",
            ),
            (
                vec!["--alert-delay", "soon"],
                "invalid --alert-delay (env BUDGETSCOPE_ALERT_DELAY)",
            ),
            (
                vec!["--external-url", "budgets.example.com"],
                "invalid --external-url",
            ),
            (
                vec!["--quiet-period", "1m", "--max-trace-wait", "30s"],
                "invalid --max-trace-wait (env BUDGETSCOPE_MAX_TRACE_WAIT) \"30s\": expected a duration of at least the quiet period",
            ),
        ];
        for (extra, expected) in cases {
            let error = args(&extra).unwrap_err();
            assert!(error.contains(expected), "{extra:?}: {error}");
        }
    }

    #[test]
    fn sizes_and_lists_parse() {
        assert_eq!(parse_size("512KiB"), Some(512 * 1024));
        assert_eq!(parse_size("1000"), Some(1000));
        assert_eq!(parse_size("1 MB"), Some(1_000_000));
        assert_eq!(parse_size("MiB"), None);
        let config = args(&[
            "--budget-keys",
            "a, b",
            "--cors-origins",
            "https://x.example",
        ])
        .unwrap();
        assert_eq!(config.budget_keys, ["a", "b"]);
        assert_eq!(
            config.cors_origins,
            [HeaderValue::from_static("https://x.example")]
        );
        assert_eq!(
            args(&["--http-addr", "localhost:9000"])
                .unwrap()
                .http_addr
                .to_string(),
            "127.0.0.1:9000"
        );
    }
}

//! The UI and JSON API server (`--http-addr`, 8080 by default).
//!
//! Architecture invariant: handlers call the `Store` trait and pure functions only; no SQL
//! here. `app(state)` builds the whole router, so tests drive it with `oneshot` and no
//! socket. No database or internal error text reaches a client (it is logged; the client
//! gets what to do next). Span data reaches HTML only through askama's escaping, and every
//! link is built from our own paths with `pages::enc` per component.
//!
//! Around every handler: who is let in (`access.rs`), a 421 for host names a loopback UI
//! does not serve (DNS rebinding, `--allowed-hosts`), a 403 for a state-changing request a
//! browser marks as sent from another site (`Sec-Fetch-Site`, else `Origin` against
//! `Host`), and security headers (a Content-Security-Policy of `'self'` only) on every
//! response. Bars and indents are classes of `/static/geometry.css` (`assets.rs`), never
//! inline styles; JavaScript only enhances (collapse/expand, keyboard shortcuts).

pub mod access;
pub mod advisor;
pub mod alerts;
pub mod api;
mod assets;
pub mod charts;
pub mod error;
pub mod hops;
pub mod jaeger;
pub mod map;
pub mod pages;
pub mod read;
pub mod search;
pub mod whatif;

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{Method, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use axum::routing::{delete, get, post, put};

use crate::core::analyze::AnalyzeOptions;
use crate::pipeline::alerter::RuleBook;
use crate::pipeline::ingest::Ingestor;
use crate::pipeline::memory::MemoryBudget;
use crate::pipeline::metrics::{DeletedFor, Metrics};
use crate::pipeline::status::Monitor;
use crate::store::Store;
use crate::web::access::UiAccess;

/// What every handler may use.
#[derive(Clone)]
pub struct AppState {
    pub store: Arc<dyn Store>,
    pub analyze: AnalyzeOptions,
    /// The alert rules in force.
    pub rules: Arc<RuleBook>,
    /// The UI's address as people reach it, for links sent elsewhere.
    pub external_url: String,
    pub metrics: Arc<Metrics>,
    /// The ingest pipeline, for its queue depth in `/metrics` (none in tests of the router).
    pub ingest: Option<Arc<Ingestor>>,
    /// The host names requests may name (lowercase, without port); `None` answers any.
    pub allowed_hosts: Option<Arc<Vec<String>>>,
    /// How far analysis is behind (`/api/status`, the overview's banner).
    pub status: Arc<Monitor>,
    /// Who is let in (`--ui-tokens`, `--trusted-proxies`); everyone when neither is given.
    pub access: Arc<UiAccess>,
    /// The working memory reads of whole traces reserve (`--memory-limit`, `read.rs`).
    pub memory: Arc<MemoryBudget>,
    /// How long healthy traces are kept when shorter than all traces (`--retention-healthy`),
    /// for the pages to say so; none keeps them as long as the rest.
    pub retention_healthy: Option<std::time::Duration>,
}

impl AppState {
    /// What the pages say about a range reaching back before `since_unix_nano` (none for a
    /// range that starts later, or when healthy traces are kept as long as the rest).
    pub fn healthy_note(&self, since_unix_nano: Option<u64>) -> Option<String> {
        let mut note = String::new();
        if let Some(kept) = self.retention_healthy {
            let cutoff = crate::clock::now_unix_nano().saturating_sub(kept.as_nanos() as u64);
            if since_unix_nano.is_none_or(|since| since < cutoff) {
                note = format!(
                    "Healthy traces (no flag, not exceeded) are kept {}: older than that, only \
                     traces with a problem are listed.",
                    humantime::format_duration(kept)
                );
            }
        }
        let cap = |reason| self.metrics.traces_deleted_for(reason) > 0;
        let near_cap = match (cap(DeletedFor::MaxDiskHealthy), cap(DeletedFor::MaxDisk)) {
            (_, true) => Some("the oldest traces, healthy ones first"),
            (true, false) => Some("the oldest healthy traces"),
            (false, false) => None,
        };
        if let Some(which) = near_cap {
            if !note.is_empty() {
                note.push(' ');
            }
            note.push_str(&format!(
                "The store reached its disk cap (--max-disk), so {which} were deleted sooner."
            ));
        }
        (!note.is_empty()).then(|| note + " The hop statistics count every request.")
    }
}

impl AppState {
    /// A state with no alert rules and links to `http://localhost` (tests, benchmarks).
    pub fn new(store: Arc<dyn Store>, analyze: AnalyzeOptions) -> AppState {
        let metrics = Arc::new(Metrics::default());
        let quiet_period = std::time::Duration::from_secs(10);
        AppState {
            status: Monitor::new(
                store.clone(),
                metrics.clone(),
                None,
                None,
                None,
                quiet_period,
                None,
            ),
            store,
            analyze,
            rules: Default::default(),
            external_url: "http://localhost".into(),
            metrics,
            ingest: None,
            allowed_hosts: None,
            access: Arc::new(UiAccess::open()),
            memory: MemoryBudget::for_limit(crate::pipeline::memory::DEFAULT_LIMIT),
            retention_healthy: None,
        }
    }
}

/// The host names a UI bound to `addr` answers to: on loopback `localhost` and the literal
/// addresses, plus `extra` (`--allowed-hosts`, the external URL's host); elsewhere any host
/// unless `extra` names some. Refusing other names stops a page on another site from
/// reaching a loopback instance by pointing its own name at 127.0.0.1 (DNS rebinding).
pub fn allowed_hosts(addr: std::net::SocketAddr, extra: &[String]) -> Option<Arc<Vec<String>>> {
    let mut hosts: Vec<String> = extra.iter().filter_map(|h| authority_host(h)).collect();
    if addr.ip().is_loopback() {
        hosts.extend(
            ["localhost", "127.0.0.1", "[::1]"]
                .into_iter()
                .map(String::from),
        );
        hosts.push(match addr.ip() {
            std::net::IpAddr::V6(ip) => format!("[{ip}]"),
            ip => ip.to_string(),
        });
    } else if hosts.is_empty() {
        return None;
    }
    hosts.sort();
    hosts.dedup();
    Some(Arc::new(hosts))
}

/// The host of a URL authority or `Host` header, as compared: lowercase, without port or
/// trailing dot, IPv6 literals in brackets (`[::1]:8080` → `[::1]`).
pub fn authority_host(authority: &str) -> Option<String> {
    let host = match authority.trim().strip_prefix('[') {
        Some(rest) => format!("[{}]", rest.split(']').next()?),
        None => authority.trim().split(':').next()?.to_string(),
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    (!host.is_empty()).then_some(host)
}

/// The host a request names (`Host`, or the HTTP/2 authority), lowercase, without its port.
fn request_host(request: &Request) -> Option<String> {
    let authority = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()))?;
    authority_host(authority)
}

pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(api::healthz))
        .route("/metrics", get(api::metrics))
        .route("/readyz", get(api::readyz))
        .route("/api/traces", get(search::search))
        .route("/api/traces/{trace_id}", get(api::trace))
        .route("/api/traces/{trace_id}/otlp", get(api::trace_otlp))
        .route("/api/hops", get(hops::hops))
        .route("/api/map", get(map::map))
        .route("/api/advisor", get(advisor::advisor))
        .route("/api/advisor/whatif", post(whatif::whatif))
        .route("/api/hops/{service}/{operation}/series", get(hops::series))
        .route("/api/alerts", get(alerts::instances))
        .route(
            "/api/alerts/rules",
            get(alerts::rules).post(alerts::create_rule),
        )
        .route("/api/alerts/rules/backtest", post(alerts::backtest))
        .route(
            "/api/alerts/rules/{name}",
            put(alerts::replace_rule).delete(alerts::delete_rule),
        )
        .route("/api/alerts/rules/{name}/test", post(alerts::test_rule))
        .route(
            "/api/alerts/silences",
            get(alerts::silences).post(alerts::create_silence),
        )
        .route("/api/alerts/silences/{id}", delete(alerts::expire_silence))
        .route("/api/alerts/history", get(alerts::history))
        .route("/api/alerts/notifications", get(alerts::notifications))
        .route("/api/status", get(api::status))
        .route("/jaeger/api/services", get(jaeger::services))
        .route(
            "/jaeger/api/services/{service}/operations",
            get(jaeger::service_operations),
        )
        .route("/jaeger/api/operations", get(jaeger::operations))
        .route("/jaeger/api/traces", get(jaeger::search))
        .route("/jaeger/api/traces/{trace_id}", get(jaeger::trace))
        .route("/api/services", get(api::services))
        .route("/api/services/{service}/operations", get(api::operations))
        .route("/", get(pages::overview::overview))
        .route("/map", get(pages::map::map))
        .route("/advisor", get(pages::advisor::advisor))
        .route("/advisor/whatif", get(pages::whatif::whatif))
        .route("/compare", get(pages::compare::compare))
        .route("/traces", get(pages::traces::traces))
        .route("/traces/go", get(pages::traces::go))
        .route("/traces/{trace_id}", get(pages::trace::trace))
        .route("/traces/{trace_id}/rows", get(pages::trace::rows))
        .route("/hops/{service}/{operation}", get(pages::hop::hop))
        .route("/help/budget-semantics", get(pages::help::budget_semantics))
        .route("/help/instrument", get(pages::help::instrument))
        .route("/alerts", get(pages::alerts::alerts))
        .route(
            "/alerts/rules/new",
            get(pages::alert_forms::new_rule).post(pages::alert_forms::create_rule),
        )
        .route("/alerts/rules/{name}", get(pages::alerts::rule))
        .route(
            "/alerts/rules/{name}/edit",
            get(pages::alert_forms::edit_rule).post(pages::alert_forms::update_rule),
        )
        .route(
            "/alerts/rules/{name}/delete",
            post(pages::alert_forms::delete_rule),
        )
        .route(
            "/alerts/rules/{name}/pause",
            post(pages::alert_forms::pause_rule),
        )
        .route(
            "/alerts/rules/{name}/test",
            post(pages::alert_forms::test_rule),
        )
        .route("/alerts/silences", post(pages::alert_forms::create_silence))
        .route(
            "/alerts/silences/{id}/expire",
            post(pages::alert_forms::expire_silence),
        )
        .route("/static/{file}", get(assets::asset))
        .fallback(not_found)
        .layer(axum::middleware::from_fn(same_origin_writes))
        .layer(axum::middleware::from_fn_with_state(
            state.access.clone(),
            authenticated,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.allowed_hosts.clone(),
            known_hosts_only,
        ))
        .layer(axum::middleware::from_fn(security_headers))
        .with_state(state)
}

/// What every response allows the browser: only the UI's own scripts, stylesheets and
/// images (pages carry no inline script or style; bars are placed by the classes of
/// `/static/geometry.css`), requests and form posts to this origin only, and no framing.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; \
     frame-ancestors 'none'; base-uri 'none'";

/// Security headers on every response: the policy above, no MIME sniffing, no referrer
/// sent to other sites, and no framing (also for browsers without `frame-ancestors`).
async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "same-origin"),
        (header::X_FRAME_OPTIONS, "DENY"),
    ] {
        headers.insert(name, header::HeaderValue::from_static(value));
    }
    response
}

/// Refuses a request that neither carries a token of `--ui-tokens` (bearer, or basic with
/// the token as password) nor comes from a `--trusted-proxies` address naming its user:
/// 401 asking for basic authentication, so a browser shows its login prompt, where tokens
/// are taken, else 403. Health and readiness probes stay open: they tell nothing about
/// traces.
async fn authenticated(
    State(access): State<Arc<UiAccess>>,
    request: Request,
    next: Next,
) -> Response {
    let open = matches!(request.uri().path(), "/healthz" | "/readyz");
    let peer = request
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|info| info.0.ip());
    if open || access.admits(peer, request.headers()).is_some() {
        return next.run(request).await;
    }
    let (status, message) = if access.takes_tokens() {
        (
            axum::http::StatusCode::UNAUTHORIZED,
            "this server needs a token of its --ui-tokens file: log in with any user name and \
             the token as password, or send `Authorization: Bearer TOKEN`",
        )
    } else {
        (
            axum::http::StatusCode::FORBIDDEN,
            "this server lets in only requests through its authenticating proxy \
             (--trusted-proxies): open budgetscope at the proxy's address",
        )
    };
    let mut response = if request.uri().path().starts_with("/api/") {
        error::ApiError::refused(status, message).into_response()
    } else {
        pages::PageError {
            status,
            title: "Log in to see budgetscope".into(),
            message: message.into(),
        }
        .into_response()
    };
    if access.takes_tokens() {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Basic realm=\"budgetscope\", charset=\"UTF-8\""),
        );
    }
    response
}

/// Answers 421 to a request for a host name the UI does not serve (`allowed_hosts`).
async fn known_hosts_only(
    State(allowed): State<Option<Arc<Vec<String>>>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(allowed) = allowed else {
        return next.run(request).await;
    };
    if request_host(&request).is_some_and(|host| allowed.contains(&host)) {
        return next.run(request).await;
    }
    let message = format!(
        "this server answers as {}; open it under one of those names, or start it with \
         --allowed-hosts NAME to add the name you used",
        allowed.join(", ")
    );
    if request.uri().path().starts_with("/api/") {
        error::ApiError::misdirected("unknown_host", message).into_response()
    } else {
        pages::PageError {
            status: axum::http::StatusCode::MISDIRECTED_REQUEST,
            title: "Not served under this name".into(),
            message,
        }
        .into_response()
    }
}

/// Refuses a state-changing request that a browser sent from another site (a form on a
/// page elsewhere posting here, or a script there): browsers say where a request comes
/// from in `Sec-Fetch-Site`, or at least in `Origin`. Clients that are not browsers send
/// neither and pass; forms and scripts of budgetscope's own pages are same-origin.
async fn same_origin_writes(request: Request, next: Next) -> Response {
    let safe = matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    );
    let headers = request.headers();
    let cross_site = match headers.get("sec-fetch-site") {
        Some(site) => !matches!(site.as_bytes(), b"same-origin" | b"none"),
        None => headers.get(header::ORIGIN).is_some_and(|origin| {
            let authority = origin
                .to_str()
                .ok()
                .and_then(|o| o.split_once("://"))
                .map(|(_, authority)| authority);
            authority != headers.get(header::HOST).and_then(|h| h.to_str().ok())
        }),
    };
    if safe || !cross_site {
        return next.run(request).await;
    }
    let message =
        "this request came from another site; change settings from budgetscope's own pages";
    if request.uri().path().starts_with("/api/") {
        error::ApiError::forbidden("cross_site_request", message).into_response()
    } else {
        pages::PageError {
            status: axum::http::StatusCode::FORBIDDEN,
            title: "Refused: sent from another site".into(),
            message: format!("{message}. Open the page here and send the form again."),
        }
        .into_response()
    }
}

/// Unknown paths: a JSON error under `/api/`, a page everywhere else.
async fn not_found(uri: Uri) -> Response {
    if uri.path().starts_with("/api/") {
        api::not_found(uri).await.into_response()
    } else {
        pages::not_found(uri).await.into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loopback_ui_knows_its_names_and_others_are_given() {
        let loopback: std::net::SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let hosts = allowed_hosts(loopback, &["Budgets.Internal.".into()]).unwrap();
        assert_eq!(
            hosts.as_slice(),
            ["127.0.0.1", "[::1]", "budgets.internal", "localhost"]
        );
        let v6: std::net::SocketAddr = "[::1]:8080".parse().unwrap();
        assert!(
            allowed_hosts(v6, &[])
                .unwrap()
                .contains(&"[::1]".to_string())
        );
        let public: std::net::SocketAddr = "0.0.0.0:8080".parse().unwrap();
        assert_eq!(
            allowed_hosts(public, &[]),
            None,
            "bound elsewhere: any name"
        );
        assert_eq!(
            allowed_hosts(public, &["b.example".into()])
                .unwrap()
                .as_slice(),
            ["b.example"]
        );
    }

    #[test]
    fn the_requested_host_is_read_without_its_port() {
        let host = |value: &str| {
            let request = Request::builder()
                .uri("/")
                .header(header::HOST, value)
                .body(axum::body::Body::empty())
                .unwrap();
            request_host(&request)
        };
        assert_eq!(host("LocalHost:8080").as_deref(), Some("localhost"));
        assert_eq!(host("[::1]:8080").as_deref(), Some("[::1]"));
        assert_eq!(host("example.com.").as_deref(), Some("example.com"));
        let h2 = Request::builder()
            .uri("http://127.0.0.1:8080/")
            .body(axum::body::Body::empty())
            .unwrap();
        assert_eq!(request_host(&h2).as_deref(), Some("127.0.0.1"));
    }
}

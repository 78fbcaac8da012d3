//! The UI and JSON API server (`--http-addr`, 8080 by default).
//!
//! Architecture invariant: handlers call the `Store` trait and pure functions only; no SQL
//! here. `app(state)` builds the whole router, so tests drive it with `oneshot` and no
//! socket.

pub mod alerts;
pub mod api;
mod assets;
pub mod charts;
pub mod error;
pub mod hops;
pub mod pages;
pub mod search;

use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::http::{Method, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use axum::routing::{delete, get, post, put};

use crate::alerter::RuleBook;
use crate::analyze::AnalyzeOptions;
use crate::ingest::Ingestor;
use crate::metrics::Metrics;
use crate::store::Store;

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
}

impl AppState {
    /// A state with no alert rules and links to `http://localhost` (tests, benchmarks).
    pub fn new(store: Arc<dyn Store>, analyze: AnalyzeOptions) -> AppState {
        AppState {
            store,
            analyze,
            rules: Default::default(),
            external_url: "http://localhost".into(),
            metrics: Default::default(),
            ingest: None,
        }
    }
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
        .route("/api/services", get(api::services))
        .route("/api/services/{service}/operations", get(api::operations))
        .route("/", get(pages::overview::overview))
        .route("/traces", get(pages::traces::traces))
        .route("/traces/go", get(pages::traces::go))
        .route("/traces/{trace_id}", get(pages::trace::trace))
        .route("/traces/{trace_id}/rows", get(pages::trace::rows))
        .route("/hops/{service}/{operation}", get(pages::hop::hop))
        .route("/help/budget-semantics", get(pages::help::budget_semantics))
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
        .with_state(state)
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

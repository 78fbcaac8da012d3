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
use axum::http::Uri;
use axum::response::{IntoResponse as _, Response};
use axum::routing::get;

use crate::alerter::RuleBook;
use crate::analyze::AnalyzeOptions;
use crate::store::Store;

/// What every handler may use.
#[derive(Clone)]
pub struct AppState {
    pub store: Arc<dyn Store>,
    pub analyze: AnalyzeOptions,
    /// The alert rules in force (the rules file's).
    pub rules: Arc<RuleBook>,
}

pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(api::healthz))
        .route("/readyz", get(api::readyz))
        .route("/api/traces", get(search::search))
        .route("/api/traces/{trace_id}", get(api::trace))
        .route("/api/traces/{trace_id}/otlp", get(api::trace_otlp))
        .route("/api/hops", get(hops::hops))
        .route("/api/hops/{service}/{operation}/series", get(hops::series))
        .route("/api/alerts", get(alerts::instances))
        .route("/api/alerts/rules", get(alerts::rules))
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
        .route("/alerts", get(pages::alerts::alerts))
        .route("/alerts/rules/{name}", get(pages::alerts::rule))
        .route("/static/{file}", get(assets::asset))
        .fallback(not_found)
        .with_state(state)
}

/// Unknown paths: a JSON error under `/api/`, a page everywhere else.
async fn not_found(uri: Uri) -> Response {
    if uri.path().starts_with("/api/") {
        api::not_found(uri).await.into_response()
    } else {
        pages::not_found(uri).await.into_response()
    }
}

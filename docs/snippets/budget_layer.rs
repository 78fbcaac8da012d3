//! Deadline budgets for budgetscope: a tower layer that starts each request's SERVER span
//! with `deadline.remaining_ms` and hands the handler its `Deadline`, and a reqwest call
//! that forwards what is left (minus a reserve) or fails fast when too little is left.
//! Works with axum, tonic's HTTP/1 routes, or any tower stack over `http` requests.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use opentelemetry::context::FutureExt as _;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator as _};
use opentelemetry::trace::{SpanKind, Status, TraceContextExt as _, Tracer};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;

pub const BUDGET_HEADER: &str = "x-request-budget-ms";
/// Kept back from what is left, for this hop's own answer.
pub const RESERVE_MS: f64 = 10.0;
/// With less left, fail fast instead of calling.
pub const MIN_CALL_MS: f64 = 20.0;

/// When the request's budget runs out; in the request's extensions for handlers.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    start: Instant,
    budget_ms: f64,
}

impl Deadline {
    pub fn after_ms(budget_ms: f64) -> Deadline {
        Deadline {
            start: Instant::now(),
            budget_ms,
        }
    }

    /// Milliseconds left; negative once passed.
    pub fn remaining_ms(&self) -> f64 {
        self.budget_ms - self.start.elapsed().as_secs_f64() * 1000.0
    }
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key)?.to_str().ok()
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

struct HeaderInjector<'a>(&'a mut http::HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(key.as_bytes()),
            http::HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

/// `ServiceBuilder::new().layer(BudgetLayer::new(tracer))`, or axum's `Router::layer`.
#[derive(Clone)]
pub struct BudgetLayer<T> {
    tracer: T,
}

impl<T> BudgetLayer<T> {
    pub fn new(tracer: T) -> Self {
        BudgetLayer { tracer }
    }
}

impl<S, T: Clone> tower::Layer<S> for BudgetLayer<T> {
    type Service = BudgetService<S, T>;
    fn layer(&self, inner: S) -> Self::Service {
        BudgetService {
            inner,
            tracer: self.tracer.clone(),
        }
    }
}

#[derive(Clone)]
pub struct BudgetService<S, T> {
    inner: S,
    tracer: T,
}

impl<S, T, B, R> tower::Service<http::Request<B>> for BudgetService<S, T>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    T: Tracer,
    T::Span: Send + Sync + 'static,
    R: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let parent = TraceContextPropagator::new().extract(&HeaderExtractor(request.headers()));
        let budget = request
            .headers()
            .get(BUDGET_HEADER)
            .and_then(|v| v.to_str().ok()?.trim().parse::<f64>().ok())
            .filter(|b| b.is_finite());
        let (method, path) = (
            request.method().to_string(),
            request.uri().path().to_string(),
        );
        let mut attributes = vec![
            KeyValue::new("http.request.method", method.clone()),
            KeyValue::new("url.path", path.clone()),
        ];
        if let Some(budget) = budget {
            attributes.push(KeyValue::new("deadline.remaining_ms", budget));
            request.extensions_mut().insert(Deadline::after_ms(budget));
        }
        let span = self
            .tracer
            .span_builder(format!("{method} {path}"))
            .with_kind(SpanKind::Server)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &parent);
        let cx = parent.with_span(span);
        // The handler runs with the server span as its current context.
        let response = self.inner.call(request).with_context(cx.clone());
        Box::pin(async move {
            let result = response.await;
            if let Ok(response) = &result {
                let code = response.status().as_u16();
                cx.span()
                    .set_attribute(KeyValue::new("http.response.status_code", i64::from(code)));
                if code >= 500 {
                    cx.span()
                        .set_status(Status::error(format!("answered {code}")));
                }
            }
            cx.span().end();
            result
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BudgetError {
    /// Too little left to call: answer 504 (HTTP) or DEADLINE_EXCEEDED (gRPC).
    #[error("{0:.0} ms left: not calling")]
    Exhausted(f64),
    #[error(transparent)]
    Http(#[from] reqwest::Error),
}

/// POSTs to `url` as a CLIENT span under the current context, forwarding what is left of
/// `deadline` minus `RESERVE_MS` in the budget header and waiting no longer than that.
pub async fn post_with_budget<T>(
    tracer: &T,
    client: &reqwest::Client,
    url: &str,
    deadline: Deadline,
) -> Result<reqwest::Response, BudgetError>
where
    T: Tracer,
    T::Span: Send + Sync + 'static,
{
    let forward = deadline.remaining_ms() - RESERVE_MS;
    if forward < MIN_CALL_MS {
        return Err(BudgetError::Exhausted(forward));
    }
    let forward_ms = forward.round() as i64;
    let path = reqwest::Url::parse(url)
        .map(|u| u.path().to_string())
        .unwrap_or_default();
    let span = tracer
        .span_builder(format!("POST {path}"))
        .with_kind(SpanKind::Client)
        .with_attributes([
            KeyValue::new("deadline.remaining_ms", forward_ms),
            KeyValue::new("http.request.method", "POST"),
            KeyValue::new("url.full", url.to_string()),
        ])
        .start_with_context(tracer, &Context::current());
    let cx = Context::current().with_span(span);
    let mut headers = http::HeaderMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut HeaderInjector(&mut headers));
    let result = client
        .post(url)
        .headers(headers)
        .header(BUDGET_HEADER, forward_ms.to_string())
        .timeout(Duration::from_millis(forward_ms as u64))
        .send()
        .await;
    match &result {
        Ok(response) => {
            let code = response.status().as_u16();
            cx.span()
                .set_attribute(KeyValue::new("http.response.status_code", i64::from(code)));
        }
        Err(error) => {
            if error.is_timeout() {
                cx.span()
                    .set_attribute(KeyValue::new("error.type", "timeout"));
            }
            cx.span().set_status(Status::error(error.to_string()));
        }
    }
    cx.span().end();
    Ok(result?)
}

//! The shop's HTTP services: `gateway` (the edge), `orders` (reserves stock, then charges),
//! `inventory`, and the untraced proxy some requests pass through. The budget travels in
//! `X-Request-Budget-Ms`; each service records what it received on its server span and
//! what it forwarded on each client span.

/// A server span for an HTTP route, with the budget the hop works with.
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use opentelemetry::trace::{SpanKind, TraceContextExt as _};
use opentelemetry::{Array, Context, KeyValue, StringValue, Value};

use super::billing::charge_payment;
use super::service::{
    ATTEMPT_HEADER, BUDGET_HEADER, EDGE_BUDGET_MS, FALLBACK, FAULT_HEADER, Fault, MIN_CALL_MS,
    Outcome, RESERVE_MS, Service, attempt, between, received_budget, work,
};
use super::telemetry::{self, Deadline, REMAINING, end_span, start_span};

pub(super) fn http_server_span(
    service: &Service,
    parent: &Context,
    name: &'static str,
    budget_ms: Option<f64>,
) -> Context {
    let (method, path) = name.split_once(' ').unwrap_or(("POST", name));
    let mut attributes = vec![
        KeyValue::new("http.request.method", method),
        KeyValue::new("url.path", path),
    ];
    if let Some(budget) = budget_ms {
        attributes.push(KeyValue::new(REMAINING, budget.round() as i64));
    }
    start_span(&service.tracer, parent, SpanKind::Server, name, attributes)
}

/// Ends an HTTP server span with the status it answers.
pub(super) fn finish_http(cx: &Context, outcome: Outcome) -> StatusCode {
    let status = outcome.http_status();
    cx.span().set_attribute(KeyValue::new(
        "http.response.status_code",
        i64::from(status.as_u16()),
    ));
    let error = (outcome != Outcome::Ok).then(|| match outcome {
        Outcome::Exceeded => "deadline exceeded".to_string(),
        _ => format!("answered {status}"),
    });
    end_span(cx, error);
    status
}

/// One HTTP call as a client span.
pub(super) struct HttpCall {
    name: &'static str,
    peer: &'static str,
    url: String,
    /// Sent in the budget header and recorded; `None` sends none.
    budget_ms: Option<f64>,
    /// When the client stops waiting.
    timeout: Duration,
    fault: Fault,
    attempt: u32,
    idempotency_key: Option<String>,
}

pub(super) async fn call_http(service: &Service, cx: &Context, call: HttpCall) -> Outcome {
    let mut attributes = vec![
        KeyValue::new("http.request.method", "POST"),
        KeyValue::new("server.address", call.peer),
        KeyValue::new("url.full", call.url.clone()),
    ];
    let budget = call.budget_ms.map(|b| b.round() as i64);
    if let Some(budget) = budget {
        attributes.push(KeyValue::new(REMAINING, budget));
    }
    if let Some(key) = &call.idempotency_key {
        attributes.push(KeyValue::new(
            "http.request.header.idempotency-key",
            Value::Array(Array::String(vec![StringValue::from(key.clone())])),
        ));
    }
    let cx = start_span(&service.tracer, cx, SpanKind::Client, call.name, attributes);
    let mut request = service
        .http
        .post(&call.url)
        .timeout(call.timeout.max(Duration::from_millis(1)))
        .header(FAULT_HEADER, call.fault.name())
        .header(ATTEMPT_HEADER, call.attempt.to_string());
    for (name, value) in telemetry::inject(&cx) {
        request = request.header(name, value);
    }
    if let Some(budget) = budget {
        request = request.header(BUDGET_HEADER, budget.to_string());
    }
    if let Some(key) = &call.idempotency_key {
        request = request.header("idempotency-key", key);
    }
    let (outcome, error) = match request.send().await {
        Ok(response) => {
            let code = response.status().as_u16();
            cx.span()
                .set_attribute(KeyValue::new("http.response.status_code", i64::from(code)));
            match code {
                200..=299 => (Outcome::Ok, None),
                504 => (
                    Outcome::Exceeded,
                    Some(format!("{} answered 504", call.peer)),
                ),
                503 => (
                    Outcome::Unavailable,
                    Some(format!("{} answered 503", call.peer)),
                ),
                _ => (
                    Outcome::Failed,
                    Some(format!("{} answered {code}", call.peer)),
                ),
            }
        }
        Err(error) if error.is_timeout() => {
            cx.span()
                .set_attribute(KeyValue::new("error.type", "timeout"));
            (
                Outcome::Exceeded,
                Some(format!("gave up on {} after {:?}", call.peer, call.timeout)),
            )
        }
        Err(error) => {
            cx.span()
                .set_attribute(KeyValue::new("error.type", "connection"));
            (Outcome::Failed, Some(error.to_string()))
        }
    };
    end_span(&cx, error);
    outcome
}

/// `POST /checkout`: the edge. Gives requests without a budget `EDGE_BUDGET_MS`.
pub(super) async fn gateway(service: Arc<Service>, headers: HeaderMap) -> StatusCode {
    let start = Instant::now();
    let fault = Fault::from_headers(&headers);
    let budget = received_budget(&headers).unwrap_or(EDGE_BUDGET_MS);
    let cx = http_server_span(
        &service,
        &telemetry::extract(&headers),
        "POST /checkout",
        Some(budget),
    );
    let deadline = Deadline::new(start, budget);
    // Authentication and request parsing.
    tokio::time::sleep(between(5, 15)).await;
    let via_proxy = matches!(fault, Fault::StripsHeader | Fault::Sidecar);
    let forward = deadline.remaining_ms() - RESERVE_MS;
    let outcome = if forward < MIN_CALL_MS {
        Outcome::Exceeded
    } else {
        let base = &service.next[usize::from(via_proxy)];
        call_http(
            &service,
            &cx,
            HttpCall {
                name: "POST /orders",
                peer: "orders",
                url: format!("{base}/orders"),
                budget_ms: Some(forward),
                timeout: Duration::from_secs_f64(forward / 1000.0),
                fault,
                attempt: 1,
                idempotency_key: None,
            },
        )
        .await
    };
    service.meters.answered(
        "POST /checkout",
        Some(deadline),
        outcome == Outcome::Exceeded,
    );
    finish_http(&cx, outcome)
}

/// `POST /orders`: reserves stock at `inventory`, then charges at `billing`.
pub(super) async fn orders(service: Arc<Service>, headers: HeaderMap) -> StatusCode {
    let start = Instant::now();
    let fault = Fault::from_headers(&headers);
    let received = received_budget(&headers);
    let cx = http_server_span(
        &service,
        &telemetry::extract(&headers),
        "POST /orders",
        received,
    );
    let deadline = received.map(|b| Deadline::new(start, b));
    let order = format!("order-{:08x}", rand::random::<u32>());
    // Validating the order against its own database (not traced).
    match (fault, deadline) {
        (Fault::NothingLeft, Some(deadline)) => {
            tokio::time::sleep(Duration::from_secs_f64(
                (deadline.budget_ms + 120.0).max(0.0) / 1000.0,
            ))
            .await
        }
        _ => tokio::time::sleep(between(10, 20)).await,
    }
    let mut outcome = reserve_stock(&service, &cx, deadline, fault, &order).await;
    if outcome == Outcome::Ok {
        outcome = charge_payment(&service, &cx, deadline, fault, &order).await;
    }
    service
        .meters
        .answered("POST /orders", deadline, outcome == Outcome::Exceeded);
    finish_http(&cx, outcome)
}

pub(super) async fn reserve_stock(
    service: &Service,
    cx: &Context,
    deadline: Option<Deadline>,
    fault: Fault,
    order: &str,
) -> Outcome {
    let url = format!("{}/reserve", service.next[0]);
    let call = |budget_ms: Option<f64>, timeout: Duration, attempt: u32, key: bool| HttpCall {
        name: "POST /reserve",
        peer: "inventory",
        url: url.clone(),
        budget_ms,
        timeout,
        fault,
        attempt,
        idempotency_key: key.then(|| order.to_string()),
    };
    match (fault, deadline) {
        (Fault::FreshRetry, _) => {
            // The mistake: each attempt gets a fresh 400 ms, whatever is left, and the
            // non-idempotent POST is repeated without a key after a timeout.
            let mut outcome = Outcome::Failed;
            for attempt in 1..=3 {
                outcome = call_http(
                    service,
                    cx,
                    call(Some(400.0), Duration::from_millis(400), attempt, false),
                )
                .await;
                if outcome == Outcome::Ok {
                    break;
                }
            }
            outcome
        }
        (Fault::NothingLeft, Some(deadline)) => {
            // The mistake: no check of what is left; the client waits at least 100 ms.
            let forward = deadline.remaining_ms() - RESERVE_MS;
            let timeout = Duration::from_secs_f64(forward.max(100.0) / 1000.0);
            call_http(service, cx, call(Some(forward), timeout, 1, true)).await
        }
        (_, None) => call_http(service, cx, call(None, FALLBACK, 1, true)).await,
        (_, Some(deadline)) => {
            // At most two attempts, the second only on a refusal and only within the budget.
            let mut outcome = Outcome::Exceeded;
            for attempt in 1..=2 {
                let forward = deadline.remaining_ms() - RESERVE_MS;
                if forward < MIN_CALL_MS {
                    return Outcome::Exceeded;
                }
                let timeout = Duration::from_secs_f64(forward / 1000.0);
                outcome = call_http(service, cx, call(Some(forward), timeout, attempt, true)).await;
                if outcome != Outcome::Unavailable {
                    break;
                }
            }
            outcome
        }
    }
}

/// `POST /reserve`: takes stock. Fails fast on a spent budget.
pub(super) async fn inventory(service: Arc<Service>, headers: HeaderMap) -> StatusCode {
    let start = Instant::now();
    let fault = Fault::from_headers(&headers);
    let attempt = attempt(&headers);
    let budget = match fault {
        // The mistake: the service's own default replaces what the caller sent.
        Fault::ServerDefault => Some(2000.0),
        _ => received_budget(&headers),
    };
    let cx = http_server_span(
        &service,
        &telemetry::extract(&headers),
        "POST /reserve",
        budget,
    );
    let deadline = budget.map(|b| Deadline::new(start, b));
    let outcome = match (fault, attempt) {
        _ if budget.is_some_and(|b| b <= 0.0) => Outcome::Exceeded,
        (Fault::SlowLeaf, _) => {
            let slow = deadline.map_or(FALLBACK, |d| {
                Duration::from_secs_f64(d.budget_ms * 3.0 / 1000.0)
            });
            work(slow, deadline).await
        }
        (Fault::IgnoresDeadline, _) => {
            let slow = deadline.map_or(FALLBACK, |d| {
                Duration::from_secs_f64((d.budget_ms + 400.0) / 1000.0)
            });
            work(slow, None).await
        }
        (Fault::Flaky, 1) => {
            tokio::time::sleep(between(3, 8)).await;
            Outcome::Unavailable
        }
        (Fault::FreshRetry, 1 | 2) => work(Duration::from_secs(10), deadline).await,
        (Fault::FreshRetry, _) => work(between(300, 320), deadline).await,
        _ => work(between(20, 40), deadline).await,
    };
    service
        .meters
        .answered("POST /reserve", deadline, outcome == Outcome::Exceeded);
    finish_http(&cx, outcome)
}

/// The proxy in front of `orders` that some requests go through (`StripsHeader`, `Sidecar`).
pub(super) struct Proxy {
    pub(super) http: reqwest::Client,
    pub(super) orders: String,
}

/// Forwards `POST /orders` untraced: drops the budget header (`StripsHeader`), or stands in
/// a span of its own that is exported elsewhere (`Sidecar`).
pub(super) async fn proxy_handler(
    State(proxy): State<Arc<Proxy>>,
    headers: HeaderMap,
) -> StatusCode {
    let fault = Fault::from_headers(&headers);
    let mut request = proxy
        .http
        .post(format!("{}/orders", proxy.orders))
        .timeout(Duration::from_secs(10));
    for (name, value) in &headers {
        if name == axum::http::header::HOST
            || name == axum::http::header::CONTENT_LENGTH
            || (fault == Fault::StripsHeader && name.as_str() == BUDGET_HEADER)
        {
            continue;
        }
        if fault == Fault::Sidecar
            && name.as_str() == "traceparent"
            && let Some(replaced) = value.to_str().ok().and_then(foreign_parent)
        {
            request = request.header(name, replaced);
            continue;
        }
        request = request.header(name, value);
    }
    match request.send().await {
        Ok(response) => response.status(),
        Err(_) => StatusCode::BAD_GATEWAY,
    }
}

/// `traceparent` with the parent span id replaced by a new one.
pub(super) fn foreign_parent(traceparent: &str) -> Option<String> {
    let parts: Vec<&str> = traceparent.split('-').collect();
    let [version, trace, _, flags] = parts.as_slice() else {
        return None;
    };
    Some(format!(
        "{version}-{trace}-{:016x}-{flags}",
        rand::random::<u64>() | 1
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sidecar_keeps_the_trace_and_replaces_the_parent() {
        let original = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let replaced = foreign_parent(original).unwrap();
        assert!(replaced.starts_with("00-0af7651916cd43dd8448eb211c80319c-"));
        assert!(replaced.ends_with("-01"));
        assert_ne!(replaced, original);
        assert_eq!(foreign_parent("garbage"), None);
    }
}

//! The demo's live system: a shop of four real services on loopback, each instrumented with
//! the OpenTelemetry SDK and exporting over OTLP to the demo's server.
//!
//! `gateway` → `orders` → `inventory` talk HTTP with the budget in `X-Request-Budget-Ms`;
//! `orders` → `billing` talks gRPC with its native deadline (`grpc-timeout`). Each service
//! does what the common guides describe: it records `deadline.remaining_ms` on its server
//! span (what it received) and on each client span (what it forwarded), forwards what is
//! left minus a reserve, fails fast when too little is left, and retries only within the
//! shared budget and with an idempotency key. The load generator's `X-Demo-Fault` header
//! switches on one mistake for one request (`Fault`); the services pass it along.
//!
//! Invariant: every handler runs in a task of its own, so a caller that gives up (drops the
//! connection) never cuts a callee's span short: the callee's span ends when its work does.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use opentelemetry::trace::{SpanKind, TraceContextExt as _};
use opentelemetry::{Array, Context, KeyValue, StringValue, Value};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::telemetry::{self, Deadline, Otlp, REMAINING, end_span, start_span};

pub const BUDGET_HEADER: &str = "x-request-budget-ms";
pub const FAULT_HEADER: &str = "x-demo-fault";
const ATTEMPT_HEADER: &str = "x-demo-attempt";

/// Kept back from what is left before forwarding it, for the hop's own reply.
const RESERVE_MS: f64 = 10.0;
/// Below this much left, a service does not start a call (it fails fast instead).
const MIN_CALL_MS: f64 = 20.0;
/// What a service without a received budget waits for its calls (it forwards no budget).
const FALLBACK: Duration = Duration::from_secs(2);
/// The budget `gateway` gives a request that arrives without one.
const EDGE_BUDGET_MS: f64 = 1000.0;
/// What `billing` expects a charge to take: with less left it refuses at once.
const CHARGE_COST_MS: f64 = 150.0;

/// One budget mistake, switched on per request by the load generator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    None,
    /// `inventory` is slow but stops at its deadline (local exceed at a leaf).
    SlowLeaf,
    /// `inventory` is slow and ignores its deadline: it works on after `orders` gave up.
    IgnoresDeadline,
    /// `orders` calls `billing` with a fixed 3 s deadline, whatever is left, and billing is
    /// slow: the call forwards more than `orders` has.
    FixedTimeout,
    /// `inventory` replaces the caller's budget with its own 2 s default.
    ServerDefault,
    /// A proxy between `gateway` and `orders` strips `X-Request-Budget-Ms`.
    StripsHeader,
    /// A sidecar proxy traces to another backend: `orders`' parent span never arrives.
    Sidecar,
    /// `inventory` refuses the first attempt at once; `orders` retries within its budget,
    /// with an idempotency key (the good way).
    Flaky,
    /// `inventory` hangs; `orders` retries three times with a fresh 400 ms per attempt and
    /// no idempotency key, whatever is left.
    FreshRetry,
    /// `orders`' own work spends the budget, and it calls `inventory` anyway.
    NothingLeft,
    /// The client sends a small budget; `billing` refuses work it cannot finish in time.
    Admission,
}

impl Fault {
    pub const ALL: [Fault; 11] = [
        Fault::None,
        Fault::SlowLeaf,
        Fault::IgnoresDeadline,
        Fault::FixedTimeout,
        Fault::ServerDefault,
        Fault::StripsHeader,
        Fault::Sidecar,
        Fault::Flaky,
        Fault::FreshRetry,
        Fault::NothingLeft,
        Fault::Admission,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::SlowLeaf => "slow-leaf",
            Fault::IgnoresDeadline => "ignores-deadline",
            Fault::FixedTimeout => "fixed-timeout",
            Fault::ServerDefault => "server-default",
            Fault::StripsHeader => "strips-header",
            Fault::Sidecar => "sidecar",
            Fault::Flaky => "flaky",
            Fault::FreshRetry => "fresh-retry",
            Fault::NothingLeft => "nothing-left",
            Fault::Admission => "admission",
        }
    }

    fn from_headers(headers: &HeaderMap) -> Fault {
        let name = headers
            .get(FAULT_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("none");
        Fault::ALL
            .into_iter()
            .find(|fault| fault.name() == name)
            .unwrap_or(Fault::None)
    }

    /// The budget the load generator gives a request with this fault.
    pub fn client_budget_ms(self) -> f64 {
        match self {
            Fault::Admission => 150.0,
            _ => EDGE_BUDGET_MS,
        }
    }
}

/// How a call ended, as the caller sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Ok,
    /// The callee ran out of budget (504, DEADLINE_EXCEEDED) or the caller stopped waiting.
    Exceeded,
    /// The callee declined (503, UNAVAILABLE).
    Unavailable,
    Failed,
}

impl Outcome {
    fn http_status(self) -> StatusCode {
        match self {
            Outcome::Ok => StatusCode::OK,
            Outcome::Exceeded => StatusCode::GATEWAY_TIMEOUT,
            Outcome::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Outcome::Failed => StatusCode::BAD_GATEWAY,
        }
    }
}

/// What every service holds: its tracer and an HTTP client, plus where its callees are.
struct Service {
    tracer: SdkTracer,
    http: reqwest::Client,
    /// `gateway`: orders, and the proxy in front of it. `orders`: inventory and billing.
    next: Vec<String>,
}

/// The running shop: its services' listeners and tracer providers.
pub struct Shop {
    /// Where the load generator sends requests: `POST {gateway}/checkout`.
    pub gateway: String,
    providers: Vec<SdkTracerProvider>,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Shop {
    /// Starts the four services and the proxy on loopback, exporting to `otlp_http` (base
    /// URL) and `otlp_grpc` (URL).
    pub async fn start(otlp_http: &str, otlp_grpc: &str) -> anyhow::Result<Shop> {
        let runtime = tokio::runtime::Handle::current();
        let http = reqwest::Client::builder()
            .pool_idle_timeout(Duration::from_secs(30))
            .build()?;
        let bind = || TcpListener::bind("127.0.0.1:0");
        let (gateway_l, orders_l, inventory_l, billing_l, proxy_l) = (
            bind().await?,
            bind().await?,
            bind().await?,
            bind().await?,
            bind().await?,
        );
        let url = |l: &TcpListener| l.local_addr().map(|a| format!("http://{a}"));
        let (gateway_url, orders_url, inventory_url, billing_url, proxy_url) = (
            url(&gateway_l)?,
            url(&orders_l)?,
            url(&inventory_l)?,
            url(&billing_l)?,
            url(&proxy_l)?,
        );
        let mut providers = Vec::new();
        let service = |name: &'static str, otlp: Otlp, next: Vec<String>| {
            let runtime = runtime.clone();
            let http = http.clone();
            async move {
                let provider = telemetry::provider(name, otlp, runtime).await?;
                let tracer = opentelemetry::trace::TracerProvider::tracer(&provider, "demo");
                anyhow::Ok((provider, Arc::new(Service { tracer, http, next })))
            }
        };
        let (p, gateway) = service(
            "gateway",
            Otlp::Http(otlp_http.into()),
            vec![orders_url.clone(), proxy_url],
        )
        .await?;
        providers.push(p);
        let (p, orders) = service(
            "orders",
            Otlp::Http(otlp_http.into()),
            vec![inventory_url, billing_url],
        )
        .await?;
        providers.push(p);
        let (p, inventory) = service("inventory", Otlp::Http(otlp_http.into()), vec![]).await?;
        providers.push(p);
        let (p, billing) = service("billing", Otlp::Grpc(otlp_grpc.into()), vec![]).await?;
        providers.push(p);

        let stop = CancellationToken::new();
        let routers = [
            (
                gateway_l,
                Router::new()
                    .route(
                        "/checkout",
                        post(|State(s), headers| in_own_task(self::gateway(s, headers))),
                    )
                    .with_state(gateway),
            ),
            (
                orders_l,
                Router::new()
                    .route(
                        "/orders",
                        post(|State(s), headers| in_own_task(self::orders(s, headers))),
                    )
                    .with_state(orders),
            ),
            (
                inventory_l,
                Router::new()
                    .route(
                        "/reserve",
                        post(|State(s), headers| in_own_task(self::inventory(s, headers))),
                    )
                    .with_state(inventory),
            ),
            (
                billing_l,
                Router::new().route_service(
                    "/demo.Billing/Charge",
                    tower::service_fn(move |request| {
                        let billing = billing.clone();
                        async move {
                            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::<
                                ChargeReply,
                                ChargeRequest,
                            >::default(
                            ));
                            let charge = tower::service_fn(move |request| {
                                let billing = billing.clone();
                                async move {
                                    tokio::spawn(charge(billing, request)).await.unwrap_or_else(
                                        |_| Err(tonic::Status::internal("billing failed")),
                                    )
                                }
                            });
                            Ok::<_, std::convert::Infallible>(grpc.unary(charge, request).await)
                        }
                    }),
                ),
            ),
            (
                proxy_l,
                Router::new()
                    .route("/orders", post(proxy_handler))
                    .with_state(Arc::new(Proxy {
                        http: http.clone(),
                        orders: orders_url,
                    })),
            ),
        ];
        let tasks = routers
            .into_iter()
            .map(|(listener, router)| {
                let stop = stop.clone();
                tokio::spawn(async move {
                    let served = axum::serve(listener, router)
                        .with_graceful_shutdown(stop.cancelled_owned())
                        .await;
                    if let Err(error) = served {
                        tracing::warn!(%error, "a demo service stopped");
                    }
                })
            })
            .collect();
        Ok(Shop {
            gateway: gateway_url,
            providers,
            stop,
            tasks,
        })
    }

    /// Stops the services and sends every span they still hold.
    pub async fn shutdown(self) {
        self.stop.cancel();
        for task in self.tasks {
            let _ = task.await;
        }
        let providers = self.providers;
        let flushed = tokio::task::spawn_blocking(move || {
            providers
                .iter()
                .map(|provider| provider.shutdown())
                .find_map(Result::err)
        })
        .await;
        if let Ok(Some(error)) = flushed {
            tracing::warn!(%error, "a demo service could not send its last spans");
        }
    }
}

/// Runs a handler's work in a task of its own (see the module's invariant).
async fn in_own_task(work: impl Future<Output = StatusCode> + Send + 'static) -> StatusCode {
    tokio::spawn(work)
        .await
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// The budget header's value in milliseconds, when present and numeric.
fn received_budget(headers: &HeaderMap) -> Option<f64> {
    headers
        .get(BUDGET_HEADER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
}

fn attempt(headers: &HeaderMap) -> u32 {
    headers
        .get(ATTEMPT_HEADER)
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(1)
}

/// A server span for an HTTP route, with the budget the hop works with.
fn http_server_span(
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
fn finish_http(cx: &Context, outcome: Outcome) -> StatusCode {
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

/// Sleeps `work`, or until `deadline` when the service honours it (then `Exceeded`).
async fn work(work: Duration, deadline: Option<Deadline>) -> Outcome {
    match deadline {
        Some(deadline) => {
            match tokio::time::timeout(deadline.remaining(), tokio::time::sleep(work)).await {
                Ok(()) => Outcome::Ok,
                Err(_) => Outcome::Exceeded,
            }
        }
        None => {
            tokio::time::sleep(work).await;
            Outcome::Ok
        }
    }
}

fn between(low_ms: u64, high_ms: u64) -> Duration {
    Duration::from_millis(rand::random_range(low_ms..=high_ms))
}

/// One HTTP call as a client span.
struct HttpCall {
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

async fn call_http(service: &Service, cx: &Context, call: HttpCall) -> Outcome {
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
async fn gateway(service: Arc<Service>, headers: HeaderMap) -> StatusCode {
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
    finish_http(&cx, outcome)
}

/// `POST /orders`: reserves stock at `inventory`, then charges at `billing`.
async fn orders(service: Arc<Service>, headers: HeaderMap) -> StatusCode {
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
    finish_http(&cx, outcome)
}

async fn reserve_stock(
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

/// gRPC `demo.Billing/Charge`'s request and reply.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ChargeRequest {
    #[prost(string, tag = "1")]
    pub order: String,
    #[prost(int64, tag = "2")]
    pub cents: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ChargeReply {
    #[prost(string, tag = "1")]
    pub receipt: String,
}

async fn charge_payment(
    service: &Service,
    cx: &Context,
    deadline: Option<Deadline>,
    fault: Fault,
    order: &str,
) -> Outcome {
    let forward = match (fault, deadline) {
        // The mistake: a fixed deadline from the client's configuration.
        (Fault::FixedTimeout, _) => Some(3000.0),
        (_, Some(deadline)) => {
            let forward = deadline.remaining_ms() - RESERVE_MS;
            if forward < MIN_CALL_MS {
                return Outcome::Exceeded;
            }
            Some(forward)
        }
        (_, None) => None,
    };
    let mut attributes = vec![
        KeyValue::new("rpc.system", "grpc"),
        KeyValue::new("rpc.service", "demo.Billing"),
        KeyValue::new("rpc.method", "Charge"),
        KeyValue::new("server.address", "billing"),
    ];
    if let Some(forward) = forward {
        attributes.push(KeyValue::new(REMAINING, forward.round() as i64));
    }
    let cx = start_span(
        &service.tracer,
        cx,
        SpanKind::Client,
        "demo.Billing/Charge",
        attributes,
    );
    let timeout = forward.map_or(FALLBACK, |ms| Duration::from_secs_f64(ms / 1000.0));
    let mut request = tonic::Request::new(ChargeRequest {
        order: order.to_string(),
        cents: 4_200,
    });
    request.set_timeout(timeout);
    for (name, value) in telemetry::inject(&cx) {
        if let (Ok(name), Ok(value)) = (
            tonic::metadata::MetadataKey::from_bytes(name.as_bytes()),
            value.parse(),
        ) {
            request.metadata_mut().insert(name, value);
        }
    }
    request.metadata_mut().insert(
        FAULT_HEADER,
        tonic::metadata::MetadataValue::from_static(fault.name()),
    );
    let result = async {
        let channel = tonic::transport::Endpoint::from_shared(service.next[1].clone())
            .map_err(|e| tonic::Status::internal(e.to_string()))?
            .connect_lazy();
        let mut client = tonic::client::Grpc::new(channel);
        client
            .ready()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let path = axum::http::uri::PathAndQuery::from_static("/demo.Billing/Charge");
        let codec = tonic_prost::ProstCodec::<ChargeRequest, ChargeReply>::default();
        client.unary(request, path, codec).await
    };
    let (outcome, error) = match tokio::time::timeout(timeout, result).await {
        Ok(Ok(_)) => {
            cx.span()
                .set_attribute(KeyValue::new("rpc.grpc.status_code", 0_i64));
            (Outcome::Ok, None)
        }
        Ok(Err(status)) => {
            cx.span()
                .set_attribute(KeyValue::new("rpc.grpc.status_code", status.code() as i64));
            let outcome = match status.code() {
                tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => Outcome::Exceeded,
                tonic::Code::Unavailable => Outcome::Unavailable,
                _ => Outcome::Failed,
            };
            (outcome, Some(status.message().to_string()))
        }
        Err(_) => {
            cx.span().set_attribute(KeyValue::new(
                "rpc.grpc.status_code",
                tonic::Code::DeadlineExceeded as i64,
            ));
            (
                Outcome::Exceeded,
                Some(format!("gave up on billing after {timeout:?}")),
            )
        }
    };
    end_span(&cx, error);
    outcome
}

/// `demo.Billing/Charge`: reads the deadline from `grpc-timeout`, refuses a charge it
/// cannot finish in time, and stops at its deadline.
async fn charge(
    service: Arc<Service>,
    request: tonic::Request<ChargeRequest>,
) -> Result<tonic::Response<ChargeReply>, tonic::Status> {
    let start = Instant::now();
    let metadata = request.metadata().clone().into_headers();
    let fault = Fault::from_headers(&metadata);
    let received = metadata
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(crate::budget::parse_grpc_timeout);
    let mut attributes = vec![
        KeyValue::new("rpc.system", "grpc"),
        KeyValue::new("rpc.service", "demo.Billing"),
        KeyValue::new("rpc.method", "Charge"),
    ];
    if let Some(budget) = received {
        attributes.push(KeyValue::new(REMAINING, budget.round() as i64));
    }
    let cx = start_span(
        &service.tracer,
        &telemetry::extract(&metadata),
        SpanKind::Server,
        "demo.Billing/Charge",
        attributes,
    );
    let deadline = received.map(|b| Deadline::new(start, b));
    let outcome = match deadline {
        // Admission control: with less left than a charge takes, refuse at once.
        Some(deadline) if deadline.remaining_ms() < CHARGE_COST_MS => {
            Err(tonic::Status::deadline_exceeded(format!(
                "{:.0} ms left, a charge takes about {CHARGE_COST_MS:.0} ms: not started",
                deadline.remaining_ms()
            )))
        }
        _ => {
            // The payment provider; slow in the fixed-timeout scenario.
            let duration = if fault == Fault::FixedTimeout {
                between(1150, 1250)
            } else {
                between(30, 60)
            };
            match work(duration, deadline).await {
                Outcome::Ok => Ok(tonic::Response::new(ChargeReply {
                    receipt: format!("receipt-for-{}", request.get_ref().order),
                })),
                _ => Err(tonic::Status::deadline_exceeded(
                    "deadline passed while charging",
                )),
            }
        }
    };
    let code = match &outcome {
        Ok(_) => 0,
        Err(status) => status.code() as i64,
    };
    cx.span()
        .set_attribute(KeyValue::new("rpc.grpc.status_code", code));
    end_span(&cx, outcome.as_ref().err().map(|s| s.message().to_string()));
    outcome
}

/// `POST /reserve`: takes stock. Fails fast on a spent budget.
async fn inventory(service: Arc<Service>, headers: HeaderMap) -> StatusCode {
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
    finish_http(&cx, outcome)
}

/// The proxy in front of `orders` that some requests go through (`StripsHeader`, `Sidecar`).
struct Proxy {
    http: reqwest::Client,
    orders: String,
}

/// Forwards `POST /orders` untraced: drops the budget header (`StripsHeader`), or stands in
/// a span of its own that is exported elsewhere (`Sidecar`).
async fn proxy_handler(State(proxy): State<Arc<Proxy>>, headers: HeaderMap) -> StatusCode {
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
fn foreign_parent(traceparent: &str) -> Option<String> {
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

    #[test]
    fn every_fault_round_trips_through_its_header() {
        for fault in Fault::ALL {
            let mut headers = HeaderMap::new();
            headers.insert(FAULT_HEADER, fault.name().parse().unwrap());
            assert_eq!(Fault::from_headers(&headers), fault);
        }
        assert_eq!(Fault::from_headers(&HeaderMap::new()), Fault::None);
    }
}

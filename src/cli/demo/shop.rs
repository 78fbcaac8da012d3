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
//! `service.rs` holds what they share, `http.rs` the HTTP services and the proxy,
//! `billing.rs` the gRPC one; this module starts them and stops them.
//!
//! Invariant: every handler runs in a task of its own, so a caller that gives up (drops the
//! connection) never cuts a callee's span short: the callee's span ends when its work does.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::service::{Service, in_own_task};
use super::telemetry::{self, Otlp};
use super::{billing, http};

/// The running shop: its services' listeners and tracer and meter providers.
pub struct Shop {
    /// Where the load generator sends requests: `POST {gateway}/checkout`.
    pub gateway: String,
    providers: Vec<(SdkTracerProvider, SdkMeterProvider)>,
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
                let telemetry = telemetry::telemetry(name, otlp, runtime).await?;
                let provider = telemetry.tracer_provider;
                let tracer = opentelemetry::trace::TracerProvider::tracer(&provider, "demo");
                let service = Service {
                    tracer,
                    meters: telemetry.meters,
                    http,
                    next,
                };
                anyhow::Ok(((provider, telemetry.meter_provider), Arc::new(service)))
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
                        post(|State(s), headers| in_own_task(http::gateway(s, headers))),
                    )
                    .with_state(gateway),
            ),
            (
                orders_l,
                Router::new()
                    .route(
                        "/orders",
                        post(|State(s), headers| in_own_task(http::orders(s, headers))),
                    )
                    .with_state(orders),
            ),
            (
                inventory_l,
                Router::new()
                    .route(
                        "/reserve",
                        post(|State(s), headers| in_own_task(http::inventory(s, headers))),
                    )
                    .with_state(inventory),
            ),
            (billing_l, billing::router(billing)),
            (
                proxy_l,
                Router::new()
                    .route("/orders", post(http::proxy_handler))
                    .with_state(Arc::new(http::Proxy {
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

    /// Stops the services and sends every span and metric they still hold.
    pub async fn shutdown(self) {
        self.stop.cancel();
        for task in self.tasks {
            let _ = task.await;
        }
        let providers = self.providers;
        let flushed = tokio::task::spawn_blocking(move || {
            // Every provider is shut down, whichever fails.
            let spans = providers.iter().map(|(spans, _)| spans.shutdown());
            let metrics = providers.iter().map(|(_, metrics)| metrics.shutdown());
            let results: Vec<_> = spans.chain(metrics).collect();
            results.into_iter().find_map(Result::err)
        })
        .await;
        if let Ok(Some(error)) = flushed {
            tracing::warn!(%error, "a demo service could not send its last spans or metrics");
        }
    }
}

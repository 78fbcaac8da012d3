//! The shop's gRPC service, `demo.Billing/Charge`, with tonic's codec over hand-written
//! prost messages: the deadline travels as `grpc-timeout`. The client side is `orders`'
//! call; the server side refuses a charge it cannot finish in time (admission control).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use opentelemetry::trace::{SpanKind, TraceContextExt as _};
use opentelemetry::{Context, KeyValue};

use super::service::{
    FALLBACK, FAULT_HEADER, Fault, MIN_CALL_MS, Outcome, RESERVE_MS, Service, between, work,
};
use super::telemetry::{self, Deadline, REMAINING, end_span, start_span};

/// The route that serves `demo.Billing/Charge`, each call in a task of its own.
pub(super) fn router(billing: Arc<Service>) -> Router {
    Router::new().route_service(
        "/demo.Billing/Charge",
        tower::service_fn(move |request| {
            let billing = billing.clone();
            async move {
                let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::<
                    ChargeReply,
                    ChargeRequest,
                >::default());
                let charge = tower::service_fn(move |request| {
                    let billing = billing.clone();
                    async move {
                        tokio::spawn(charge(billing, request))
                            .await
                            .unwrap_or_else(|_| Err(tonic::Status::internal("billing failed")))
                    }
                });
                Ok::<_, std::convert::Infallible>(grpc.unary(charge, request).await)
            }
        }),
    )
}

/// The attributes of both ends of a `Charge` call.
fn rpc_attributes() -> Vec<KeyValue> {
    vec![
        KeyValue::new("rpc.system", "grpc"),
        KeyValue::new("rpc.service", "demo.Billing"),
        KeyValue::new("rpc.method", "Charge"),
    ]
}

/// What `billing` expects a charge to take: with less left it refuses at once.
pub(super) const CHARGE_COST_MS: f64 = 150.0;

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

pub(super) async fn charge_payment(
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
    let mut attributes = rpc_attributes();
    attributes.push(KeyValue::new("server.address", "billing"));
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
        .and_then(crate::core::budget::parse_grpc_timeout);
    let mut attributes = rpc_attributes();
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
    service.meters.answered(
        "demo.Billing/Charge",
        deadline,
        code == tonic::Code::DeadlineExceeded as i64,
    );
    cx.span()
        .set_attribute(KeyValue::new("rpc.grpc.status_code", code));
    end_span(&cx, outcome.as_ref().err().map(|s| s.message().to_string()));
    outcome
}

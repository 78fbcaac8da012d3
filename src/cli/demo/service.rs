//! What every service of the demo's shop shares: the headers, the budget rules it follows
//! (reserve, fail-fast threshold, fallback), the `Fault` the load generator switches on,
//! how a call ended (`Outcome`), and the service's tracer, meters and HTTP client.

use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use opentelemetry_sdk::trace::SdkTracer;

use super::telemetry::{Deadline, DeadlineMeters};

pub const BUDGET_HEADER: &str = "x-request-budget-ms";

pub const FAULT_HEADER: &str = "x-demo-fault";

pub(super) const ATTEMPT_HEADER: &str = "x-demo-attempt";

/// Kept back from what is left before forwarding it, for the hop's own reply.
pub(super) const RESERVE_MS: f64 = 10.0;

/// Below this much left, a service does not start a call (it fails fast instead).
pub(super) const MIN_CALL_MS: f64 = 20.0;

/// What a service without a received budget waits for its calls (it forwards no budget).
pub(super) const FALLBACK: Duration = Duration::from_secs(2);

/// The budget `gateway` gives a request that arrives without one.
pub(super) const EDGE_BUDGET_MS: f64 = 1000.0;

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

    pub(super) fn from_headers(headers: &HeaderMap) -> Fault {
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
pub(super) enum Outcome {
    Ok,
    /// The callee ran out of budget (504, DEADLINE_EXCEEDED) or the caller stopped waiting.
    Exceeded,
    /// The callee declined (503, UNAVAILABLE).
    Unavailable,
    Failed,
}

impl Outcome {
    pub(super) fn http_status(self) -> StatusCode {
        match self {
            Outcome::Ok => StatusCode::OK,
            Outcome::Exceeded => StatusCode::GATEWAY_TIMEOUT,
            Outcome::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Outcome::Failed => StatusCode::BAD_GATEWAY,
        }
    }
}

/// What every service holds: its tracer, its deadline metrics and an HTTP client, plus
/// where its callees are.
pub(super) struct Service {
    pub(super) tracer: SdkTracer,
    pub(super) meters: DeadlineMeters,
    pub(super) http: reqwest::Client,
    /// `gateway`: orders, and the proxy in front of it. `orders`: inventory and billing.
    pub(super) next: Vec<String>,
}

/// Runs a handler's work in a task of its own (see the module's invariant).
pub(super) async fn in_own_task(
    work: impl Future<Output = StatusCode> + Send + 'static,
) -> StatusCode {
    tokio::spawn(work)
        .await
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// The budget header's value in milliseconds, when present and numeric.
pub(super) fn received_budget(headers: &HeaderMap) -> Option<f64> {
    headers
        .get(BUDGET_HEADER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
}

pub(super) fn attempt(headers: &HeaderMap) -> u32 {
    headers
        .get(ATTEMPT_HEADER)
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(1)
}

/// Sleeps `work`, or until `deadline` when the service honours it (then `Exceeded`).
pub(super) async fn work(work: Duration, deadline: Option<Deadline>) -> Outcome {
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

pub(super) fn between(low_ms: u64, high_ms: u64) -> Duration {
    Duration::from_millis(rand::random_range(low_ms..=high_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

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

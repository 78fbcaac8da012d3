//! The demo's load generator: an uninstrumented client (a browser, say) that sends
//! `POST /checkout` to the shop's gateway with a budget, healthy requests in between each
//! of the faults in turn, so every flag appears within the first round.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::service::{BUDGET_HEADER, FAULT_HEADER, Fault};

/// What the load generator has seen so far.
#[derive(Debug, Default)]
pub struct Tally {
    pub sent: AtomicU64,
    pub ok: AtomicU64,
    /// Answered 504: the request ran out of budget somewhere.
    pub exceeded: AtomicU64,
    pub other: AtomicU64,
}

impl Tally {
    pub fn line(&self) -> String {
        format!(
            "{} requests sent: {} answered in time, {} ran out of budget, {} failed otherwise",
            self.sent.load(Ordering::Relaxed),
            self.ok.load(Ordering::Relaxed),
            self.exceeded.load(Ordering::Relaxed),
            self.other.load(Ordering::Relaxed),
        )
    }
}

/// The faults in the order they are sent: a healthy request before each faulty one.
pub fn schedule() -> impl Iterator<Item = Fault> {
    Fault::ALL
        .into_iter()
        .filter(|f| *f != Fault::None)
        .flat_map(|fault| [Fault::None, fault])
        .cycle()
}

/// Sends `rate` requests per second to `gateway` until `stop`, then waits for the ones in
/// flight (each gives up after 5 s).
pub async fn run(gateway: String, rate: f64, stop: CancellationToken, tally: Arc<Tally>) {
    let client = match reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
    {
        Ok(client) => client,
        Err(error) => {
            tracing::error!(%error, "the demo's load generator could not start");
            return;
        }
    };
    let url = format!("{gateway}/checkout");
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut in_flight = JoinSet::new();
    for fault in schedule() {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        while in_flight.try_join_next().is_some() {}
        let request = client
            .post(&url)
            .header(BUDGET_HEADER, fault.client_budget_ms().to_string())
            .header(FAULT_HEADER, fault.name());
        let tally = tally.clone();
        tally.sent.fetch_add(1, Ordering::Relaxed);
        in_flight.spawn(async move {
            let counter = match request.send().await.map(|r| r.status().as_u16()) {
                Ok(200..=299) => &tally.ok,
                Ok(504) => &tally.exceeded,
                _ => &tally.other,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        });
    }
    while in_flight.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fault_comes_in_the_first_round_between_healthy_requests() {
        let first: Vec<Fault> = schedule().take(2 * (Fault::ALL.len() - 1)).collect();
        for fault in Fault::ALL {
            assert!(first.contains(&fault), "{fault:?}");
        }
        assert!(first.iter().step_by(2).all(|f| *f == Fault::None));
    }
}

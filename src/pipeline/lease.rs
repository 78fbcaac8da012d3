//! The lease on the work that must run on one server at a time when several share a
//! database: retention, alert evaluation and notification delivery, compaction.
//!
//! Architecture invariant: a server does that work only while `Lease::held` says so, which
//! is until `TERM − MARGIN` after it asked for its last successful renewal, by its own
//! clock; the database gives the lease to another server only once `TERM` has passed since
//! that renewal, by the other's clock. So two servers whose clocks differ by less than
//! `MARGIN` never both hold it, and a server that dies is replaced within `TERM + RENEW`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::clock::now_unix_nano;
use crate::store::Store;

/// How long one renewal holds the lease in the database.
pub const TERM: Duration = Duration::from_secs(10);

/// How often the holder renews it, and how often the others ask for it.
pub const RENEW: Duration = Duration::from_secs(2);

/// How far apart the clocks of servers sharing a database may be.
const MARGIN: Duration = Duration::from_secs(2);

/// One named lease, as this server sees it.
pub struct Lease {
    name: &'static str,
    holder: String,
    /// Until when this server may do the lease's work; `None` when it does not hold it.
    held_until: Mutex<Option<Instant>>,
    /// The last renewal failed (its failure was logged; the next is not).
    failing: std::sync::atomic::AtomicBool,
}

impl Lease {
    /// The lease `name`, asked for as `holder` (unique per process).
    pub fn new(name: &'static str, holder: String) -> Lease {
        Lease {
            name,
            holder,
            held_until: Mutex::new(None),
            failing: Default::default(),
        }
    }

    /// A holder name unique to this process, readable in the database: the address it
    /// serves, its process id and a random suffix.
    pub fn holder_name(addr: std::net::SocketAddr) -> String {
        format!(
            "{addr} pid {} {:08x}",
            std::process::id(),
            rand::random::<u32>()
        )
    }

    /// Whether this server may do the lease's work now.
    pub fn held(&self) -> bool {
        self.until().is_some_and(|until| Instant::now() < until)
    }

    fn until(&self) -> Option<Instant> {
        *self.held_until.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes or renews the lease once; returns whether this server holds it. When the
    /// database cannot be asked, what was held stays held until its local end.
    pub async fn renew(&self, store: &dyn Store) -> bool {
        let asked = Instant::now();
        let now = now_unix_nano();
        let until = now.saturating_add(TERM.as_nanos() as u64);
        match store.hold_lease(self.name, &self.holder, now, until).await {
            Ok(held) => {
                if self
                    .failing
                    .swap(false, std::sync::atomic::Ordering::Relaxed)
                {
                    tracing::info!(lease = self.name, "the lease can be renewed again");
                }
                let before = self.held();
                *self.held_until.lock().unwrap_or_else(|e| e.into_inner()) =
                    held.then(|| asked + (TERM - MARGIN));
                if held != before {
                    match held {
                        true => {
                            tracing::info!(lease = self.name, holder = %self.holder, "this server now does the work of one server at a time (retention, alerts, compaction)")
                        }
                        false => tracing::info!(
                            lease = self.name,
                            "another server holds the lease; this one leaves retention, alerts and compaction to it"
                        ),
                    }
                }
                held
            }
            Err(error) => {
                // Once per streak of failures: a database that takes no writes fails every
                // renewal, and `pipeline::health` already says why.
                if !self
                    .failing
                    .swap(true, std::sync::atomic::Ordering::Relaxed)
                {
                    tracing::warn!(%error, lease = self.name, "could not renew the lease; will keep trying");
                }
                self.held()
            }
        }
    }

    /// Renews every `RENEW` until `stop`.
    pub async fn run(&self, store: &dyn Store, stop: CancellationToken) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(RENEW) => {}
            }
            self.renew(store).await;
        }
    }

    /// Gives the lease up (a clean shutdown, after its work has stopped), so another server
    /// takes it at its next renewal instead of after `TERM`.
    pub async fn release(&self, store: &dyn Store) {
        *self.held_until.lock().unwrap_or_else(|e| e.into_inner()) = None;
        if let Err(error) = store.release_lease(self.name, &self.holder).await {
            tracing::warn!(%error, lease = self.name, "could not give up the lease; another server takes it when it expires");
        }
    }
}

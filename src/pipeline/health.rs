//! Whether the database takes writes: the fault the writers last met (`store::Fault`: a
//! full disk, a corrupt or read-only database), from the first write that met it until a
//! write succeeds again. `/readyz` answers 503 with it; exports are refused retryably with
//! it named.
//!
//! Architecture invariant: one ERROR line when a fault starts, with what to do, and one line
//! when writes recover, with how many requests were refused meanwhile; nothing per failed
//! write in between, however many there are.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::store::{Fault, StoreError};

/// The fault in force, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Faulted {
    pub fault: Fault,
    /// The database's own words, for the log and `/readyz`.
    pub detail: String,
    pub since_unix_nano: u64,
}

#[derive(Default)]
pub struct Health {
    faulted: Mutex<Option<Faulted>>,
    /// Export requests refused since the fault started.
    refused: AtomicU64,
}

impl Health {
    /// Takes the outcome of a write. Returns true when the error is a fault, which this logs
    /// itself (once, when it starts), so the caller does not.
    pub fn observe(&self, result: &Result<(), StoreError>) -> bool {
        let mut faulted = self.lock();
        match (result, faulted.as_ref()) {
            (Ok(()), None) => false,
            (Ok(()), Some(was)) => {
                // Taken outside the macro, whose arguments run only when the line is logged.
                let refused = self.refused.swap(0, Ordering::Relaxed);
                tracing::info!(
                    fault = was.fault.what(),
                    refused_requests = refused,
                    "database writes recovered"
                );
                *faulted = None;
                false
            }
            (Err(StoreError::Fault(fault, detail)), was) => {
                if was.is_some_and(|was| was.fault == *fault) {
                    return true;
                }
                tracing::error!(
                    fault = fault.what(),
                    detail = %detail,
                    "{}; writes are refused until then: {}",
                    fault.what(),
                    fault.what_to_do()
                );
                *faulted = Some(Faulted {
                    fault: *fault,
                    detail: detail.clone(),
                    since_unix_nano: crate::clock::now_unix_nano(),
                });
                true
            }
            // Another error says nothing of the fault: it lasts until a write succeeds.
            (Err(_), _) => false,
        }
    }

    /// Counts an export refused while a fault is in force.
    pub fn refused(&self) {
        if self.lock().is_some() {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The fault in force.
    pub fn fault(&self) -> Option<Faulted> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Faulted>> {
        self.faulted
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_lasts_from_its_first_write_until_one_succeeds() {
        let health = Health::default();
        let full = || {
            Err(StoreError::Fault(
                Fault::DiskFull,
                "database or disk is full".into(),
            ))
        };
        assert!(!health.observe(&Err(StoreError::Unavailable("gone".into()))));
        assert_eq!(health.fault(), None, "not a fault");
        assert!(health.observe(&full()), "a new fault is logged here");
        assert!(health.observe(&full()), "the same fault again: not logged");
        health.refused();
        assert_eq!(health.fault().unwrap().fault, Fault::DiskFull);
        assert!(!health.observe(&Err(StoreError::Busy("locked".into()))));
        assert_eq!(
            health.fault().unwrap().fault,
            Fault::DiskFull,
            "still in force"
        );
        assert!(!health.observe(&Ok(())));
        assert_eq!(health.fault(), None, "writes recovered");
        assert_eq!(
            health.refused.load(Ordering::Relaxed),
            0,
            "the count restarts"
        );
    }
}

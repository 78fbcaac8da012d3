//! The operations (service, name, kind) this server upserted lately, so that a batch
//! upserts only those it has news of: every export batch upserting every operation it
//! touches took row locks that the servers sharing a Postgres database waited on
//! (`budgetscope-bench sustained --servers 3`, `pg_stat_statements`).
//!
//! Architecture invariant: an operation is left out of a batch only when this server
//! committed its row within `FRESH` with a last-seen time at most `FRESH` older than the
//! batch's; so `operations.last_seen_unix_nano` lags the spans by at most `FRESH`, which
//! only retention reads (days).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::rows::OperationRow;

/// How stale a stored operation's last-seen time may be, in span time and in wall time.
const FRESH: Duration = Duration::from_secs(60);

/// Operations remembered at most: past this the memory starts over.
const MAX_REMEMBERED: usize = 100_000;

type Key = (String, String, i16);

#[derive(Default)]
pub(crate) struct SeenOperations {
    /// Each operation's last-seen time as committed, and when.
    committed: Mutex<HashMap<Key, (i64, Instant)>>,
}

impl SeenOperations {
    /// Those of `operations` a batch must upsert: not committed by this server within
    /// `FRESH`, or seen more than `FRESH` after the time it committed.
    pub(crate) fn news(&self, operations: &[OperationRow]) -> Vec<OperationRow> {
        let committed = self.committed.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = i64::try_from(FRESH.as_nanos()).unwrap_or(i64::MAX);
        operations
            .iter()
            .filter(|(service, name, kind, last)| {
                let key = (service.clone(), name.clone(), *kind);
                committed.get(&key).is_none_or(|(stored, at)| {
                    at.elapsed() >= FRESH || *last > stored.saturating_add(fresh)
                })
            })
            .cloned()
            .collect()
    }

    /// `operations` were committed (by `news`'s batch).
    pub(crate) fn committed(&self, operations: &[OperationRow]) {
        let mut committed = self.committed.lock().unwrap_or_else(|e| e.into_inner());
        if committed.len() + operations.len() > MAX_REMEMBERED {
            committed.clear();
        }
        let now = Instant::now();
        for (service, name, kind, last) in operations {
            let entry = committed
                .entry((service.clone(), name.clone(), *kind))
                .or_insert((*last, now));
            // The stored time is the greatest ever upserted (`GREATEST`, `max`).
            *entry = ((*last).max(entry.0), now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(name: &str, last_s: i64) -> OperationRow {
        ("svc".into(), name.into(), 2, last_s * 1_000_000_000)
    }

    #[test]
    fn an_operation_is_upserted_again_only_with_news() {
        let seen = SeenOperations::default();
        let batch = [op("a", 100), op("b", 100)];
        assert_eq!(seen.news(&batch), batch.to_vec(), "never committed");
        seen.committed(&batch);
        assert!(seen.news(&batch).is_empty(), "committed just now");
        assert!(
            seen.news(&[op("a", 160)]).is_empty(),
            "a minute later in span time"
        );
        assert_eq!(seen.news(&[op("a", 161)]), [op("a", 161)], "past a minute");
        assert_eq!(
            seen.news(&[op("c", 100)]),
            [op("c", 100)],
            "another operation"
        );
        let other_kind = ("svc".to_string(), "a".to_string(), 3, 100_000_000_000);
        assert_eq!(seen.news(&[other_kind.clone()]), [other_kind]);
        // An older time committed later keeps the greatest, as the table does.
        seen.committed(&[op("a", 50)]);
        assert!(seen.news(&[op("a", 160)]).is_empty());
    }

    #[test]
    fn a_commit_older_than_a_minute_is_not_trusted() {
        let seen = SeenOperations::default();
        let batch = [op("a", 100)];
        seen.committed(&batch);
        {
            let mut committed = seen.committed.lock().unwrap();
            for (_, at) in committed.values_mut() {
                *at -= FRESH;
            }
        }
        assert_eq!(seen.news(&batch), batch.to_vec());
    }

    #[test]
    fn the_memory_starts_over_when_full() {
        let seen = SeenOperations::default();
        let many: Vec<OperationRow> = (0..MAX_REMEMBERED)
            .map(|i| op(&i.to_string(), 100))
            .collect();
        seen.committed(&many);
        assert!(seen.news(&many[..1]).is_empty());
        seen.committed(&[op("one more", 100)]);
        assert_eq!(seen.news(&many[..1]), many[..1].to_vec(), "forgotten");
        assert!(seen.news(&[op("one more", 100)]).is_empty());
    }
}

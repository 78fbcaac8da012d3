//! One budget of working memory (`--memory-limit`), shared by what grows with load: export
//! requests from their first body byte until their spans are committed, the committed
//! spans held for the analyzer (`crate::pipeline::held`, which only takes what is free), the
//! background analyzer's pass, and reads of whole traces (the trace page and APIs).
//!
//! Architecture invariant: ingest only ever *tries* to reserve, and a request that finds no
//! room is refused with a retryable status before more of it is read; the analyzer always
//! gets at least `MIN_PASS` (it shrinks its pass to what is free, never stops), so the
//! pool is exceeded by at most that much, plus a single trace larger than a whole pass.
//! A read of whole traces reserves what it will take before it reads a row, and is
//! refused when that is more than `READ_SHARE_DIVISOR` allows one read or than is free.
//! The figures below are measured by `cargo bench --bench memory` (BENCHMARKS.md, "Memory").

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

const MIB: u64 = 1 << 20;

/// Heap a request may take per byte of its (decompressed) body, held from decoding until
/// its spans are committed: the peak, while the body, its decoded form, the normalised
/// spans and the encoded rows are alive at once, measured 4.0–4.5 over protobuf and
/// 1.8–1.9 over JSON, with a margin.
pub const REQUEST_BYTES_PER_BODY_BYTE: u64 = 5;

/// Heap the analyzer's pass may take per byte of the span rows it reads: the rows, the
/// decoded spans, the analysis and the summaries; measured 4.0 at its peak, with a margin.
pub const PASS_BYTES_PER_ROW_BYTE: u64 = 5;

/// Heap a read of whole traces may take per byte of their rows, until its answer is built:
/// the spans, their analysis and the page or JSON text; the largest of the page, the API
/// and the Jaeger API by `cargo bench --bench memory`, with a margin.
pub const READ_BYTES_PER_ROW_BYTE: u64 = 10;

/// One read takes at most this share of the pool (1/4), so reads leave room for ingest and
/// the analyzer, and a larger trace is read in pieces or not at all.
const READ_SHARE_DIVISOR: u64 = 4;

/// What `--memory-limit` keeps aside for memory that does not grow with load: the
/// binary, thread stacks, SQLite's page caches and mapped pages, the allocator's slack.
pub const FIXED: u64 = 128 * MIB;

/// `--memory-limit`'s default.
pub const DEFAULT_LIMIT: u64 = 512 * MIB;

/// The smallest `--memory-limit` accepted.
pub const MIN_LIMIT: u64 = 256 * MIB;

/// The analyzer's pass takes at most this share of the pool (1/4) when the pool is free...
const PASS_SHARE_DIVISOR: u64 = 4;
/// ...and at least this much when ingest holds the rest, so analysis never stops.
pub const MIN_PASS: u64 = 4 * MIB;

/// The bytes working memory may take, and the bytes taken now.
#[derive(Debug)]
pub struct MemoryBudget {
    pool: u64,
    used: AtomicU64,
}

impl MemoryBudget {
    /// A budget for a process limited to `limit` bytes: the pool is what `FIXED` leaves.
    pub fn for_limit(limit: u64) -> Arc<MemoryBudget> {
        Self::with_pool(limit.saturating_sub(FIXED).max(MIN_PASS))
    }

    /// A budget whose pool is exactly `pool` bytes.
    pub fn with_pool(pool: u64) -> Arc<MemoryBudget> {
        Arc::new(MemoryBudget {
            pool,
            used: AtomicU64::new(0),
        })
    }

    pub fn pool(&self) -> u64 {
        self.pool
    }

    /// Bytes reserved now (may pass `pool` by what the analyzer is always given).
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// An empty reservation, to grow as a request's body arrives.
    pub fn empty(self: &Arc<Self>) -> Reservation {
        Reservation {
            budget: self.clone(),
            bytes: 0,
        }
    }

    /// Takes `bytes` if they fit in what is free.
    fn try_take(&self, bytes: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (used.saturating_add(bytes) <= self.pool).then_some(used + bytes)
            })
            .is_ok()
    }

    /// The most a pass of the analyzer is given: a quarter of the pool, at least `MIN_PASS`.
    pub fn max_pass(&self) -> u64 {
        (self.pool / PASS_SHARE_DIVISOR).max(MIN_PASS)
    }

    /// The analyzer's reservation for one pass: what is free, at most a quarter of the
    /// pool, at least `MIN_PASS` (taken even when ingest holds everything).
    pub fn reserve_pass(self: &Arc<Self>) -> Reservation {
        let share = self.max_pass();
        let mut taken = 0;
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                taken = self.pool.saturating_sub(used).clamp(MIN_PASS, share);
                Some(used + taken)
            });
        Reservation {
            budget: self.clone(),
            bytes: taken,
        }
    }
}

/// Why a read of whole traces was not given its memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadRefused {
    /// More than one read may ever take (`limit` bytes): reading it whole is refused.
    TooLarge { needs: u64, limit: u64 },
    /// Other work holds the memory now: retry later.
    Busy { needs: u64 },
}

impl MemoryBudget {
    /// The most one read of whole traces may take.
    pub fn read_limit(&self) -> u64 {
        self.pool / READ_SHARE_DIVISOR
    }

    /// Reserves a read of whole traces whose rows take `row_bytes`.
    pub fn reserve_read(self: &Arc<Self>, row_bytes: u64) -> Result<Reservation, ReadRefused> {
        let needs = row_bytes.saturating_mul(READ_BYTES_PER_ROW_BYTE);
        if needs > self.read_limit() {
            return Err(ReadRefused::TooLarge {
                needs,
                limit: self.read_limit(),
            });
        }
        let mut reservation = self.empty();
        match reservation.try_grow_to(needs) {
            true => Ok(reservation),
            false => Err(ReadRefused::Busy { needs }),
        }
    }
}

/// Bytes held in the budget until dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<MemoryBudget>,
    bytes: u64,
}

impl Reservation {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Grows the reservation to `total` bytes if the budget has room; false (unchanged)
    /// if it does not. Never shrinks.
    pub fn try_grow_to(&mut self, total: u64) -> bool {
        let more = total.saturating_sub(self.bytes);
        if more == 0 {
            return true;
        }
        if !self.budget.try_take(more) {
            return false;
        }
        self.bytes = total;
        true
    }

    /// Sets the reservation to `total` bytes whether or not they fit: memory already
    /// allocated (the analyzer's loaded pass) is accounted as it is.
    pub fn set(&mut self, total: u64) {
        if total > self.bytes {
            self.budget
                .used
                .fetch_add(total - self.bytes, Ordering::AcqRel);
        } else {
            self.budget
                .used
                .fetch_sub(self.bytes - total, Ordering::AcqRel);
        }
        self.bytes = total;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_take_only_what_is_free_and_give_it_back() {
        let budget = MemoryBudget::with_pool(100 * MIB);
        let mut a = budget.empty();
        assert!(a.try_grow_to(60 * MIB));
        let mut b = budget.empty();
        assert!(!b.try_grow_to(41 * MIB), "over the pool");
        assert_eq!(b.bytes(), 0, "a refused growth takes nothing");
        assert!(b.try_grow_to(40 * MIB));
        assert_eq!(budget.used(), 100 * MIB);
        assert!(
            a.try_grow_to(10 * MIB),
            "shrinking is never refused, and never done"
        );
        assert_eq!(a.bytes(), 60 * MIB);
        drop(a);
        assert_eq!(budget.used(), 40 * MIB);
        drop(b);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn the_analyzer_shrinks_its_pass_but_always_gets_its_minimum() {
        let budget = MemoryBudget::with_pool(400 * MIB);
        let pass = budget.reserve_pass();
        assert_eq!(pass.bytes(), 100 * MIB, "a quarter of a free pool");
        drop(pass);
        let mut ingest = budget.empty();
        assert!(ingest.try_grow_to(390 * MIB));
        let pass = budget.reserve_pass();
        assert_eq!(pass.bytes(), 10 * MIB, "what is free");
        drop(pass);
        assert!(ingest.try_grow_to(400 * MIB));
        let mut pass = budget.reserve_pass();
        assert_eq!(pass.bytes(), MIN_PASS, "the minimum, over the pool");
        assert_eq!(budget.used(), 400 * MIB + MIN_PASS);
        let mut late = budget.empty();
        assert!(
            !late.try_grow_to(1),
            "ingest refuses while the pool is over"
        );
        pass.set(MIB);
        assert_eq!(budget.used(), 401 * MIB);
        pass.set(30 * MIB);
        assert_eq!(
            budget.used(),
            430 * MIB,
            "a loaded pass is accounted as it is"
        );
        drop(pass);
        drop(ingest);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_read_takes_at_most_its_share_and_only_what_is_free() {
        let budget = MemoryBudget::with_pool(400 * MIB);
        let row_bytes = |bytes: u64| bytes / READ_BYTES_PER_ROW_BYTE;
        assert_eq!(
            budget.reserve_read(row_bytes(101 * MIB)).unwrap_err(),
            ReadRefused::TooLarge {
                needs: row_bytes(101 * MIB) * READ_BYTES_PER_ROW_BYTE,
                limit: 100 * MIB
            }
        );
        let mut ingest = budget.empty();
        assert!(ingest.try_grow_to(350 * MIB));
        let read = budget.reserve_read(row_bytes(48 * MIB)).unwrap();
        assert!(matches!(
            budget.reserve_read(row_bytes(10 * MIB)),
            Err(ReadRefused::Busy { .. })
        ));
        drop(read);
        drop(ingest);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn the_fixed_part_is_set_aside() {
        assert_eq!(MemoryBudget::for_limit(512 * MIB).pool(), 384 * MIB);
        assert_eq!(MemoryBudget::for_limit(MIB).pool(), MIN_PASS);
    }
}

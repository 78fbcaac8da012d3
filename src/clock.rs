//! The wall clock in unix nanoseconds: the one place the product reads it. Code that
//! decides something from the time (normalize, the analysis, alert evaluation) takes "now"
//! as an argument, so tests can pin it.

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in nanoseconds since the unix epoch (0 for a clock set before 1970).
pub fn now_unix_nano() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

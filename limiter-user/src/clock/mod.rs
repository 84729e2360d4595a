//! The wall clock, read one way everywhere: a clock set before 1970
//! reads as 0 rather than failing.

pub mod human;

use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch.
#[must_use]
pub fn unix_now() -> u64 {
    since_epoch().as_secs()
}

/// Milliseconds since the Unix epoch.
#[must_use]
pub fn unix_millis() -> u64 {
    u64::try_from(since_epoch().as_millis()).unwrap_or(u64::MAX)
}

/// Time since the Unix epoch (zero for a clock set before it).
#[must_use]
pub fn since_epoch() -> std::time::Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default()
}

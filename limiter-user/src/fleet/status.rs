//! What the sync reports: `limiter fleet status` and the metrics.

use redis::RedisError;
use serde::{Deserialize, Serialize};

/// Why a sync failed (bounded metric labels).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncError {
    Timeout,
    Connection,
    Server,
}

impl SyncError {
    pub const ALL: [SyncError; 3] = [SyncError::Timeout, SyncError::Connection, SyncError::Server];

    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            SyncError::Timeout => "timeout",
            SyncError::Connection => "connection",
            SyncError::Server => "server",
        }
    }

    pub(super) fn of(e: &RedisError) -> Self {
        if e.is_timeout() {
            SyncError::Timeout
        } else if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
            SyncError::Connection
        } else {
            SyncError::Server
        }
    }
}

/// What `limiter fleet status` and the metrics show.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct FleetStatus {
    pub node: String,
    pub store: Vec<String>,
    pub cluster: bool,
    pub sync_interval_ms: u64,
    pub store_up: bool,
    /// Nodes whose heartbeat is at most 10 sync intervals (and 5 s) old.
    pub nodes_seen: Vec<String>,
    pub last_sync_unix_ms: Option<u64>,
    pub syncs: u64,
    /// Failed syncs by [`SyncError`] in its `ALL` order.
    pub errors: [u64; 3],
    pub outages: u64,
    /// Seconds the store was down, finished outages.
    pub outage_secs_total: f64,
    /// Unix ms the current outage began.
    pub down_since_unix_ms: Option<u64>,
    pub last_latency_ms: f64,
    pub max_latency_ms: f64,
    /// The latest sync latencies, oldest first (at most `RECENT`).
    pub recent_latency_ms: Vec<f64>,
    pub latency_sum_secs: f64,
    pub prefixes_pushed_total: u64,
    pub commands_total: u64,
    pub request_bytes_total: u64,
    pub pending: usize,
    /// Prefixes near their limit, read back every sync.
    pub hot: usize,
    pub remembered: usize,
    pub dropped: u64,
}

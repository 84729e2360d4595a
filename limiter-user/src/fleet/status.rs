//! What the sync reports: `limiter fleet status` and the metrics.

use redis::RedisError;

use super::RECENT;
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

/// What one successful sync reports.
pub(super) struct SyncedRound {
    pub wall_ns: u64,
    pub latency: std::time::Duration,
    /// Prefixes pushed.
    pub pushed: usize,
    pub commands: usize,
    /// Request bytes.
    pub bytes: usize,
    /// Heartbeats read back, if they were.
    pub nodes: Option<Vec<(String, u64)>>,
    pub interval: std::time::Duration,
    pub cluster: bool,
}

impl FleetStatus {
    /// A sync succeeded: the store is up (logged when it was not), and the
    /// round's figures are added.
    pub(super) fn synced(&mut self, r: SyncedRound) {
        let s = self;
        if !s.store_up {
            if let Some(since) = s.down_since_unix_ms.take() {
                #[expect(clippy::cast_precision_loss, reason = "milliseconds of an outage")]
                let secs = (r.wall_ns / 1_000_000).saturating_sub(since) as f64 / 1e3;
                s.outage_secs_total += secs;
                tracing::info!(
                    event = "fleet_store",
                    up = true,
                    outage_secs = secs,
                    "limiter: fleet store {} is back after {secs:.1} s; pushed {} prefixes",
                    s.store.join(","),
                    r.pushed
                );
            } else {
                tracing::info!(
                    event = "fleet_store",
                    up = true,
                    cluster = r.cluster,
                    "limiter: fleet store {} reached",
                    s.store.join(",")
                );
            }
        }
        s.store_up = true;
        s.syncs += 1;
        s.last_sync_unix_ms = Some(r.wall_ns / 1_000_000);
        let ms = r.latency.as_secs_f64() * 1e3;
        s.last_latency_ms = ms;
        s.max_latency_ms = s.max_latency_ms.max(ms);
        if s.recent_latency_ms.len() == RECENT {
            s.recent_latency_ms.remove(0);
        }
        s.recent_latency_ms.push(ms);
        s.latency_sum_secs += r.latency.as_secs_f64();
        s.prefixes_pushed_total += r.pushed as u64;
        s.commands_total += r.commands as u64;
        s.request_bytes_total += r.bytes as u64;
        if let Some(nodes) = r.nodes {
            let fresh = (10 * u64::try_from(r.interval.as_millis()).unwrap_or(0)).max(5_000);
            let now = r.wall_ns / 1_000_000;
            s.nodes_seen = nodes.into_iter().filter(|(_, t)| now.saturating_sub(*t) <= fresh).map(|(n, _)| n).collect();
            s.nodes_seen.sort();
        }
    }
}

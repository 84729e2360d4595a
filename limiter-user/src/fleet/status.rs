//! What the sync reports: `limiter fleet status` and the metrics.

use redis::RedisError;
use serde::{Deserialize, Serialize};

use super::RECENT;

/// Why a sync failed (bounded metric labels).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncError {
    Timeout,
    Connection,
    Server,
    /// The store wants a password (`NOAUTH`) or refuses the one given
    /// (`WRONGPASS`).
    Auth,
}

impl crate::counts::Kinds<4> for SyncError {
    const ALL: [Self; 4] = SyncError::ALL;
}

/// Failed syncs, by what failed.
pub type SyncErrors = crate::counts::Counts<SyncError, 4>;

impl SyncError {
    pub const ALL: [SyncError; 4] = [SyncError::Timeout, SyncError::Connection, SyncError::Server, SyncError::Auth];

    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            SyncError::Timeout => "timeout",
            SyncError::Connection => "connection",
            SyncError::Server => "server",
            SyncError::Auth => "auth",
        }
    }

    /// What to do about it, for the log line.
    #[must_use]
    pub fn remedy(self, e: &RedisError) -> String {
        match (self, e.to_string().contains("NOAUTH")) {
            (SyncError::Auth, true) => {
                "the store requires a password (NOAUTH): give it in a file named by fleet.password_file".into()
            }
            (SyncError::Auth, _) => {
                "the store refused the password (WRONGPASS): check the file named by fleet.password_file".into()
            }
            _ => e.to_string(),
        }
    }

    pub(super) fn of(e: &RedisError) -> Self {
        // A pipeline's error lists each command's (no code of its own).
        let text = e.to_string();
        if matches!(e.code(), Some("NOAUTH" | "WRONGPASS")) || text.contains("NOAUTH") || text.contains("WRONGPASS") {
            SyncError::Auth
        } else if e.is_timeout() {
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
    /// Failed syncs by [`SyncError`].
    pub errors: SyncErrors,
    /// This node's clock's offset from the store's, in ms.
    #[serde(default)]
    pub clock_offset_ms: i64,
    /// Nodes (this one included) more than one slice of the finest fleet
    /// class off the store's clock, with their offsets in ms.
    #[serde(default)]
    pub skewed: Vec<(String, i64)>,
    /// Fields in the store's heartbeat hash (a huge one is read one page
    /// at a time, never whole).
    #[serde(default)]
    pub heartbeat_fields: u64,
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
    /// The nodes seen (fresh heartbeats, this one included) and the
    /// heartbeat hash's size, if they were read back.
    pub nodes: Option<(Vec<String>, u64)>,
}

impl FleetStatus {
    /// A sync succeeded: the store is up (logged when it was not), and the
    /// round's figures are added.
    pub(super) fn synced(&mut self, r: SyncedRound) {
        if !self.store_up {
            if let Some(since) = self.down_since_unix_ms.take() {
                #[expect(clippy::cast_precision_loss, reason = "milliseconds of an outage")]
                let secs = (r.wall_ns / 1_000_000).saturating_sub(since) as f64 / 1e3;
                self.outage_secs_total += secs;
                tracing::info!(
                    event = "fleet_store",
                    up = true,
                    outage_secs = secs,
                    "limiter: fleet store {} is back after {secs:.1} s; pushed {} prefixes",
                    self.store.join(","),
                    r.pushed
                );
            } else {
                tracing::info!(
                    event = "fleet_store",
                    up = true,
                    cluster = self.cluster,
                    "limiter: fleet store {} reached",
                    self.store.join(",")
                );
            }
        }
        self.store_up = true;
        self.syncs += 1;
        self.last_sync_unix_ms = Some(r.wall_ns / 1_000_000);
        let ms = r.latency.as_secs_f64() * 1e3;
        self.last_latency_ms = ms;
        self.max_latency_ms = self.max_latency_ms.max(ms);
        if self.recent_latency_ms.len() == RECENT {
            self.recent_latency_ms.remove(0);
        }
        self.recent_latency_ms.push(ms);
        self.latency_sum_secs += r.latency.as_secs_f64();
        self.prefixes_pushed_total += r.pushed as u64;
        self.commands_total += r.commands as u64;
        self.request_bytes_total += r.bytes as u64;
        if let Some((nodes, fields)) = r.nodes {
            self.nodes_seen = nodes;
            self.nodes_seen.sort();
            self.heartbeat_fields = fields;
        }
    }
}

//! A forwarder's state, as `status` answers it.

use serde::{Deserialize, Serialize};

/// A forwarder's state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForwardInfo {
    pub name: String,
    pub listening: Vec<String>,
    pub bind_errors: Vec<String>,
    pub active: u64,
    pub accepted: u64,
    pub completed: u64,
    /// (reason, connections closed at accept).
    pub shed: Vec<(String, u64)>,
    /// (criticality, connections let in, connections shed at accept).
    #[serde(default)]
    pub by_criticality: Vec<(String, u64, u64)>,
    /// Connections closed because every backend failed.
    #[serde(rename = "upstream_failed")]
    pub backend_failed: u64,
    #[serde(rename = "upstream_connect_failures")]
    pub backend_connect_failures: u64,
    /// Connections that failed for a local reason (EMFILE, ENFILE,
    /// ENOBUFS, ENOMEM), not held against a backend.
    #[serde(default)]
    pub local_errors: u64,
    /// (address, in service).
    #[serde(rename = "upstreams")]
    pub backends: Vec<(String, bool)>,
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// Adaptive throttling's window, when on.
    #[serde(default)]
    pub adaptive: Option<AdaptiveInfo>,
}

/// A forwarder's adaptive throttling now: the window's requests (its
/// own refusals included) and the backends' accepts, and the
/// probability a new connection is refused.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AdaptiveInfo {
    pub requests: u64,
    pub accepts: u64,
    pub refuse_probability: f64,
    pub k: f64,
    pub window_secs: u64,
    /// In the answer to `POST /v1/load`: how many of the reported
    /// rejections counted (at most the connections resolved in the window
    /// that no report matched yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counted: Option<u64>,
}

/// Compared by value, floats bit for bit (a report is compared whole).
impl PartialEq for AdaptiveInfo {
    fn eq(&self, o: &Self) -> bool {
        (self.requests, self.accepts, self.window_secs) == (o.requests, o.accepts, o.window_secs)
            && self.refuse_probability.to_bits() == o.refuse_probability.to_bits()
            && self.k.to_bits() == o.k.to_bits()
    }
}

impl Eq for AdaptiveInfo {}

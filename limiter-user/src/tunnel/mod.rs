//! Forwarding at the driver: the policy's `[[tunnel]]` sections
//! ([`section`]), each a destination whose admitted packets the program
//! wraps (IPIP, FOU or GUE) to one of a pool of backends picked by a
//! Maglev table ([`maglev`]) and a connection table, and sends out
//! without the host's stack (`limiter-ebpf`'s `tunnel.rs`). The daemon's
//! part ([`feature`]): the maps ([`maps`]), the health checks
//! ([`health`]), the operator's drains, the series ([`series`]) and
//! `limiter backend list|drain|undrain`. See `docs/tunnel.md`.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

pub mod feature;
pub mod health;
pub mod maglev;
pub mod maps;
pub mod section;
pub mod series;

/// `limiter backend list`'s answer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TunnelsInfo {
    pub tunnels: Vec<TunnelRow>,
    /// Packets of the services not forwarded, by
    /// `limiter_common::tunnel::outcome`.
    pub outcomes: Vec<u64>,
}

/// One tunnel and its backends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TunnelRow {
    pub name: String,
    pub address: IpAddr,
    pub protocol: section::Transport,
    pub ports: (u16, u16),
    pub backends: Vec<BackendRow>,
}

/// One backend: `up`, `down` (its health check fails) or `drained`, and
/// what the program forwarded to it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendRow {
    pub address: IpAddr,
    pub weight: u32,
    pub state: String,
    pub packets: u64,
    pub bytes: u64,
    /// Its last failed check's error, while it has one.
    pub error: Option<String>,
}

/// One backend in `limiter top`: what the program forwarded to it in
/// the last second.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendRate {
    pub tunnel: String,
    pub backend: IpAddr,
    /// `up`, `down` or `drained`.
    pub state: String,
    pub packets_per_sec: u64,
    /// Bytes of the inner packets.
    pub bytes_per_sec: u64,
}

/// The names of `limiter_common::tunnel::outcome`, by index.
pub const OUTCOMES: [&str; 5] = ["no_backend", "too_big", "unroutable", "unread", "no_room"];

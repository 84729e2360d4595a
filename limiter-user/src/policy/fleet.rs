//! `[fleet]`: the shared store that keeps window quotas of `scope =
//! "fleet"` across every edge host.
//!
//! ```toml
//! [fleet]
//! store = ["redis://10.0.0.5:6379"]  # one Redis; several addresses: a Redis Cluster's nodes
//! node = "edge-1"                    # this host's name in the fleet (default: the host name)
//! nodes = 8                          # the fleet's size (on_store_failure = "split" divides by it)
//! sync_interval = "200ms"            # push local counts, pull the fleet's, every interval
//! timeout = "1s"                     # a sync slower than this counts as the store being down
//! ```
//!
//! Unix sockets: `redis+unix:///run/redis/redis.sock`.

use std::time::Duration;

use serde::Deserialize;

use super::{PolicyError, bad, duration};

/// The fleet's store and this node's place in it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fleet {
    pub store: Vec<String>,
    #[serde(default = "defaults::node")]
    pub node: String,
    #[serde(default = "defaults::nodes")]
    pub nodes: u32,
    #[serde(default = "defaults::sync_interval", deserialize_with = "duration")]
    pub sync_interval: Duration,
    #[serde(default = "defaults::timeout", deserialize_with = "duration")]
    pub timeout: Duration,
}

mod defaults {
    use std::time::Duration;

    pub fn node() -> String {
        std::fs::read_to_string("/proc/sys/kernel/hostname").map_or_else(|_| "node".into(), |h| h.trim().to_owned())
    }
    pub const fn nodes() -> u32 {
        1
    }
    pub const fn sync_interval() -> Duration {
        Duration::from_millis(200)
    }
    pub const fn timeout() -> Duration {
        Duration::from_secs(1)
    }
}

/// Most store addresses (a cluster's seed nodes).
pub const MAX_STORES: usize = 16;

impl Fleet {
    /// A cluster when several addresses are given.
    #[must_use]
    pub fn is_cluster(&self) -> bool {
        self.store.len() > 1
    }
}

/// Check the section.
pub fn check(f: &Fleet) -> Result<(), PolicyError> {
    if f.store.is_empty() || f.store.len() > MAX_STORES {
        return Err(bad("fleet.store", format!("give 1 to {MAX_STORES} addresses")));
    }
    for a in &f.store {
        let ok = a.starts_with("redis://") || a.starts_with("redis+unix://") || a.starts_with("unix://");
        if !ok || redis::parse_redis_url(a).is_none() {
            return Err(bad("fleet.store", format!("{a:?} is not a redis://host:port or redis+unix:///path address")));
        }
        if f.store.len() > 1 && !a.starts_with("redis://") {
            return Err(bad("fleet.store", "a Redis Cluster's nodes are redis://host:port addresses"));
        }
    }
    if f.node.is_empty()
        || f.node.len() > 64
        || !f.node.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        return Err(bad("fleet.node", "1 to 64 letters, digits, '-', '_' or '.'"));
    }
    if !(1..=1024).contains(&f.nodes) {
        return Err(bad("fleet.nodes", "1 to 1024"));
    }
    if !(Duration::from_millis(10)..=Duration::from_mins(1)).contains(&f.sync_interval) {
        return Err(bad("fleet.sync_interval", "10ms to 60s"));
    }
    if !(Duration::from_millis(10)..=Duration::from_mins(1)).contains(&f.timeout) {
        return Err(bad("fleet.timeout", "10ms to 60s"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_names_and_intervals_are_checked() {
        let good = Fleet {
            store: vec!["redis://127.0.0.1:6379".into()],
            node: "edge-1".into(),
            nodes: 8,
            sync_interval: Duration::from_millis(200),
            timeout: Duration::from_secs(1),
        };
        assert_eq!(check(&good), Ok(()));
        assert!(!good.is_cluster());
        let unix = Fleet { store: vec!["redis+unix:///run/redis.sock".into()], ..good.clone() };
        assert_eq!(check(&unix), Ok(()));
        for (f, field) in [
            (Fleet { store: vec![], ..good.clone() }, "fleet.store"),
            (Fleet { store: vec!["http://x".into()], ..good.clone() }, "fleet.store"),
            (Fleet { store: vec!["redis+unix:///a".into(), "redis://b:1".into()], ..good.clone() }, "fleet.store"),
            (Fleet { node: "a b".into(), ..good.clone() }, "fleet.node"),
            (Fleet { nodes: 0, ..good.clone() }, "fleet.nodes"),
            (Fleet { sync_interval: Duration::from_millis(1), ..good.clone() }, "fleet.sync_interval"),
        ] {
            assert_eq!(check(&f).unwrap_err().field, field, "{f:?}");
        }
    }
}

//! `[[forward]]` sections: the daemon accepts what XDP let through on a
//! public address and splices each connection to the tenant layer behind
//! a PROXY protocol header, shedding at declared caps at accept time.
//!
//! ```toml
//! [[forward]]
//! name = "https"
//! listen = ["198.18.0.2:443", "[2001:2::2]:443"]
//! upstreams = ["127.0.0.1:8443", "127.0.0.1:8444"]   # its backends
//! balance = "round_robin"          # or "least_connections"
//! proxy_protocol = "v2"            # or "v1", "off"
//! max_connections = 10000
//! max_connections_per_prefix = 200 # per source prefix, the policy's lengths
//! connect_timeout = "2s"
//! idle_timeout = "60s"
//! drain_timeout = "10s"
//! adaptive_k = 2.0                 # adaptive throttling toward the backends; 0 = off
//! adaptive_window = "2m"
//! critical_reserve = 0.1           # of max_connections, for critical connections only
//! sheddable_share = 0.8            # of max_connections, at most, for sheddable ones
//! ```

use std::{net::SocketAddr, time::Duration};

use serde::{Deserialize, Serialize};

use super::{PolicyError, bad};

/// How a forwarder picks a backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Balance {
    #[default]
    RoundRobin,
    LeastConnections,
}

/// The header that tells the backend who the client is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProxyProtocol {
    #[default]
    V2,
    V1,
    Off,
}

/// How a forwarder moves bytes between a client and its backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Copy {
    /// Copied while small; `splice(2)` through a pipe per direction
    /// while a direction carries bulk (a read filled the buffer), so the
    /// bytes of a long transfer stay in the kernel (up to 4 more
    /// descriptors a connection).
    #[default]
    Splice,
    /// `recv`/`send` through the runtime thread's 16 KiB buffer, always.
    Buffer,
}

/// One forwarder.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Forward {
    /// Names it in metrics and status (bounded by the policy, never by
    /// traffic); default `forward[N]`.
    #[serde(default)]
    pub name: String,
    pub listen: Vec<SocketAddr>,
    /// Its backends (the file's `upstreams`).
    #[serde(rename = "upstreams")]
    pub backends: Vec<SocketAddr>,
    #[serde(default)]
    pub balance: Balance,
    #[serde(default)]
    pub proxy_protocol: ProxyProtocol,
    #[serde(default = "defaults::max_connections")]
    pub max_connections: usize,
    /// 0 = no per-prefix cap.
    #[serde(default)]
    pub max_connections_per_prefix: usize,
    #[serde(
        default = "defaults::connect",
        deserialize_with = "super::duration",
        serialize_with = "super::duration_out"
    )]
    pub connect_timeout: Duration,
    #[serde(default = "defaults::idle", deserialize_with = "super::duration", serialize_with = "super::duration_out")]
    pub idle_timeout: Duration,
    #[serde(default = "defaults::drain", deserialize_with = "super::duration", serialize_with = "super::duration_out")]
    pub drain_timeout: Duration,
    #[serde(default)]
    pub copy: Copy,
    /// Client-side adaptive throttling: refuse new connections once the
    /// window's requests pass K times the backends' accepts (0 = off).
    #[serde(default = "defaults::adaptive_k")]
    pub adaptive_k: Ratio,
    #[serde(
        default = "defaults::adaptive_window",
        deserialize_with = "super::duration",
        serialize_with = "super::duration_out"
    )]
    pub adaptive_window: Duration,
    /// The share of `max_connections` kept for critical connections.
    #[serde(default = "defaults::critical_reserve")]
    pub critical_reserve: Ratio,
    /// The share of `max_connections` sheddable connections may hold.
    #[serde(default = "defaults::sheddable_share")]
    pub sheddable_share: Ratio,
}

/// A ratio read as a TOML number, compared by value (so a forwarder's
/// settings stay `Eq`: an unchanged forwarder keeps running on reload).
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Ratio(pub f64);

impl PartialEq for Ratio {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for Ratio {}

/// Defaults of a `[[forward]]` section.
pub mod defaults {
    use std::time::Duration;

    #[must_use]
    pub const fn max_connections() -> usize {
        10_000
    }
    #[must_use]
    pub const fn connect() -> Duration {
        Duration::from_secs(2)
    }
    #[must_use]
    pub const fn idle() -> Duration {
        Duration::from_mins(1)
    }
    #[must_use]
    pub const fn drain() -> Duration {
        Duration::from_secs(10)
    }
    #[must_use]
    pub const fn adaptive_k() -> super::Ratio {
        super::Ratio(2.0)
    }
    #[must_use]
    pub const fn adaptive_window() -> Duration {
        Duration::from_mins(2)
    }
    #[must_use]
    pub const fn critical_reserve() -> super::Ratio {
        super::Ratio(0.1)
    }
    #[must_use]
    pub const fn sheddable_share() -> super::Ratio {
        super::Ratio(0.8)
    }
}

/// Most forwarders in one policy, and listen addresses in one forwarder.
pub const MAX_FORWARDS: usize = 16;
pub const MAX_LISTEN: usize = 16;
pub const MAX_BACKENDS: usize = 64;

/// Names default to `forward[N]`.
pub fn name_defaults(forwards: &mut [Forward]) {
    for (i, f) in forwards.iter_mut().enumerate() {
        if f.name.is_empty() {
            f.name = format!("forward[{i}]");
        }
    }
}

/// Check the forwarders.
pub fn check(forwards: &[Forward]) -> Result<(), PolicyError> {
    if forwards.len() > MAX_FORWARDS {
        return Err(bad("forward", format!("{} forwarders, at most {MAX_FORWARDS}", forwards.len())));
    }
    let mut seen_listen = std::collections::HashSet::new();
    let mut seen_names = std::collections::HashSet::new();
    for (i, f) in forwards.iter().enumerate() {
        let at = |field: &str| format!("forward[{i}].{field}");
        if !seen_names.insert(f.name.clone()) {
            return Err(bad(at("name"), format!("{:?} is used twice", f.name)));
        }
        if f.listen.is_empty() || f.listen.len() > MAX_LISTEN {
            return Err(bad(at("listen"), format!("give 1 to {MAX_LISTEN} addresses")));
        }
        for a in &f.listen {
            if !seen_listen.insert(*a) {
                return Err(bad(at("listen"), format!("{a} is listened on twice")));
            }
        }
        if f.backends.is_empty() || f.backends.len() > MAX_BACKENDS {
            return Err(bad(at("upstreams"), format!("give 1 to {MAX_BACKENDS} addresses")));
        }
        if f.max_connections == 0 {
            return Err(bad(at("max_connections"), "must be at least 1"));
        }
        if f.max_connections_per_prefix > f.max_connections {
            return Err(bad(at("max_connections_per_prefix"), "is above max_connections"));
        }
        for (field, d) in [("connect_timeout", f.connect_timeout), ("drain_timeout", f.drain_timeout)] {
            if d.is_zero() {
                return Err(bad(at(field), "must be above 0"));
            }
        }
        if f.idle_timeout.is_zero() {
            return Err(bad(at("idle_timeout"), "must be above 0"));
        }
        let k = f.adaptive_k.0;
        if !(k == 0.0 || (1.0..=100.0).contains(&k)) {
            return Err(bad(at("adaptive_k"), "must be 0 (off) or from 1 to 100"));
        }
        if !(Duration::from_secs(1)..=Duration::from_hours(1)).contains(&f.adaptive_window) {
            return Err(bad(at("adaptive_window"), "must be from 1s to 1h"));
        }
        if !(0.0..1.0).contains(&f.critical_reserve.0) {
            return Err(bad(at("critical_reserve"), "must be from 0 to below 1"));
        }
        if !(f.sheddable_share.0 > 0.0 && f.sheddable_share.0 <= 1.0) {
            return Err(bad(at("sheddable_share"), "must be above 0 and at most 1"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::parse_duration;

    fn one(text: &str) -> Result<Vec<Forward>, PolicyError> {
        #[derive(Deserialize)]
        struct Doc {
            forward: Vec<Forward>,
        }
        let mut f = toml::from_str::<Doc>(text).map_err(|e| bad("forward", e.to_string()))?.forward;
        name_defaults(&mut f);
        check(&f)?;
        Ok(f)
    }

    #[test]
    fn durations_read_with_their_unit() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_mins(10)));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("fast").is_err());
    }

    #[test]
    fn a_forwarder_gets_defaults_and_bad_fields_are_named() {
        let f = one("[[forward]]\nlisten = [\"198.18.0.2:443\"]\nupstreams = [\"127.0.0.1:8443\"]\n").unwrap();
        assert_eq!(f[0].name, "forward[0]");
        assert_eq!((f[0].proxy_protocol, f[0].balance), (ProxyProtocol::V2, Balance::RoundRobin));
        assert_eq!((f[0].max_connections, f[0].connect_timeout), (10_000, Duration::from_secs(2)));
        let e = one("[[forward]]\nlisten = []\nupstreams = [\"127.0.0.1:1\"]\n").unwrap_err();
        assert_eq!(e.field, "forward[0].listen");
        let e = one("[[forward]]\nlisten = [\"198.18.0.2:1\"]\nupstreams = [\"127.0.0.1:1\"]\nmax_connections = 5\nmax_connections_per_prefix = 6\n").unwrap_err();
        assert_eq!(e.field, "forward[0].max_connections_per_prefix");
        assert_eq!((f[0].adaptive_k, f[0].adaptive_window), (Ratio(2.0), Duration::from_mins(2)));
        for bad_k in ["0.5", "-1.0", "nan", "1000.0"] {
            let e = one(&format!(
                "[[forward]]\nlisten = [\"198.18.0.2:1\"]\nupstreams = [\"127.0.0.1:1\"]\nadaptive_k = {bad_k}\n"
            ))
            .unwrap_err();
            assert_eq!(e.field, "forward[0].adaptive_k", "{bad_k}");
        }
    }
}

//! `[feedback]`: the tenant layer's way to push penalties back without a
//! shell (`POST /v1/penalties` on localhost, with a bearer token), under
//! a governor that caps what automation may do.
//!
//! ```toml
//! [feedback]
//! listen = "127.0.0.1:9465"                  # loopback only
//! token_file = "/etc/limiter/feedback.token" # the bearer token, one line
//! max_denied = 1000                          # prefixes denied by feedback at once
//! min_v4_prefix = 16                         # nothing wider from a tenant
//! min_v6_prefix = 32
//! max_ttl = "1h"                             # every penalty expires, at most this late
//! shadow = false                             # true: decisions are listed and logged, not enforced
//!
//! [feedback.escalate]                        # optional, off when absent
//! drops_per_sec = 5000                       # a proven address rate-limited above this ...
//! sustained = "10s"                          # ... for this long ...
//! deny_for = "10m"                           # ... is denied this long, under the same governor
//! deny_v4_prefix = 32                        # the network denied: the address itself by default
//! deny_v6_prefix = 128
//! ```

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use serde::{Deserialize, Serialize};

use super::{PolicyError, bad, duration, duration_out};

/// The feedback endpoint and its governor.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Feedback {
    pub listen: SocketAddr,
    pub token_file: PathBuf,
    #[serde(default = "defaults::max_denied")]
    pub max_denied: usize,
    #[serde(default = "defaults::min_v4")]
    pub min_v4_prefix: u8,
    #[serde(default = "defaults::min_v6")]
    pub min_v6_prefix: u8,
    #[serde(default = "defaults::max_ttl", deserialize_with = "duration", serialize_with = "duration_out")]
    pub max_ttl: Duration,
    #[serde(default)]
    pub shadow: bool,
    /// Whether a penalty may overlay an operator's or the file's `allow`
    /// (refused with 409 otherwise).
    #[serde(default)]
    pub may_override_allow: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalate: Option<Escalate>,
}

/// Automatic escalation: a proven address whose packets its bucket drops
/// more than `drops_per_sec` (estimated from the sampled drops) in each
/// second of `sustained` is denied for `deny_for`, as if the tenant layer
/// had asked: the address itself (its network of `deny_v4_prefix` or
/// `deny_v6_prefix` bits, the drops of its proven addresses together),
/// never the bucket it shares with its neighbours.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Escalate {
    pub drops_per_sec: u64,
    #[serde(deserialize_with = "duration", serialize_with = "duration_out")]
    pub sustained: Duration,
    #[serde(deserialize_with = "duration", serialize_with = "duration_out")]
    pub deny_for: Duration,
    /// Prefixes denied by escalation at once: a cap of its own, so that
    /// escalations never spend the tenant's `max_denied`.
    #[serde(default = "defaults::escalate_max_denied")]
    pub max_denied: usize,
    /// The network escalation denies around a proven address.
    #[serde(default = "defaults::deny_v4")]
    pub deny_v4_prefix: u8,
    #[serde(default = "defaults::deny_v6")]
    pub deny_v6_prefix: u8,
}

impl Escalate {
    /// The network denied for `addr` (its drops counted together).
    #[must_use]
    pub fn unit(&self, addr: std::net::IpAddr) -> ipnet::IpNet {
        let len = if addr.is_ipv4() { self.deny_v4_prefix.min(32) } else { self.deny_v6_prefix.min(128) };
        ipnet::IpNet::new(addr, len).map_or_else(|_| ipnet::IpNet::from(addr), |n| n.trunc())
    }
}

mod defaults {
    use std::time::Duration;

    pub const fn max_denied() -> usize {
        1000
    }
    pub const fn min_v4() -> u8 {
        16
    }
    pub const fn min_v6() -> u8 {
        32
    }
    pub const fn escalate_max_denied() -> usize {
        100
    }
    pub const fn deny_v4() -> u8 {
        32
    }
    pub const fn deny_v6() -> u8 {
        128
    }
    pub const fn max_ttl() -> Duration {
        Duration::from_hours(1)
    }
}

/// Check the section (the token file is read when the daemon starts).
pub fn check(f: &Feedback) -> Result<(), PolicyError> {
    if !f.listen.ip().is_loopback() {
        return Err(bad("feedback.listen", format!("{} is not a loopback address", f.listen.ip())));
    }
    if f.max_denied == 0 {
        return Err(bad("feedback.max_denied", "must be at least 1"));
    }
    if f.min_v4_prefix > 32 || f.min_v6_prefix > 128 {
        return Err(bad("feedback.min_v4_prefix", "longer than the address"));
    }
    if f.max_ttl.as_secs() == 0 {
        return Err(bad("feedback.max_ttl", "must be at least 1s"));
    }
    if let Some(e) = &f.escalate {
        let sample = u64::from(limiter_common::DROP_SAMPLE);
        if e.drops_per_sec < sample {
            return Err(bad(
                "feedback.escalate.drops_per_sec",
                format!("below {sample}, the sampling step of drops (one in {sample} is seen)"),
            ));
        }
        if !(1..=3600).contains(&e.sustained.as_secs()) {
            return Err(bad("feedback.escalate.sustained", "give 1s to 1h"));
        }
        if e.deny_for.as_secs() == 0 || e.deny_for > f.max_ttl {
            return Err(bad("feedback.escalate.deny_for", "must be at least 1s and at most feedback.max_ttl"));
        }
        if e.max_denied == 0 {
            return Err(bad("feedback.escalate.max_denied", "must be at least 1"));
        }
        if !(f.min_v4_prefix..=32).contains(&e.deny_v4_prefix) {
            return Err(bad(
                "feedback.escalate.deny_v4_prefix",
                format!("give {} (feedback.min_v4_prefix) to 32", f.min_v4_prefix),
            ));
        }
        if !(f.min_v6_prefix..=128).contains(&e.deny_v6_prefix) {
            return Err(bad(
                "feedback.escalate.deny_v6_prefix",
                format!("give {} (feedback.min_v6_prefix) to 128", f.min_v6_prefix),
            ));
        }
    }
    Ok(())
}

/// Why the governor refused a penalty.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Not a CIDR, or no TTL.
    BadRequest,
    /// Wider than the minimum prefix length allows.
    TooWide,
    /// A TTL past `max_ttl`.
    TtlTooLong,
    /// `max_denied` prefixes are denied by this kind of automation already.
    Cap,
    /// Inside an `allow` of the operator or the policy file (and
    /// `may_override_allow` is not set).
    Allowed,
}

impl crate::counts::Kinds<5> for Refusal {
    const ALL: [Self; 5] = Refusal::ALL;
}

/// Refusals of the governor, by why.
pub type Refusals = crate::counts::Counts<Refusal, 5>;

impl Refusal {
    pub const ALL: [Refusal; 5] =
        [Refusal::BadRequest, Refusal::TooWide, Refusal::TtlTooLong, Refusal::Cap, Refusal::Allowed];

    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Refusal::BadRequest => "bad_request",
            Refusal::TooWide => "too_wide",
            Refusal::TtlTooLong => "ttl_too_long",
            Refusal::Cap => "cap",
            Refusal::Allowed => "allowed",
        }
    }
}

impl Feedback {
    /// The governor's check of one penalty on `net` for `ttl` seconds,
    /// `denied` prefixes being denied by the same kind of automation now
    /// (this one not counted if it is among them: a refresh) against its
    /// `cap`; `allowed` when an operator's or the file's `allow` holds it.
    pub fn govern(
        &self,
        net: &ipnet::IpNet,
        ttl: u64,
        denied: usize,
        cap: usize,
        allowed: bool,
    ) -> Result<(), Refusal> {
        if allowed && !self.may_override_allow {
            return Err(Refusal::Allowed);
        }
        let min = if net.addr().is_ipv4() { self.min_v4_prefix } else { self.min_v6_prefix };
        if net.prefix_len() < min {
            return Err(Refusal::TooWide);
        }
        if ttl == 0 {
            return Err(Refusal::BadRequest);
        }
        if ttl > self.max_ttl.as_secs() {
            return Err(Refusal::TtlTooLong);
        }
        if denied >= cap {
            return Err(Refusal::Cap);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn governor() -> Feedback {
        Feedback {
            listen: "127.0.0.1:9465".parse().unwrap(),
            token_file: "/dev/null".into(),
            max_denied: 2,
            min_v4_prefix: 16,
            min_v6_prefix: 32,
            max_ttl: Duration::from_mins(10),
            shadow: false,
            may_override_allow: false,
            escalate: None,
        }
    }

    #[test]
    fn the_governor_refuses_wide_prefixes_long_ttls_and_past_its_cap() {
        let g = governor();
        let net = |s: &str| s.parse::<ipnet::IpNet>().unwrap();
        assert_eq!(g.govern(&net("198.18.5.0/24"), 60, 0, 2, false), Ok(()));
        assert_eq!(g.govern(&net("198.0.0.0/8"), 60, 0, 2, false), Err(Refusal::TooWide));
        assert_eq!(g.govern(&net("2001:2::/16"), 60, 0, 2, false), Err(Refusal::TooWide));
        assert_eq!(g.govern(&net("198.18.5.0/24"), 601, 0, 2, false), Err(Refusal::TtlTooLong));
        assert_eq!(g.govern(&net("198.18.5.0/24"), 0, 0, 2, false), Err(Refusal::BadRequest));
        assert_eq!(g.govern(&net("198.18.5.0/24"), 60, 2, 2, false), Err(Refusal::Cap));
        assert_eq!(g.govern(&net("198.18.5.0/24"), 60, 0, 2, true), Err(Refusal::Allowed));
        let overriding = Feedback { may_override_allow: true, ..g.clone() };
        assert_eq!(overriding.govern(&net("198.18.5.0/24"), 60, 0, 2, true), Ok(()));
        let mut far = g.clone();
        far.listen = "198.18.0.2:9465".parse().unwrap();
        assert_eq!(check(&far).unwrap_err().field, "feedback.listen");
        let mut esc = g.clone();
        let rule = |d: u64, s: u64, t: u64| {
            Some(Escalate {
                drops_per_sec: d,
                sustained: Duration::from_secs(s),
                deny_for: Duration::from_secs(t),
                max_denied: 100,
                deny_v4_prefix: 32,
                deny_v6_prefix: 128,
            })
        };
        esc.escalate = rule(1000, 5, 600);
        assert_eq!(check(&esc), Ok(()));
        for (bad, field) in [
            (rule(10, 5, 600), "feedback.escalate.drops_per_sec"),
            (rule(1000, 0, 600), "feedback.escalate.sustained"),
            (rule(1000, 5, 601), "feedback.escalate.deny_for"),
            (rule(1000, 5, 600).map(|r| Escalate { deny_v4_prefix: 8, ..r }), "feedback.escalate.deny_v4_prefix"),
            (rule(1000, 5, 600).map(|r| Escalate { deny_v4_prefix: 33, ..r }), "feedback.escalate.deny_v4_prefix"),
            (rule(1000, 5, 600).map(|r| Escalate { deny_v6_prefix: 16, ..r }), "feedback.escalate.deny_v6_prefix"),
        ] {
            esc.escalate = bad;
            assert_eq!(check(&esc).unwrap_err().field, field);
        }
    }
}

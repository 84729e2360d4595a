//! `[crowdsec]`: CrowdSec's decisions, pulled from its Local API as a
//! bouncer pulls them, denied through the data plane's deny set as an
//! automation layer below the operator and the file (an `allow` of
//! either always wins), under width rules, a cap of their own, and
//! optionally in shadow.
//!
//! ```toml
//! [crowdsec]
//! lapi_url = "http://127.0.0.1:8080"
//! api_key_file = "/etc/limiter/crowdsec.key"   # from `cscli bouncers add limiter`
//! update_frequency = "10s"
//! origins = []                  # e.g. ["crowdsec", "cscli", "lists"]; empty: every origin
//! scenarios_containing = []     # keep only decisions whose scenario contains one of these
//! scenarios_not_containing = [] # leave out those whose scenario contains one of these
//! max_decisions = 1000000       # networks denied for CrowdSec at once
//! min_v4_prefix = 8             # nothing wider is taken
//! min_v6_prefix = 16
//! max_v4_addresses = 16777216   # IPv4 space its networks cover together (a /8)
//! allow_bogons = false          # private and special-purpose ranges are left out unless true
//! shadow = false                # true: pulled and counted, not enforced
//! ```

use std::{path::PathBuf, time::Duration};

use serde::{Deserialize, Serialize};

use super::{PolicyError, bad, duration, duration_out};

/// The `[crowdsec]` section.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Crowdsec {
    pub lapi_url: String,
    pub api_key_file: PathBuf,
    #[serde(default = "defaults::update", deserialize_with = "duration", serialize_with = "duration_out")]
    pub update_frequency: Duration,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub origins: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scenarios_containing: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scenarios_not_containing: Vec<String>,
    #[serde(default = "defaults::max_decisions")]
    pub max_decisions: usize,
    #[serde(default = "defaults::min_v4")]
    pub min_v4_prefix: u8,
    #[serde(default = "defaults::min_v6")]
    pub min_v6_prefix: u8,
    #[serde(default = "defaults::max_v4_addresses")]
    pub max_v4_addresses: u64,
    #[serde(default)]
    pub allow_bogons: bool,
    #[serde(default)]
    pub shadow: bool,
}

impl Crowdsec {
    /// Whether a decision of `kind`, `origin` and `scenario` is one this
    /// section takes (a `ban`; the filters).
    #[must_use]
    pub fn takes(&self, kind: &str, origin: &str, scenario: &str) -> bool {
        kind.eq_ignore_ascii_case("ban")
            && (self.origins.is_empty() || self.origins.iter().any(|o| o == origin))
            && (self.scenarios_containing.is_empty() || self.scenarios_containing.iter().any(|s| scenario.contains(s)))
            && !self.scenarios_not_containing.iter().any(|s| scenario.contains(s))
    }
}

mod defaults {
    use std::time::Duration;

    pub const fn update() -> Duration {
        Duration::from_secs(10)
    }
    pub const fn max_decisions() -> usize {
        1_000_000
    }
    pub const fn min_v4() -> u8 {
        8
    }
    pub const fn min_v6() -> u8 {
        16
    }
    pub const fn max_v4_addresses() -> u64 {
        1 << 24
    }
}

/// A LAPI address's authority (`host:port`) and path prefix (empty or
/// `/path`): `http://HOST:PORT[/PATH]`.
#[must_use]
pub fn lapi_parts(url: &str) -> Option<(String, String)> {
    let rest = url.strip_prefix("http://")?;
    let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
    if authority.is_empty() || authority.contains(['@', ' ']) || !authority.contains(':') {
        return None;
    }
    let base = path.trim_end_matches('/');
    Some((authority.to_owned(), if base.is_empty() { String::new() } else { format!("/{base}") }))
}

/// Check the section (the key file is read by the daemon).
pub fn check(c: &Crowdsec) -> Result<(), PolicyError> {
    if lapi_parts(&c.lapi_url).is_none() {
        return Err(bad("crowdsec.lapi_url", "http://HOST:PORT[/PATH] (https is not read yet)"));
    }
    if !c.api_key_file.is_absolute() {
        return Err(bad("crowdsec.api_key_file", format!("{} is not an absolute path", c.api_key_file.display())));
    }
    if !(Duration::from_secs(1)..=Duration::from_hours(1)).contains(&c.update_frequency) {
        return Err(bad("crowdsec.update_frequency", "1s to 1h"));
    }
    if c.max_decisions == 0 || c.max_decisions > crate::policy::feed::MAX_ENTRIES {
        return Err(bad("crowdsec.max_decisions", format!("1 to {}", crate::policy::feed::MAX_ENTRIES)));
    }
    if c.min_v4_prefix > 32 || c.min_v6_prefix > 128 {
        return Err(bad("crowdsec.min_v4_prefix", "longer than the address"));
    }
    if !(1..=1 << 32).contains(&c.max_v4_addresses) {
        return Err(bad("crowdsec.max_v4_addresses", "1 to 4,294,967,296"));
    }
    Ok(())
}

//! `[[feed]]`: a blocklist file the operator already fetches (FireHOL,
//! Spamhaus DROP, ipsum), denied through the data plane's deny set as an
//! automation layer below the operator and the file: an `allow` of
//! either always wins, and a feed's networks pass width rules, a cap of
//! their own and the bogon filter.
//!
//! ```toml
//! [[feed]]
//! name = "firehol_level1"
//! path = "/var/lib/limiter/feeds/firehol_level1.netset"
//! format = "plain"          # plain | ipsum | spamhaus-json
//! refresh = "1h"            # read again at least this often, and when the file changes
//! min_count = 3             # ipsum: listed by at least this many blocklists
//! max_shrink = 0.5          # a version that loses more than half the set is refused
//! allow_bogons = false      # private and bogon ranges are left out unless true
//! max_networks = 1000000    # this feed's cap
//! min_v4_prefix = 8         # nothing wider
//! min_v6_prefix = 16
//! shadow = false            # true: read, checked and counted, not enforced
//! ```

use std::{path::PathBuf, time::Duration};

use serde::{Deserialize, Serialize};

use super::{Action, PolicyError, bad, duration, duration_out, words::valid_name};

/// Most networks one feed holds.
pub const MAX_ENTRIES: usize = 2_000_000;

/// How a feed's file is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// One address or CIDR per line; `#` and `;` start comments (FireHOL
    /// netsets, Spamhaus DROP's text form, most lists).
    Plain,
    /// `ADDRESS<TAB>COUNT` per line (ipsum): an address and how many
    /// blocklists list it; those below the feed's minimum are left out.
    Ipsum,
    /// Spamhaus DROP's JSON lines: `{"cidr": ...}` per network, then one
    /// metadata line with the number of records (a file without it, or
    /// with fewer records, was cut short).
    SpamhausJson,
}

/// One `[[feed]]` section.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Feed {
    pub name: String,
    pub path: PathBuf,
    #[serde(default = "defaults::format")]
    pub format: Format,
    #[serde(default = "defaults::refresh", deserialize_with = "duration", serialize_with = "duration_out")]
    pub refresh: Duration,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_count: Option<u32>,
    #[serde(default = "defaults::max_shrink")]
    pub max_shrink: f64,
    #[serde(default)]
    pub allow_bogons: bool,
    /// What it does with its networks: drop their packets (the only
    /// action a feed takes).
    #[serde(default = "defaults::action")]
    pub action: Action,
    #[serde(default = "defaults::max_networks")]
    pub max_networks: usize,
    #[serde(default = "defaults::min_v4")]
    pub min_v4_prefix: u8,
    #[serde(default = "defaults::min_v6")]
    pub min_v6_prefix: u8,
    #[serde(default)]
    pub shadow: bool,
}

impl Eq for Feed {}

/// The width rule of automation's networks (feeds, CrowdSec): whether
/// `net` is wider than `min_v4` (IPv4) or `min_v6` (IPv6) bits allow.
#[must_use]
pub fn wider_than(net: &ipnet::IpNet, min_v4: u8, min_v6: u8) -> bool {
    match net {
        ipnet::IpNet::V4(n) => n.prefix_len() < min_v4,
        ipnet::IpNet::V6(n) => n.prefix_len() < min_v6,
    }
}

/// Feeds one policy may name.
pub const MAX_FEEDS: usize = 32;

mod defaults {
    use std::time::Duration;

    use super::{Action, Format};

    pub const fn format() -> Format {
        Format::Plain
    }
    pub const fn refresh() -> Duration {
        Duration::from_hours(1)
    }
    pub const fn action() -> Action {
        Action::Deny
    }
    pub const fn max_shrink() -> f64 {
        0.5
    }
    pub const fn max_networks() -> usize {
        1_000_000
    }
    pub const fn min_v4() -> u8 {
        8
    }
    pub const fn min_v6() -> u8 {
        16
    }
}

/// Check the sections (the files are read by the daemon, off its loop).
pub fn check(feeds: &[Feed]) -> Result<(), PolicyError> {
    if feeds.len() > MAX_FEEDS {
        return Err(bad("feed", format!("{} feeds, at most {MAX_FEEDS}", feeds.len())));
    }
    for (i, f) in feeds.iter().enumerate() {
        let at = |field: &str| format!("feed[{i}].{field}");
        if !valid_name(&f.name) {
            return Err(bad(at("name"), "1 to 40 letters, digits, '_', '-' or '.'"));
        }
        if feeds[..i].iter().any(|o| o.name == f.name) {
            return Err(bad(at("name"), format!("{:?} names another feed too", f.name)));
        }
        if !f.path.is_absolute() {
            return Err(bad(at("path"), format!("{} is not an absolute path", f.path.display())));
        }
        if f.refresh < Duration::from_secs(1) {
            return Err(bad(at("refresh"), "at least 1s"));
        }
        if !(0.0..=1.0).contains(&f.max_shrink) {
            return Err(bad(at("max_shrink"), "a fraction from 0 to 1"));
        }
        f.action.only(&[Action::Deny]).map_err(|e| bad(at("action"), format!("{e}: a feed only denies")))?;
        if f.max_networks == 0 || f.max_networks > MAX_ENTRIES {
            return Err(bad(at("max_networks"), format!("1 to {MAX_ENTRIES}")));
        }
        if f.min_v4_prefix > 32 || f.min_v6_prefix > 128 {
            return Err(bad(at("min_v4_prefix"), "longer than the address"));
        }
    }
    Ok(())
}

//! `[upstream]`: rules announced to the transit over BGP, through a
//! speaker the operator runs (ExaBGP, driven through its command pipes),
//! for what the host's own link cannot absorb. FlowSpec (RFC 8955/8956)
//! on by default; remotely triggered blackholing (RFC 7999) only when
//! asked for, and then only by the operator's command.
//!
//! ```toml
//! [upstream]
//! speaker = "/run/exabgp/limiter"   # ExaBGP's pipes: PATH.in and PATH.out
//! state = "/var/lib/limiter/upstream.json"  # what is announced, kept across restarts
//! flowspec = true
//! rtbh = false                  # operator's `limiter upstream blackhole` only
//! communities = []              # e.g. ["64500:100"], added to every rule
//! max_rules = 100               # rules announced at once
//! min_v4_prefix = 24            # no source wider is announced
//! min_v6_prefix = 48
//! never = []                    # networks never announced (your own)
//! ttl = "10m"                   # a rule's lifetime unless the operator gives one
//! hold_down = "2m"              # pressure rules stay this long after pressure ends
//! max_changes_per_minute = 30   # announcements and withdrawals sent, together
//! shadow = false                # true: log what would be announced, send nothing
//! withdraw_on_stop = false      # true: the daemon withdraws everything when it stops
//! escalate = false              # true: escalation's proven sources are announced too
//! link_capacity = 0             # bits per second of the uplink; 0: no link-pressure rules
//! pressure_percent = 90        # of link_capacity, received
//! pressure_sustained = "10s"
//! pressure_prefixes = 10        # top dropping prefixes announced under pressure
//! packet_bytes = 1500           # bytes a packet of a pressure rule's rate may have
//! ```

use std::{path::PathBuf, time::Duration};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::{PolicyError, bad, duration, duration_out};

/// The most rules a policy may let the daemon announce at once (a
/// transit's FlowSpec table is small: a few thousand).
pub const MAX_RULES: usize = 10_000;

/// The `[upstream]` section.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[expect(clippy::struct_excessive_bools, reason = "the file's switches, each a key of its own")]
pub struct Upstream {
    pub speaker: PathBuf,
    #[serde(default = "defaults::state")]
    pub state: PathBuf,
    #[serde(default = "defaults::yes")]
    pub flowspec: bool,
    #[serde(default)]
    pub rtbh: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub communities: Vec<String>,
    #[serde(default = "defaults::max_rules")]
    pub max_rules: usize,
    #[serde(default = "defaults::min_v4")]
    pub min_v4_prefix: u8,
    #[serde(default = "defaults::min_v6")]
    pub min_v6_prefix: u8,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub never: Vec<IpNet>,
    #[serde(default = "defaults::ttl", deserialize_with = "duration", serialize_with = "duration_out")]
    pub ttl: Duration,
    #[serde(default = "defaults::hold_down", deserialize_with = "duration", serialize_with = "duration_out")]
    pub hold_down: Duration,
    #[serde(default = "defaults::changes")]
    pub max_changes_per_minute: u32,
    #[serde(default)]
    pub shadow: bool,
    #[serde(default)]
    pub withdraw_on_stop: bool,
    #[serde(default)]
    pub escalate: bool,
    #[serde(default)]
    pub link_capacity: u64,
    #[serde(default = "defaults::percent")]
    pub pressure_percent: u8,
    #[serde(default = "defaults::sustained", deserialize_with = "duration", serialize_with = "duration_out")]
    pub pressure_sustained: Duration,
    #[serde(default = "defaults::prefixes")]
    pub pressure_prefixes: usize,
    #[serde(default = "defaults::packet_bytes")]
    pub packet_bytes: u64,
}

mod defaults {
    use std::{path::PathBuf, time::Duration};

    pub fn state() -> PathBuf {
        PathBuf::from("/var/lib/limiter/upstream.json")
    }
    pub const fn yes() -> bool {
        true
    }
    pub const fn max_rules() -> usize {
        100
    }
    pub const fn min_v4() -> u8 {
        24
    }
    pub const fn min_v6() -> u8 {
        48
    }
    pub const fn ttl() -> Duration {
        Duration::from_mins(10)
    }
    pub const fn hold_down() -> Duration {
        Duration::from_mins(2)
    }
    pub const fn changes() -> u32 {
        30
    }
    pub const fn percent() -> u8 {
        90
    }
    pub const fn sustained() -> Duration {
        Duration::from_secs(10)
    }
    pub const fn prefixes() -> usize {
        10
    }
    pub const fn packet_bytes() -> u64 {
        1500
    }
}

/// A standard community `ASN:VALUE`, each a 16-bit number.
#[must_use]
pub fn community(s: &str) -> Option<(u16, u16)> {
    let (a, v) = s.split_once(':')?;
    Some((a.parse().ok()?, v.parse().ok()?))
}

/// Check the section.
pub fn check(u: &Upstream) -> Result<(), PolicyError> {
    let path_ok = |p: &PathBuf| p.is_absolute() && p.to_str().is_some_and(|s| !s.contains(['\n', ' ']));
    if !path_ok(&u.speaker) {
        return Err(bad("upstream.speaker", "an absolute path: ExaBGP's pipes are PATH.in and PATH.out"));
    }
    if !path_ok(&u.state) {
        return Err(bad("upstream.state", "an absolute path"));
    }
    if !u.flowspec && !u.rtbh {
        return Err(bad("upstream.flowspec", "with rtbh = false too, nothing could be announced"));
    }
    if let Some((i, c)) = u.communities.iter().enumerate().find(|(_, c)| community(c).is_none()) {
        return Err(bad(format!("upstream.communities[{i}]"), format!("{c:?} is not ASN:VALUE (two 16-bit numbers)")));
    }
    if u.communities.len() > 16 {
        return Err(bad("upstream.communities", "at most 16"));
    }
    if !(1..=MAX_RULES).contains(&u.max_rules) {
        return Err(bad("upstream.max_rules", format!("1 to {MAX_RULES}")));
    }
    if !(8..=32).contains(&u.min_v4_prefix) {
        return Err(bad("upstream.min_v4_prefix", "8 to 32: a wider rule drops a whole region's traffic"));
    }
    if !(16..=128).contains(&u.min_v6_prefix) {
        return Err(bad("upstream.min_v6_prefix", "16 to 128"));
    }
    if u.never.len() > 1024 {
        return Err(bad("upstream.never", "at most 1,024 networks"));
    }
    if !(Duration::from_secs(1)..=Duration::from_hours(24 * 7)).contains(&u.ttl) {
        return Err(bad("upstream.ttl", "1s to 168h"));
    }
    if u.hold_down > Duration::from_hours(24) {
        return Err(bad("upstream.hold_down", "at most 24h"));
    }
    if !(1..=600).contains(&u.max_changes_per_minute) {
        return Err(bad("upstream.max_changes_per_minute", "1 to 600"));
    }
    if !(1..=100).contains(&u.pressure_percent) {
        return Err(bad("upstream.pressure_percent", "1 to 100"));
    }
    if !(Duration::from_secs(1)..=Duration::from_hours(1)).contains(&u.pressure_sustained) {
        return Err(bad("upstream.pressure_sustained", "1s to 1h"));
    }
    if !(1..=1000).contains(&u.pressure_prefixes) {
        return Err(bad("upstream.pressure_prefixes", "1 to 1,000"));
    }
    if !(64..=65_535).contains(&u.packet_bytes) {
        return Err(bad("upstream.packet_bytes", "64 to 65,535"));
    }
    if u.link_capacity != 0 && !u.flowspec {
        return Err(bad("upstream.link_capacity", "link-pressure rules are FlowSpec: set flowspec = true"));
    }
    Ok(())
}

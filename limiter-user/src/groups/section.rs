//! `[[group]]`: the networks of some countries or autonomous systems,
//! read from a file the operator already fetches (a MaxMind-format
//! database or a CSV list, `crate::groups`), and what they share: one
//! budget for every address of the group together (`rate`, `burst`),
//! or `allow`, or `deny`. Below the operator's overrides (a prefix an
//! override holds is never in a group) and above the automation that
//! fills the deny set.
//!
//! ```toml
//! [[group]]
//! name = "as64500"
//! path = "/var/lib/limiter/groups/asn.csv"
//! asns = [64500, 64501]     # and/or countries = ["DE", "FR"]
//! action = "rate"           # rate (default) | allow | deny
//! rate = 20000              # packets/s for the whole group together
//! burst = 40000
//! refresh = "1h"            # read again this often, and when the file changes
//! allow_bogons = false      # special-purpose ranges are left out unless true
//! min_v4_prefix = 6         # a version holding a wider network is refused
//! min_v6_prefix = 12
//! max_coverage = 0.5        # nor one covering more of a family's addresses
//! max_growth = 1.0          # nor one covering more than twice the last's
//! max_shrink = 0.5          # nor one covering less than half the last's
//! shadow = false            # true: counted, not enforced
//! ```
//!
//! The guards are the feeds' turned to groups: a file replaced by
//! `0.0.0.0/0,XX` (or a one-node database) must not deny the Internet,
//! nor silently drop a group's real networks. A version they refuse is
//! logged with why, and the last one stays in force.

use std::{path::PathBuf, time::Duration};

use limiter_common::{
    groups::{self as kernel, GroupLimits},
    mode,
};
use serde::{Deserialize, Serialize};

use crate::policy::{
    duration::{duration, duration_out},
    error::{PolicyError, bad},
    words::{Action, valid_name},
};

/// Groups one policy may name.
pub const MAX_GROUPS: usize = kernel::MAX_GROUPS as usize;
/// Countries and ASNs one group may name together.
pub const MAX_MEMBERS: usize = 4096;

/// One `[[group]]` section.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Group {
    pub name: String,
    pub path: PathBuf,
    /// ISO 3166-1 alpha-2 codes, as the file writes them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub countries: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub asns: Vec<u32>,
    /// What it does with its addresses: `rate`, one budget for all of
    /// them together, charged after each prefix's own; `allow`, pass
    /// uncharged; `deny`, drop.
    #[serde(default = "rate")]
    pub action: Action,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
    #[serde(default = "default_refresh", deserialize_with = "duration", serialize_with = "duration_out")]
    pub refresh: Duration,
    #[serde(default)]
    pub allow_bogons: bool,
    /// A version holding a selected network wider than this is refused.
    #[serde(default = "guards::min_v4")]
    pub min_v4_prefix: u8,
    #[serde(default = "guards::min_v6")]
    pub min_v6_prefix: u8,
    /// The most of a family's address space a version may cover.
    #[serde(default = "guards::max_coverage")]
    pub max_coverage: f64,
    /// The most a version may grow over the last one in force, in
    /// addresses covered of a family (1.0: to twice as many).
    #[serde(default = "guards::max_growth")]
    pub max_growth: f64,
    /// The most it may shrink (0.5: to half as many).
    #[serde(default = "guards::max_shrink")]
    pub max_shrink: f64,
    #[serde(default)]
    pub shadow: bool,
}

impl Eq for Group {}

/// A group's action when it says none: one budget for all.
const fn rate() -> Action {
    Action::Rate
}

const fn default_refresh() -> Duration {
    Duration::from_hours(1)
}

/// The guards' defaults: wide enough for every real file (GeoLite2's
/// widest networks are a /7 and a /16 of the United States, which holds
/// about 37% of IPv4), narrow enough that no file denies the Internet.
mod guards {
    pub(super) const fn min_v4() -> u8 {
        6
    }
    pub(super) const fn min_v6() -> u8 {
        12
    }
    pub(super) const fn max_coverage() -> f64 {
        0.5
    }
    pub(super) const fn max_growth() -> f64 {
        1.0
    }
    pub(super) const fn max_shrink() -> f64 {
        0.5
    }
}

impl Group {
    /// The countries, as the tables write them (two upper-case letters).
    #[must_use]
    pub fn country_codes(&self) -> Vec<[u8; 2]> {
        self.countries.iter().filter_map(|c| c.as_bytes().try_into().ok()).collect()
    }
}

/// Check the sections and derive each group's limits, by index (the
/// files are read by the daemon, off its loop).
pub fn check(groups: &[Group]) -> Result<Vec<GroupLimits>, PolicyError> {
    if groups.len() > MAX_GROUPS {
        return Err(bad("group", format!("{} groups, at most {MAX_GROUPS}", groups.len())));
    }
    let mut out = Vec::with_capacity(groups.len());
    for (i, g) in groups.iter().enumerate() {
        let at = |field: &str| format!("group[{i}].{field}");
        if !valid_name(&g.name) {
            return Err(bad(at("name"), "1 to 40 letters, digits, '_', '-' or '.'"));
        }
        if groups[..i].iter().any(|o| o.name == g.name) {
            return Err(bad(at("name"), format!("{:?} names another group too", g.name)));
        }
        if !g.path.is_absolute() {
            return Err(bad(at("path"), format!("{} is not an absolute path", g.path.display())));
        }
        if let Some(c) = g.countries.iter().find(|c| c.len() != 2 || !c.bytes().all(|b| b.is_ascii_uppercase())) {
            return Err(bad(at("countries"), format!("{c:?} is not a country code (two upper-case letters, \"DE\")")));
        }
        if g.countries.is_empty() && g.asns.is_empty() {
            return Err(bad(at("countries"), "name at least one country or ASN (`countries` or `asns`)"));
        }
        if g.countries.len() + g.asns.len() > MAX_MEMBERS {
            return Err(bad(at("asns"), format!("more than {MAX_MEMBERS} countries and ASNs")));
        }
        if g.refresh < Duration::from_secs(1) {
            return Err(bad(at("refresh"), "at least 1s"));
        }
        g.action.only(&[Action::Rate, Action::Allow, Action::Deny]).map_err(|e| bad(at("action"), e))?;
        if g.min_v4_prefix > 32 {
            return Err(bad(at("min_v4_prefix"), "0 to 32"));
        }
        if g.min_v6_prefix > 128 {
            return Err(bad(at("min_v6_prefix"), "0 to 128"));
        }
        for (key, v, range) in [
            ("max_coverage", g.max_coverage, 0.0..=1.0),
            ("max_growth", g.max_growth, 0.0..=1_000_000.0),
            ("max_shrink", g.max_shrink, 0.0..=1.0),
        ] {
            if !range.contains(&v) {
                return Err(bad(at(key), format!("{v} is outside {} to {}", range.start(), range.end())));
            }
        }
        let m = if g.shadow { mode::SHADOW } else { mode::ENFORCE };
        let limits = match (g.action, g.rate, g.burst) {
            (Action::Rate, Some(rate), burst) => {
                let burst = burst.unwrap_or(rate.saturating_mul(2));
                if !(1..=limiter_common::gcra::MAX_RATE).contains(&rate) {
                    return Err(bad(at("rate"), format!("{rate} is outside 1..={}", limiter_common::gcra::MAX_RATE)));
                }
                if burst == 0 {
                    return Err(bad(at("burst"), "at least 1"));
                }
                GroupLimits::rate(rate, burst, m)
                    .ok_or_else(|| bad(at("burst"), format!("{burst} is too large for rate {rate}")))?
            }
            (Action::Rate, None, _) => return Err(bad(at("rate"), "a rate group needs a rate (packets/s)")),
            (a, None, None) => {
                GroupLimits::decide(if a == Action::Allow { kernel::action::ALLOW } else { kernel::action::DENY }, m)
            }
            (_, _, _) => return Err(bad(at("rate"), "only a rate group (action = \"rate\") has a rate and a burst")),
        };
        out.push(limits);
    }
    Ok(out)
}

//! `[[source]]`: a file of networks the operator keeps, read by its kind
//! (see `crate::sources`), and what its networks are given.
//!
//! ```toml
//! [[source]]
//! name = "office"
//! kind = "allowlist"         # see docs/sources/
//! path = "/etc/limiter/office.txt"
//! action = "allow"           # the kind's default; each kind says which it takes
//! refresh = "5m"             # read again this often, and when the file changes
//! max_networks = 10000       # a version holding more is refused
//! max_shrink = 0.5           # nor one holding less than half the last's
//! ```
//!
//! Its networks are overrides of the policy in force, below the
//! operator's and the file's `[[override]]`s and above automation; none
//! may be wider than an IPv4 /8 or an IPv6 /16 (an allow of `0.0.0.0/0`
//! would lift every limit). A network finer than the bucket prefix counts
//! for its whole bucket (the data plane decides per bucket).

use std::{path::PathBuf, time::Duration};

use serde::{Deserialize, Serialize};

pub use super::MAX_NETWORKS;

use crate::policy::{
    duration::{duration, duration_out},
    error::{PolicyError, bad},
    words::{Action, valid_name},
};

/// Sources one policy may name.
pub const MAX_SOURCES: usize = 32;
/// Widest IPv4 and IPv6 networks a source may name.
pub const MIN_PREFIX: (u8, u8) = (8, 16);

/// One `[[source]]` section.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Source {
    pub name: String,
    pub kind: String,
    pub path: PathBuf,
    /// What its networks are given (`None`: its kind's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<Action>,
    #[serde(default = "defaults::refresh", deserialize_with = "duration", serialize_with = "duration_out")]
    pub refresh: Duration,
    #[serde(default = "defaults::max_networks")]
    pub max_networks: usize,
    #[serde(default = "defaults::max_shrink")]
    pub max_shrink: f64,
}

impl Eq for Source {}

impl Source {
    /// What its networks are given: its own action, else its kind's
    /// first (a section that passed [`check`]).
    #[must_use]
    pub fn action(&self) -> Action {
        self.action
            .or_else(|| super::kind(&self.kind).and_then(|k| k.actions.first().copied()))
            .unwrap_or(Action::Allow)
    }
}

mod defaults {
    use std::time::Duration;

    pub const fn refresh() -> Duration {
        Duration::from_mins(5)
    }
    pub const fn max_networks() -> usize {
        10_000
    }
    pub const fn max_shrink() -> f64 {
        0.5
    }
}

/// Check the sections (the files are read by the daemon, off its loop).
pub fn check(sources: &[Source]) -> Result<(), PolicyError> {
    if sources.len() > MAX_SOURCES {
        return Err(bad("source", format!("{} sources, at most {MAX_SOURCES}", sources.len())));
    }
    for (i, s) in sources.iter().enumerate() {
        let at = |field: &str| format!("source[{i}].{field}");
        if !valid_name(&s.name) {
            return Err(bad(at("name"), "1 to 40 letters, digits, '_', '-' or '.'"));
        }
        if sources[..i].iter().any(|o| o.name == s.name) {
            return Err(bad(at("name"), format!("{:?} names another source too", s.name)));
        }
        let Some(kind) = super::kind(&s.kind) else {
            let known: Vec<String> = super::KINDS.iter().map(|k| format!("{:?}", k.name)).collect();
            let known = if known.is_empty() { "none".to_owned() } else { known.join(", ") };
            return Err(bad(at("kind"), format!("no kind {:?} (kinds: {known})", s.kind)));
        };
        if !s.path.is_absolute() {
            return Err(bad(at("path"), format!("{} is not an absolute path", s.path.display())));
        }
        if let Some(a) = s.action {
            a.only(kind.actions).map_err(|e| bad(at("action"), format!("{e} (what kind {} takes)", kind.name)))?;
        }
        if s.refresh < Duration::from_secs(1) {
            return Err(bad(at("refresh"), "at least 1s"));
        }
        if s.max_networks == 0 || s.max_networks > MAX_NETWORKS {
            return Err(bad(at("max_networks"), format!("1 to {MAX_NETWORKS}")));
        }
        if !(0.0..=1.0).contains(&s.max_shrink) {
            return Err(bad(at("max_shrink"), "a fraction from 0 to 1"));
        }
    }
    Ok(())
}

//! The feeds' part of the deny set: each feed's versions, under its own
//! origin (`feed:NAME`), cap, width and shrink guard.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt::Write as _;

use ipnet::IpNet;

use super::DenySource;
use crate::{
    dataplane::deny::{DenySet, DenyWrites},
    engine::enforcer::ApplyError,
    nets::check_shrink,
    origin::{Named, Origin},
    policy::{Policy, feed::Feed},
};

/// A feed's state, as the policy state keeps it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FeedState {
    /// Networks of its version in force (counted, not enforced, in shadow).
    pub networks: usize,
    pub shadow: bool,
    /// Unix time its last version was applied.
    pub applied_at: Option<u64>,
    /// Why its last version was refused (the one before stays).
    pub refused: Option<String>,
    /// Versions refused, and networks of taken versions left out for
    /// being wider than the feed's minimum prefix.
    pub refusals: u64,
    pub too_wide: usize,
}

/// Every feed's state, by name.
#[derive(Debug, Default)]
pub struct Feeds(pub BTreeMap<String, FeedState>);

/// A feed's origin name in the set (`feed:NAME`).
fn feed_origin(name: &str) -> String {
    Named::feed(name).to_string()
}

impl Feeds {
    /// Take a new version of the feed `spec` (its networks as read) into
    /// `set`: networks wider than its minimum prefix are left out; a
    /// version past its cap, or that lost more than `max_shrink` of the
    /// last one, is refused (the last one stays, and is counted);
    /// otherwise only what changed moves. What to keep once the set is
    /// written.
    pub(super) fn take(
        &mut self,
        set: &mut DenySet,
        spec: &Feed,
        nets: &BTreeSet<IpNet>,
    ) -> Result<Version, ApplyError> {
        let state = self.0.entry(spec.name.clone()).or_default();
        let wide = |n: &IpNet| crate::policy::feed::wider_than(n, spec.min_v4_prefix, spec.min_v6_prefix);
        let kept: HashSet<IpNet> = nets.iter().filter(|n| !wide(n)).copied().collect();
        let too_wide = nets.len() - kept.len();
        let refuse = |state: &mut FeedState, why: String| {
            state.refusals += 1;
            state.refused = Some(why.clone());
            Err(ApplyError::Request(format!("feed {}: {why}; its last version stays", spec.name)))
        };
        if kept.len() > spec.max_networks {
            return refuse(state, format!("{} networks, past its cap of {}", kept.len(), spec.max_networks));
        }
        // The last version is the one this daemon applied or, before its
        // first, the one the pins hold from the daemon before it (a file
        // truncated while the daemon was down is refused at start too).
        let pinned = set.count_named(&feed_origin(&spec.name));
        let last = if state.applied_at.is_some() { Some(state.networks) } else { (pinned > 0).then_some(pinned) };
        if let Some(last) = last
            && let Err(e) = check_shrink(last, kept.len(), spec.max_shrink)
        {
            return refuse(state, e.to_string());
        }
        let origin = set.origin(&feed_origin(&spec.name)).map_err(|e| ApplyError::Request(e.to_string()))?;
        let previous: HashSet<IpNet> = set.of(origin).collect();
        let networks = kept.len();
        let enforced = if spec.shadow { HashSet::new() } else { kept };
        let before = set.count_of(origin);
        if let Err(e) = set.replace(origin, &enforced) {
            // Taken whole or not at all: what was added goes again, and
            // the last version stays as it was.
            let _ = set.replace(origin, &previous);
            return refuse(state, e.to_string());
        }
        let state = FeedState {
            networks,
            shadow: spec.shadow,
            applied_at: Some(crate::clock::unix_now()),
            refused: None,
            refusals: state.refusals,
            too_wide,
        };
        Ok(Version { state, before })
    }
}

/// A version taken into the set, to keep once the set is written.
pub(super) struct Version {
    pub(super) state: FeedState,
    /// Networks of the feed in the set before it.
    before: usize,
}

impl Version {
    /// Its line, with what the kernel was written.
    pub(super) fn line(&self, spec: &Feed, written: &DenyWrites) -> String {
        let s = &self.state;
        let mut line = format!("feed {}: {} networks", spec.name, s.networks);
        if spec.shadow {
            line.push_str(" in shadow (counted, not enforced)");
        } else {
            let _ = write!(
                line,
                " (was {}; {} kernel entries written, {} removed)",
                self.before,
                written.upserts.len(),
                written.deletes.len()
            );
        }
        if s.too_wide > 0 {
            let _ = write!(
                line,
                "; {} wider than /{} (IPv4) or /{} (IPv6) left out",
                s.too_wide, spec.min_v4_prefix, spec.min_v6_prefix
            );
        }
        line
    }
}

impl DenySource for Feeds {
    /// What feeds the policy no longer names (or only the pins held) is
    /// lifted.
    fn follow(&mut self, set: &mut DenySet, policy: &Policy) {
        let named = |n: &str| policy.feeds.iter().any(|f| f.name == n);
        let gone: Vec<String> = self.0.keys().filter(|n| !named(n)).cloned().collect();
        let pinned_only: Vec<String> = set
            .names()
            .iter()
            .filter_map(|n| Named::name_in(n, Origin::Feed))
            .filter(|n| !named(n) && !gone.iter().any(|g| g == n))
            .map(str::to_owned)
            .collect();
        for name in gone.iter().chain(&pinned_only) {
            if let Ok(origin) = set.origin(&feed_origin(name)) {
                let _ = set.replace(origin, &HashSet::new());
            }
            self.0.remove(name);
        }
    }
}

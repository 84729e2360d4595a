//! The deny set's layer of the policy state: who denies what (feeds,
//! later CrowdSec), under the operator and the file (the data plane asks
//! the set only below their `allow` and `deny`), each origin under its
//! own rules and cap; and the set read back from the pins at a restart.

use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    fmt::Write as _,
};

use ipnet::IpNet;

use super::{ApplyError, Enforcer};
use crate::clock::unix_now;
use crate::{
    dataplane::{
        LoadError, PolicyMaps,
        deny::{Change, DenySet},
    },
    feeds::check_shrink,
    policy::feed::Feed,
};

/// Kernel entries the deny set takes, all origins together: networks
/// and the markers of those finer than the bucket prefix (the map's size).
pub const DENY_CAPACITY: usize = limiter_common::maps::MAX_DENIES as usize;

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

/// The deny set and the state of its origins.
#[derive(Debug)]
pub struct DenyLayer {
    pub(super) set: DenySet,
    pub(super) feeds: BTreeMap<String, FeedState>,
}

impl Default for DenyLayer {
    fn default() -> Self {
        Self { set: DenySet::new(DENY_CAPACITY, 24, 56), feeds: BTreeMap::new() }
    }
}

impl DenyLayer {
    /// The set's networks by origin name.
    #[must_use]
    pub fn counts(&self) -> std::collections::HashMap<&String, usize> {
        self.origins().map(|(i, n)| (n, self.set.count_of(crate::dataplane::deny::Origin(i)))).collect()
    }

    /// The origins named, with their index.
    pub fn origins(&self) -> impl Iterator<Item = (u16, &String)> {
        (0u16..).zip(self.set.names()).filter(|(_, n)| !n.is_empty())
    }

    #[must_use]
    pub fn feeds(&self) -> &BTreeMap<String, FeedState> {
        &self.feeds
    }
}

/// A feed's origin name in the set.
#[must_use]
pub fn feed_origin(name: &str) -> String {
    format!("feed:{name}")
}

impl Enforcer {
    /// The deny set as pinned (a restart), its markers under the bucket
    /// prefixes in force; a write a crash cut short is mended.
    pub(super) fn restore_deny(&mut self, maps: &mut impl PolicyMaps) -> Result<usize, LoadError> {
        let bucket = maps.active_config()?.map_or((24, 56), |c| (prefix_u8(c.v4_prefix), prefix_u8(c.v6_prefix)));
        let (set, mend) = DenySet::restore(DENY_CAPACITY, bucket, maps.deny_pinned()?);
        // A mend the kernel will not take (a map a build before this one
        // filled past its size) keeps no daemon from starting: the set
        // stays as the kernel enforces it, and the next change mends it.
        if let Err(e) = maps.write_deny(&mend) {
            tracing::warn!(event = "deny_set", "limiter: mending the pinned deny set: {e}; it is enforced as pinned");
        }
        self.deny.set = set;
        let networks = self.deny.set.len();
        if networks > 0 {
            tracing::info!(event = "deny_set", "limiter: the deny set's {networks} networks read back from the pins");
        }
        Ok(networks)
    }

    /// The deny set's markers follow a policy whose bucket prefixes
    /// changed: the new ones before the switch (`before`), the old ones
    /// gone after it.
    pub(super) fn rebucket(&mut self, v4: u32, v6: u32) -> (Change, Change) {
        let (v4, v6) = (prefix_u8(v4), prefix_u8(v6));
        if self.deny.set.bucket() == (v4, v6) {
            return (Change::default(), Change::default());
        }
        self.deny.set.set_bucket(v4, v6)
    }

    /// Write `compiled` (of `p`) with the deny set following it: its
    /// markers move with the bucket prefixes (the new ones written before
    /// the switch, the old ones removed after), and what feeds or CrowdSec
    /// the policy no longer names is lifted.
    pub(super) fn write_policy(
        &mut self,
        maps: &mut impl PolicyMaps,
        compiled: &crate::policy::Compiled,
        p: &crate::policy::Policy,
    ) -> Result<(), LoadError> {
        let (before, after) = self.rebucket(compiled.config.v4_prefix, compiled.config.v6_prefix);
        maps.write_deny(&before)?;
        maps.apply(compiled)?;
        maps.write_deny(&after)?;
        self.drop_unnamed_feeds(maps, &p.feeds)?;
        if p.crowdsec.is_none() {
            self.lift_crowdsec(maps)?;
        }
        Ok(())
    }

    /// Take a new version of the feed `spec` (its networks as read):
    /// networks wider than its minimum prefix are left out; a version
    /// past its cap, or that lost more than `max_shrink` of the last one,
    /// is refused (the last one stays); otherwise only what changed moves.
    pub fn feed(
        &mut self,
        maps: &mut impl PolicyMaps,
        spec: &Feed,
        nets: &BTreeSet<IpNet>,
    ) -> Result<String, ApplyError> {
        let state = self.deny.feeds.entry(spec.name.clone()).or_default();
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
        let pinned = self.deny.set.count_named(&feed_origin(&spec.name));
        let last = if state.applied_at.is_some() { Some(state.networks) } else { (pinned > 0).then_some(pinned) };
        if let Some(last) = last
            && let Err(e) = check_shrink(last, kept.len(), spec.max_shrink)
        {
            return refuse(state, e.to_string());
        }
        let origin = self.deny.set.origin(&feed_origin(&spec.name)).map_err(|e| ApplyError::Request(e.to_string()))?;
        let previous: HashSet<IpNet> = self.deny.set.of(origin).collect();
        let enforced = if spec.shadow { HashSet::new() } else { kept.clone() };
        let before = self.deny.set.count_of(origin);
        let result = self.deny.set.replace(origin, &enforced);
        if let Err(e) = result {
            // Taken whole or not at all: what was added goes again, and
            // the last version stays as it was.
            let last: HashSet<IpNet> = previous;
            let _ = self.deny.set.replace(origin, &last);
            let ch = self.deny.set.finish();
            if write(maps, &ch, self.deny.set.names()).is_err() {
                let _ = self.restore_deny(maps);
            }
            let state = self.deny.feeds.entry(spec.name.clone()).or_default();
            return refuse(state, e.to_string());
        }
        let ch = self.deny.set.finish();
        if let Err(e) = write(maps, &ch, self.deny.set.names()) {
            // The set as the kernel has it, whatever was written.
            let _ = self.restore_deny(maps);
            return Err(e.into());
        }
        let state = self.deny.feeds.entry(spec.name.clone()).or_default();
        *state = FeedState {
            networks: kept.len(),
            shadow: spec.shadow,
            applied_at: Some(unix_now()),
            refused: None,
            refusals: state.refusals,
            too_wide,
        };
        let mut line = format!("feed {}: {} networks", spec.name, kept.len());
        if spec.shadow {
            line.push_str(" in shadow (counted, not enforced)");
        } else {
            let _ = write!(
                line,
                " (was {before}; {} kernel entries written, {} removed)",
                ch.upserts.len(),
                ch.deletes.len()
            );
        }
        if too_wide > 0 {
            let _ = write!(
                line,
                "; {too_wide} wider than /{} (IPv4) or /{} (IPv6) left out",
                spec.min_v4_prefix, spec.min_v6_prefix
            );
        }
        Ok(line)
    }

    /// Lift what feeds the policy no longer names denied.
    pub(super) fn drop_unnamed_feeds(&mut self, maps: &mut impl PolicyMaps, named: &[Feed]) -> Result<(), LoadError> {
        let gone: Vec<String> =
            self.deny.feeds.keys().filter(|n| !named.iter().any(|f| &f.name == *n)).cloned().collect();
        let pinned_only: Vec<String> = self
            .deny
            .set
            .names()
            .iter()
            .filter_map(|n| n.strip_prefix("feed:"))
            .filter(|n| !named.iter().any(|f| f.name == *n) && !gone.iter().any(|g| g == n))
            .map(str::to_owned)
            .collect();
        for name in gone.iter().chain(&pinned_only) {
            if let Ok(origin) = self.deny.set.origin(&feed_origin(name)) {
                let _ = self.deny.set.replace(origin, &HashSet::new());
            }
            self.deny.feeds.remove(name);
        }
        let ch = self.deny.set.finish();
        write(maps, &ch, self.deny.set.names())
    }

    /// The deny set's layer.
    #[must_use]
    pub fn deny_layer(&self) -> &DenyLayer {
        &self.deny
    }
}

pub(super) fn write(maps: &mut impl PolicyMaps, ch: &Change, names: &[String]) -> Result<(), LoadError> {
    // The names first: a restart reads them with the entries.
    maps.set_deny_origins(names)?;
    maps.write_deny(ch)
}

fn prefix_u8(len: u32) -> u8 {
    u8::try_from(len.min(128)).unwrap_or(128)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::dataplane::FakeMaps;

    fn spec() -> Feed {
        let text = "[[feed]]\nname = \"x\"\npath = \"/x\"\nmax_networks = 4\n";
        crate::policy::file::parse("t", text.to_owned()).unwrap().policy.feeds.remove(0)
    }

    fn nets(v: &[&str]) -> BTreeSet<IpNet> {
        v.iter().map(|n| n.parse().unwrap()).collect()
    }

    #[test]
    fn a_feed_moves_by_diff_under_its_cap_width_and_shrink_guard() {
        let (mut e, mut m) = (Enforcer::new(0, 1024), FakeMaps::default());
        let s = spec();
        let line = e.feed(&mut m, &s, &nets(&["10.0.0.1/32", "10.1.0.0/16", "10.0.0.0/7"])).unwrap();
        assert!(line.contains("2 networks") && line.contains("1 wider than /8"), "{line}");
        // Two networks, and the /32's marker under its /24.
        assert_eq!(m.deny.len(), 3);
        assert_eq!(m.deny_origins, vec!["feed:x".to_owned()]);
        let past_cap = nets(&["10.0.0.1/32", "10.0.0.2/32", "10.0.0.3/32", "10.0.0.4/32", "10.0.0.5/32"]);
        let e1 = e.feed(&mut m, &s, &past_cap).unwrap_err().to_string();
        assert!(e1.contains("past its cap of 4") && e1.contains("its last version stays"), "{e1}");
        assert_eq!(m.deny.len(), 3, "a refused version wrote nothing");
        let e2 = e.feed(&mut m, &s, &BTreeSet::new()).unwrap_err().to_string();
        assert!(e2.contains("shrank by more than 50%"), "{e2}");
        e.feed(&mut m, &s, &nets(&["10.0.0.1/32"])).unwrap();
        assert_eq!(m.deny.len(), 2, "the /16 lifted, the /32 and its marker stay");
        assert_eq!(e.deny_layer().feeds()["x"].refusals, 2);
    }

    /// Issue 43, H4: a version that does not fit the set (counted in
    /// kernel entries, markers included) is refused whole, and the last
    /// one stays as it was, in the set and in the kernel (on 394d35c part
    /// of it was taken, the status claimed all of it, and the kernel
    /// refused the rest).
    #[test]
    fn a_version_past_the_sets_room_is_refused_whole() {
        let (mut e, mut m) = (Enforcer::new(0, 1024), FakeMaps::default());
        e.deny.set = DenySet::new(6, 24, 56);
        let s = spec();
        e.feed(&mut m, &s, &nets(&["10.0.0.1/32", "10.0.1.1/32"])).unwrap();
        let kernel = m.deny.clone();
        assert_eq!(kernel.len(), 4, "two /32s and their markers");
        // Four /32s in four /24s: eight entries, past six.
        let big = nets(&["10.0.0.1/32", "10.0.2.1/32", "10.0.3.1/32", "10.0.4.1/32"]);
        let err = e.feed(&mut m, &s, &big).unwrap_err().to_string();
        assert!(err.contains("the deny set is full") && err.contains("its last version stays"), "{err}");
        assert_eq!(m.deny, kernel, "the kernel holds the last version, whole");
        assert_eq!(e.deny_layer().counts().values().sum::<usize>(), 2);
        assert_eq!(e.deny_layer().feeds()["x"].networks, 2, "the status says what the kernel holds");
    }

    /// A feed file truncated while the daemon was down: the new daemon's
    /// first version is held to what the pins hold (before, a restart
    /// took an empty file and lifted every network of the feed).
    #[test]
    fn after_a_restart_the_shrink_guard_holds_against_what_the_pins_hold() {
        let (mut e, mut m) = (Enforcer::new(0, 1024), FakeMaps::default());
        let s = spec();
        e.feed(&mut m, &s, &nets(&["10.0.0.1/32", "10.1.0.0/16", "10.2.0.0/16"])).unwrap();
        let held = m.deny.len();
        // A new daemon: the set read back from the pins, no version applied.
        let mut e = Enforcer::new(0, 1024);
        e.restore_deny(&mut m).unwrap();
        let err = e.feed(&mut m, &s, &BTreeSet::new()).unwrap_err().to_string();
        assert!(err.contains("shrank by more than 50%") && err.contains("its last version stays"), "{err}");
        assert_eq!(m.deny.len(), held, "the truncated file lifted networks");
        let err = e.feed(&mut m, &s, &nets(&["10.0.0.1/32"])).unwrap_err().to_string();
        assert!(err.contains("shrank by more than 50%"), "{err}");
        // A version within the guard is taken, and then the guard follows it.
        let line = e.feed(&mut m, &s, &nets(&["10.0.0.1/32", "10.1.0.0/16"])).unwrap();
        assert!(line.contains("2 networks (was 3;"), "{line}");
    }

    #[test]
    fn a_feed_in_shadow_is_counted_not_enforced_and_a_feed_gone_is_lifted() {
        let (mut e, mut m) = (Enforcer::new(0, 1024), FakeMaps::default());
        let mut s = spec();
        e.feed(&mut m, &s, &nets(&["10.1.0.0/16"])).unwrap();
        assert_eq!(m.deny.len(), 1);
        s.shadow = true;
        let line = e.feed(&mut m, &s, &nets(&["10.1.0.0/16", "10.2.0.0/16"])).unwrap();
        assert!(line.contains("in shadow"), "{line}");
        assert!(m.deny.is_empty(), "shadow wrote or kept entries");
        assert_eq!(e.deny_layer().feeds()["x"].networks, 2);
        s.shadow = false;
        e.feed(&mut m, &s, &nets(&["10.1.0.0/16"])).unwrap();
        e.drop_unnamed_feeds(&mut m, &[]).unwrap();
        assert!(m.deny.is_empty() && e.deny_layer().feeds().is_empty());
    }
}

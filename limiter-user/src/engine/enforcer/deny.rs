//! The deny set's layer of the policy state: who denies what (feeds,
//! CrowdSec, escalation), under the operator and the file (the data
//! plane asks the set only below their `allow` and `deny`). Each source
//! keeps its own state and rules and answers the same walks
//! ([`DenySource`]); the layer owns the set, writes it to the kernel
//! after each change (read back from the pins if a write fails), and
//! reads it back from the pins at a restart.

use std::collections::BTreeSet;

use ipnet::IpNet;

use super::ApplyError;
use crate::{
    control::PrefixEntry,
    crowdsec::Pulled,
    dataplane::{
        LoadError, PolicyMaps,
        deny::{DenySet, DenyWrites},
    },
    policy::{Policy, crowdsec::Crowdsec, feed::Feed},
};

use self::crowdsec::Decisions;
pub use self::feeds::{FeedState, Feeds};

/// Kernel entries the deny set takes, all origins together: networks
/// and the markers of those finer than the bucket prefix (the map's size).
pub const DENY_CAPACITY: usize = limiter_common::maps::MAX_DENIES as usize;

/// A source of decisions over the deny set: what the layer asks of every
/// one of them, whatever it reads (a country list next is one more).
pub trait DenySource {
    /// A policy was applied: lift what it no longer names.
    fn follow(&mut self, set: &mut DenySet, policy: &Policy);

    /// Lift what ends at `now`; its line, if anything did.
    fn expire(&mut self, _set: &mut DenySet, _now: u64) -> Option<String> {
        None
    }

    /// When the next of its decisions ends.
    fn next_end(&self) -> Option<u64> {
        None
    }

    /// What `prefix list` shows of it: at most `limit` entries, and how
    /// many more.
    fn entries(&self, _set: &DenySet, _limit: usize) -> (Vec<PrefixEntry>, usize) {
        (Vec::new(), 0)
    }

    /// The set was read back from the pins at a restart.
    fn restored(&mut self, _set: &DenySet) {}
}

/// The deny set and its sources.
#[derive(Debug)]
pub struct DenyLayer {
    pub(super) set: DenySet,
    feeds: Feeds,
    crowdsec: Decisions,
}

impl Default for DenyLayer {
    fn default() -> Self {
        Self { set: DenySet::new(DENY_CAPACITY, 24, 56), feeds: Feeds::default(), crowdsec: Decisions::default() }
    }
}

impl DenyLayer {
    /// Every source, for the walks.
    fn sources(&mut self) -> (&mut DenySet, [&mut dyn DenySource; 2]) {
        (&mut self.set, [&mut self.feeds, &mut self.crowdsec])
    }

    /// The deny set's networks that hold `addr`, with their origins.
    #[must_use]
    pub fn covering(&self, addr: std::net::IpAddr) -> Vec<(IpNet, Vec<&str>)> {
        self.set.covering(addr)
    }

    /// The set's networks by origin name.
    #[must_use]
    pub fn counts(&self) -> std::collections::HashMap<&String, usize> {
        self.origins().map(|(i, n)| (n, self.set.count_of(crate::dataplane::deny::OriginId(i)))).collect()
    }

    /// The origins named, with their index.
    pub fn origins(&self) -> impl Iterator<Item = (u16, &String)> {
        (0u16..).zip(self.set.names()).filter(|(_, n)| !n.is_empty())
    }

    #[must_use]
    pub fn feeds(&self) -> &std::collections::BTreeMap<String, FeedState> {
        &self.feeds.0
    }

    /// CrowdSec's decisions.
    #[must_use]
    pub fn crowdsec(&self) -> &Decisions {
        &self.crowdsec
    }

    /// The set as the kernel has it (the pins), its markers under the
    /// bucket prefixes in force; a write a crash cut short is mended.
    pub fn restore(&mut self, maps: &mut impl PolicyMaps) -> Result<usize, LoadError> {
        let bucket = maps.active_config()?.map_or((24, 56), |c| (prefix_u8(c.v4_prefix), prefix_u8(c.v6_prefix)));
        let (set, mend) = DenySet::restore(DENY_CAPACITY, bucket, maps.deny_pinned()?);
        // A mend the kernel will not take (a map a build before this one
        // filled past its size) keeps no daemon from starting: the set
        // stays as the kernel enforces it, and the next change mends it.
        if let Err(e) = maps.write_deny(&mend) {
            tracing::warn!(event = "deny_set", "limiter: mending the pinned deny set: {e}; it is enforced as pinned");
        }
        self.set = set;
        Ok(self.set.len())
    }

    /// At a restart: the set read back from the pins, and each source
    /// told what they hold.
    pub(super) fn read_back(&mut self, maps: &mut impl PolicyMaps) -> Result<(), LoadError> {
        let networks = self.restore(maps)?;
        if networks > 0 {
            tracing::info!(event = "deny_set", "limiter: the deny set's {networks} networks read back from the pins");
        }
        let (set, sources) = self.sources();
        for s in sources {
            s.restored(set);
        }
        Ok(())
    }

    /// The set's markers follow a policy whose bucket prefixes changed:
    /// the new ones before the switch (`before`), the old ones gone
    /// after it.
    pub(super) fn rebucket(&mut self, v4: u32, v6: u32) -> (DenyWrites, DenyWrites) {
        let (v4, v6) = (prefix_u8(v4), prefix_u8(v6));
        if self.set.bucket() == (v4, v6) {
            return (DenyWrites::default(), DenyWrites::default());
        }
        self.set.set_bucket(v4, v6)
    }

    /// A policy was applied: what its sources no longer name is lifted.
    pub fn follow(&mut self, maps: &mut impl PolicyMaps, policy: &Policy) -> Result<(), LoadError> {
        let (set, sources) = self.sources();
        for s in sources {
            s.follow(set, policy);
        }
        self.write(maps).map(drop)
    }

    /// Lift what ends at `now`, every source; `None` when nothing did.
    pub fn expire(&mut self, maps: &mut impl PolicyMaps, now: u64) -> Option<Result<String, ApplyError>> {
        let (set, sources) = self.sources();
        let lines: Vec<String> = sources.into_iter().filter_map(|s| s.expire(set, now)).collect();
        if lines.is_empty() {
            return None;
        }
        Some(self.write(maps).map(|_| lines.join("; ")).map_err(ApplyError::from))
    }

    /// When the next decision of any source ends.
    #[must_use]
    pub fn next_end(&self) -> Option<u64> {
        [self.feeds.next_end(), self.crowdsec.next_end()].into_iter().flatten().min()
    }

    /// What `prefix list` shows of the sources: at most `limit`, and how
    /// many more.
    #[must_use]
    pub fn entries(&self, limit: usize) -> (Vec<PrefixEntry>, usize) {
        let (mut out, mut more) = (Vec::new(), 0);
        for s in [&self.feeds as &dyn DenySource, &self.crowdsec] {
            let (e, m) = s.entries(&self.set, limit.saturating_sub(out.len()));
            out.extend(e);
            more += m;
        }
        (out, more)
    }

    /// Write what changed in the set (its names first: a restart reads
    /// them with the entries), and say what; on a failure the set is read
    /// back as the kernel has it.
    pub(super) fn write(&mut self, maps: &mut impl PolicyMaps) -> Result<DenyWrites, LoadError> {
        let ch = self.set.finish();
        let written = maps.set_deny_origins(self.set.names()).and_then(|()| maps.write_deny(&ch));
        match written {
            Ok(()) => Ok(ch),
            Err(e) => {
                let _ = self.restore(maps);
                Err(e)
            }
        }
    }

    /// Take a new version of the feed `spec` (see [`Feeds::take`]).
    pub fn feed(
        &mut self,
        maps: &mut impl PolicyMaps,
        spec: &Feed,
        nets: &BTreeSet<IpNet>,
    ) -> Result<String, ApplyError> {
        let taken = self.feeds.take(&mut self.set, spec, nets);
        let written = self.write(maps);
        let version = taken?;
        let ch = written?;
        let line = version.line(spec, &ch);
        self.feeds.0.insert(spec.name.clone(), version.state);
        Ok(line)
    }

    /// Take a pull of CrowdSec's decision stream, or a part of one (see
    /// [`Decisions::take`]).
    pub fn pull(&mut self, maps: &mut impl PolicyMaps, spec: &Crowdsec, pulled: Pulled) -> Result<String, ApplyError> {
        let line = self.crowdsec.take(&mut self.set, spec, pulled);
        self.write(maps)?;
        Ok(line)
    }
}

fn prefix_u8(len: u32) -> u8 {
    u8::try_from(len.min(128)).unwrap_or(128)
}

mod crowdsec;
mod feeds;
pub mod series;

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::{dataplane::FakeMaps, engine::Enforcer};

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
        let line = e.deny_mut().feed(&mut m, &s, &nets(&["10.0.0.1/32", "10.1.0.0/16", "10.0.0.0/7"])).unwrap();
        assert!(line.contains("2 networks") && line.contains("1 wider than /8"), "{line}");
        // Two networks, and the /32's marker under its /24.
        assert_eq!(m.deny.len(), 3);
        assert_eq!(m.deny_origins, vec!["feed:x".to_owned()]);
        let past_cap = nets(&["10.0.0.1/32", "10.0.0.2/32", "10.0.0.3/32", "10.0.0.4/32", "10.0.0.5/32"]);
        let e1 = e.deny_mut().feed(&mut m, &s, &past_cap).unwrap_err().to_string();
        assert!(e1.contains("past its cap of 4") && e1.contains("its last version stays"), "{e1}");
        assert_eq!(m.deny.len(), 3, "a refused version wrote nothing");
        let e2 = e.deny_mut().feed(&mut m, &s, &BTreeSet::new()).unwrap_err().to_string();
        assert!(e2.contains("shrank by more than 50%"), "{e2}");
        e.deny_mut().feed(&mut m, &s, &nets(&["10.0.0.1/32"])).unwrap();
        assert_eq!(m.deny.len(), 2, "the /16 lifted, the /32 and its marker stay");
        assert_eq!(e.deny_layer().feeds()["x"].refusals, 2);
    }

    /// A version that does not fit the set (counted in kernel entries,
    /// markers included) is refused whole, and the last one stays as it
    /// was, in the set and in the kernel (not part of it taken, the status
    /// claiming all of it, and the kernel refusing the rest).
    #[test]
    fn a_version_past_the_sets_room_is_refused_whole() {
        let (mut e, mut m) = (Enforcer::new(0, 1024), FakeMaps::default());
        e.deny_mut().set = DenySet::new(6, 24, 56);
        let s = spec();
        e.deny_mut().feed(&mut m, &s, &nets(&["10.0.0.1/32", "10.0.1.1/32"])).unwrap();
        let kernel = m.deny.clone();
        assert_eq!(kernel.len(), 4, "two /32s and their markers");
        // Four /32s in four /24s: eight entries, past six.
        let big = nets(&["10.0.0.1/32", "10.0.2.1/32", "10.0.3.1/32", "10.0.4.1/32"]);
        let err = e.deny_mut().feed(&mut m, &s, &big).unwrap_err().to_string();
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
        e.deny_mut().feed(&mut m, &s, &nets(&["10.0.0.1/32", "10.1.0.0/16", "10.2.0.0/16"])).unwrap();
        let held = m.deny.len();
        // A new daemon: the set read back from the pins, no version applied.
        let mut e = Enforcer::new(0, 1024);
        e.deny_mut().restore(&mut m).unwrap();
        let err = e.deny_mut().feed(&mut m, &s, &BTreeSet::new()).unwrap_err().to_string();
        assert!(err.contains("shrank by more than 50%") && err.contains("its last version stays"), "{err}");
        assert_eq!(m.deny.len(), held, "the truncated file lifted networks");
        let err = e.deny_mut().feed(&mut m, &s, &nets(&["10.0.0.1/32"])).unwrap_err().to_string();
        assert!(err.contains("shrank by more than 50%"), "{err}");
        // A version within the guard is taken, and then the guard follows it.
        let line = e.deny_mut().feed(&mut m, &s, &nets(&["10.0.0.1/32", "10.1.0.0/16"])).unwrap();
        assert!(line.contains("2 networks (was 3;"), "{line}");
    }

    #[test]
    fn a_feed_in_shadow_is_counted_not_enforced_and_a_feed_gone_is_lifted() {
        let (mut e, mut m) = (Enforcer::new(0, 1024), FakeMaps::default());
        let mut s = spec();
        e.deny_mut().feed(&mut m, &s, &nets(&["10.1.0.0/16"])).unwrap();
        assert_eq!(m.deny.len(), 1);
        s.shadow = true;
        let line = e.deny_mut().feed(&mut m, &s, &nets(&["10.1.0.0/16", "10.2.0.0/16"])).unwrap();
        assert!(line.contains("in shadow"), "{line}");
        assert!(m.deny.is_empty(), "shadow wrote or kept entries");
        assert_eq!(e.deny_layer().feeds()["x"].networks, 2);
        s.shadow = false;
        e.deny_mut().feed(&mut m, &s, &nets(&["10.1.0.0/16"])).unwrap();
        e.deny_mut().follow(&mut m, &crate::policy::Policy::default()).unwrap();
        assert!(m.deny.is_empty() && e.deny_layer().feeds().is_empty());
    }
}

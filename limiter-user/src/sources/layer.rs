//! The sources' layer of the policy state: each `[[source]]`'s networks
//! as its last version read whole put them, and what they decide under
//! the policy in force (each network at most as fine as its bucket; the
//! first section of the file that names a network decides it). The
//! engine puts this layer below the operator's and the file's overrides.

use std::collections::{BTreeMap, BTreeSet};

use ipnet::IpNet;

use super::section::{MIN_PREFIX, Source};
use crate::policy::{OverrideAction, Policy, words::Action};

/// A source's version in force.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Set {
    /// The section it was read under (kind and action).
    pub kind: String,
    pub action: Action,
    pub nets: BTreeSet<IpNet>,
    /// Unix time it was put in force.
    pub at: u64,
}

/// What a source decides about one network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decided<'a> {
    pub action: OverrideAction,
    /// The source's name.
    pub by: &'a str,
}

/// Every source's version in force, by name.
#[derive(Debug, Default)]
pub struct SourceLayer {
    sets: BTreeMap<String, Set>,
}

impl SourceLayer {
    /// Put `nets` in force as `spec`'s new version, unless one is wider
    /// than [`MIN_PREFIX`], they are more than its `max_networks`, or
    /// they lost more than its `max_shrink` of the last version. Returns
    /// the version it replaced (to [`put back`](Self::put_back) if the
    /// policy with it cannot be applied).
    pub fn set(&mut self, spec: &Source, nets: BTreeSet<IpNet>, now: u64) -> Result<Option<Set>, String> {
        if let Some(wide) = nets.iter().find(|n| crate::policy::feed::wider_than(n, MIN_PREFIX.0, MIN_PREFIX.1)) {
            return Err(format!(
                "{wide} is wider than a source may name (IPv4 /{}, IPv6 /{})",
                MIN_PREFIX.0, MIN_PREFIX.1
            ));
        }
        if nets.len() > spec.max_networks {
            return Err(format!("{} networks, more than its max_networks {}", nets.len(), spec.max_networks));
        }
        let action = spec.action();
        if let Some(old) = self.sets.get(&spec.name).filter(|o| o.kind == spec.kind && o.action == action) {
            crate::nets::check_shrink(old.nets.len(), nets.len(), spec.max_shrink).map_err(|e| e.to_string())?;
        }
        let set = Set { kind: spec.kind.clone(), action, nets, at: now };
        Ok(self.sets.insert(spec.name.clone(), set))
    }

    /// Put `name`'s version back as it was before a [`set`](Self::set).
    pub fn put_back(&mut self, name: &str, old: Option<Set>) {
        match old {
            Some(set) => self.sets.insert(name.to_owned(), set),
            None => self.sets.remove(name),
        };
    }

    /// Forget the versions whose section `base` no longer holds as they
    /// were read (gone, or another kind or action).
    pub fn follow(&mut self, base: &Policy) {
        self.sets.retain(|name, set| base.sources.iter().any(|s| s.name == *name && in_force(s, set)));
    }

    /// What the sources decide under `base`, by network (each made no
    /// finer than its bucket prefix).
    #[must_use]
    pub fn decided(&self, base: &Policy) -> BTreeMap<IpNet, Decided<'_>> {
        let mut out = BTreeMap::new();
        for spec in &base.sources {
            let Some((name, set)) = self.sets.get_key_value(&spec.name).filter(|(_, set)| in_force(spec, set)) else {
                continue;
            };
            let action = match set.action {
                Action::Deny => OverrideAction::Deny,
                _ => OverrideAction::Allow,
            };
            for net in &set.nets {
                out.entry(bucketed(*net, base)).or_insert(Decided { action, by: name.as_str() });
            }
        }
        out
    }

    /// Each source's version in force.
    pub fn sets(&self) -> impl Iterator<Item = (&String, &Set)> {
        self.sets.iter()
    }
}

/// Whether `set` was read under `spec` as it stands.
fn in_force(spec: &Source, set: &Set) -> bool {
    spec.kind == set.kind && spec.action() == set.action
}

/// `net` no finer than `base`'s bucket prefix of its family.
fn bucketed(net: IpNet, base: &Policy) -> IpNet {
    let bucket = match net {
        IpNet::V4(_) => base.v4_prefix,
        IpNet::V6(_) => base.v6_prefix.min(limiter_common::MAX_V6_BUCKET_PREFIX),
    };
    let bucket = u8::try_from(bucket).unwrap_or(u8::MAX);
    if net.prefix_len() <= bucket { net } else { IpNet::new(net.addr(), bucket).map_or(net, |n| n.trunc()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, action: Action) -> Source {
        Source {
            name: name.into(),
            kind: "test".into(),
            path: "/x".into(),
            action: Some(action),
            refresh: std::time::Duration::from_mins(1),
            max_networks: 4,
            max_shrink: 0.5,
        }
    }

    fn nets(v: &[&str]) -> BTreeSet<IpNet> {
        v.iter().map(|n| n.parse().unwrap()).collect()
    }

    #[test]
    fn networks_decide_per_bucket_and_the_first_section_wins() {
        let (office, blocked) = (spec("office", Action::Allow), spec("blocked", Action::Deny));
        let base = Policy { sources: vec![office.clone(), blocked.clone()], ..Policy::default() };
        let mut layer = SourceLayer::default();
        layer.set(&office, nets(&["198.18.7.9/32", "198.18.0.0/16", "2001:2::1/128"]), 1).unwrap();
        layer.set(&blocked, nets(&["198.18.7.0/24", "198.19.1.0/24"]), 1).unwrap();
        let d = layer.decided(&base);
        let at = |n: &str| d.get(&n.parse().unwrap()).map(|d| (d.action, d.by));
        assert_eq!(at("198.18.7.0/24"), Some((OverrideAction::Allow, "office")), "the first section decides");
        assert_eq!(at("198.18.0.0/16"), Some((OverrideAction::Allow, "office")), "a wider network stays as it is");
        assert_eq!(at("2001:2::/56"), Some((OverrideAction::Allow, "office")), "an address counts for its bucket");
        assert_eq!(at("198.19.1.0/24"), Some((OverrideAction::Deny, "blocked")));
        assert_eq!(d.len(), 4);
    }

    #[test]
    fn a_wide_large_or_shrunk_version_is_refused_and_the_last_stays() {
        let office = spec("office", Action::Allow);
        let mut layer = SourceLayer::default();
        let e = layer.set(&office, nets(&["0.0.0.0/0"]), 1).unwrap_err();
        assert!(e.contains("0.0.0.0/0 is wider"), "{e}");
        assert!(layer.set(&office, nets(&["2001::/15"]), 1).is_err(), "an IPv6 /15 was taken");
        let five = nets(&["198.18.1.0/24", "198.18.2.0/24", "198.18.3.0/24", "198.18.4.0/24", "198.18.5.0/24"]);
        assert!(layer.set(&office, five, 1).unwrap_err().contains("more than its max_networks 4"));
        let four = nets(&["198.18.1.0/24", "198.18.2.0/24", "198.18.3.0/24", "198.18.4.0/24"]);
        assert_eq!(layer.set(&office, four.clone(), 1), Ok(None));
        let e = layer.set(&office, nets(&["198.18.1.0/24"]), 2).unwrap_err();
        assert!(e.contains("shrank"), "{e}");
        assert_eq!(layer.sets().next().map(|(_, s)| &s.nets), Some(&four), "a refused version replaced the last");
        let old = layer.set(&office, nets(&["198.18.1.0/24", "198.18.2.0/24"]), 3).unwrap();
        layer.put_back("office", old);
        assert_eq!(layer.sets().next().map(|(_, s)| &s.nets), Some(&four), "put back");
    }

    #[test]
    fn a_section_gone_or_changed_decides_nothing_and_is_forgotten() {
        let office = spec("office", Action::Allow);
        let mut layer = SourceLayer::default();
        layer.set(&office, nets(&["198.18.1.0/24"]), 1).unwrap();
        let denying = Policy { sources: vec![spec("office", Action::Deny)], ..Policy::default() };
        assert!(layer.decided(&denying).is_empty(), "a version read to allow would deny");
        layer.follow(&Policy { sources: vec![office.clone()], ..Policy::default() });
        assert_eq!(layer.sets().count(), 1);
        layer.follow(&Policy::default());
        assert_eq!(layer.sets().count(), 0);
    }
}

//! The country and ASN groups' layer of the policy state: which group
//! holds each network of the data plane's tries. An address is in the
//! first group of the policy (the lowest index) that holds its network;
//! a version of a group's networks is taken as a diff against what the
//! tries hold, so a monthly file changes only what moved.

use std::collections::{HashMap, HashSet};

use ipnet::IpNet;

use super::section::Group;
use crate::{
    dataplane::{LoadError, PolicyMaps, groups::GroupWrites},
    engine::error::ApplyError,
    policy::Policy,
};

/// What identifies the networks a group's section selects: a change of
/// its action or budget keeps them.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Identity {
    name: String,
    path: std::path::PathBuf,
    countries: Vec<String>,
    asns: Vec<u32>,
    allow_bogons: bool,
    bucket: (u32, u32),
}

impl Identity {
    /// `g`'s, under bucket prefixes `bucket` (IPv4, IPv6).
    fn of(g: &Group, bucket: (u32, u32)) -> Self {
        Self {
            name: g.name.clone(),
            path: g.path.clone(),
            countries: g.countries.clone(),
            asns: g.asns.clone(),
            allow_bogons: g.allow_bogons,
            bucket,
        }
    }
}

/// What a group's index holds.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Holder {
    /// Read back from the pins at a start: kept until the group's first
    /// version (or a policy without a group at its index).
    Restored,
    Taken(Identity),
}

/// The groups' networks as the tries hold them.
#[derive(Debug, Default)]
pub struct GroupLayer {
    /// Every network, with the indexes (bits) of the groups that hold it.
    nets: HashMap<IpNet, u64>,
    /// By index: whose networks it holds, and how many.
    holders: HashMap<u32, (Holder, usize)>,
}

/// The index a network's bits give it in the tries: the lowest.
fn index_of(bits: u64) -> u32 {
    bits.trailing_zeros()
}

impl GroupLayer {
    /// How many networks group `index` holds in the tries.
    #[must_use]
    #[cfg(test)]
    pub fn networks(&self, index: u32) -> usize {
        self.holders.get(&index).map_or(0, |h| h.1)
    }

    /// The most specific network of the tries that holds `net` (a bucket
    /// prefix) whole, and its group's index, as the data plane's longest
    /// match finds them.
    #[must_use]
    pub fn decided(&self, net: &IpNet) -> Option<(IpNet, u32)> {
        (0..=net.prefix_len()).rev().find_map(|len| {
            let n = IpNet::new(net.addr(), len).ok()?.trunc();
            self.nets.get(&n).map(|bits| (n, index_of(*bits)))
        })
    }

    /// At a start: the tries as pinned.
    pub fn read_back(&mut self, maps: &mut impl PolicyMaps) -> Result<(), LoadError> {
        for (net, index) in maps.groups_pinned()? {
            if index < 64 {
                self.nets.insert(net, 1 << index);
                self.holders.entry(index).or_insert((Holder::Restored, 0)).1 += 1;
            }
        }
        Ok(())
    }

    /// Take a version of group `index`'s networks (none finer than the
    /// bucket prefixes, which the reader saw to), selected under `g` and
    /// the bucket prefixes `bucket`. A version the tries could not hold is refused before any
    /// write; the layer records what the tries took once they took it.
    pub fn take(
        &mut self,
        maps: &mut impl PolicyMaps,
        index: u32,
        g: &Group,
        bucket: (u32, u32),
        nets: &HashSet<IpNet>,
    ) -> Result<String, ApplyError> {
        let bit = 1u64 << index;
        let (mut w, mut changed) = self.give_up(index, |net| !nets.contains(net));
        let (mut added, removed) = (0usize, changed.len());
        for net in nets {
            let bits = self.nets.get(net).copied().unwrap_or(0);
            if bits & bit == 0 {
                let now = bits | bit;
                if index_of(now) != index_of(bits) || bits == 0 {
                    w.upserts.push((*net, index_of(now)));
                }
                changed.push((*net, now));
                added += 1;
            }
        }
        if let Some(why) = self.overfills(&w, limiter_common::groups::MAX_NETWORKS as usize) {
            return Err(ApplyError::Request(format!("group {}: {why}; its last version stays", g.name)));
        }
        let t = std::time::Instant::now();
        let longest = maps.write_groups(&w)?;
        let took = t.elapsed();
        self.commit(changed);
        self.holders.insert(index, (Holder::Taken(Identity::of(g, bucket)), nets.len()));
        Ok(format!(
            "group {}: {} networks ({added} added, {removed} removed; {} writes in {:.3} s, the longest {} us)",
            g.name,
            nets.len(),
            w.upserts.len() + w.deletes.len(),
            took.as_secs_f64(),
            longest.as_micros()
        ))
    }

    /// The policy `p` is in force: an index whose group is gone, or
    /// selects other networks now, gives its networks up (its watcher
    /// reads the new ones).
    pub fn follow(&mut self, maps: &mut impl PolicyMaps, p: &Policy) -> Result<(), LoadError> {
        let stale: Vec<u32> = self
            .holders
            .iter()
            .filter(|(i, (h, _))| match (p.groups.get(**i as usize), h) {
                (None, _) => true,
                (Some(_), Holder::Restored) => false,
                (Some(g), Holder::Taken(id)) => *id != Identity::of(g, (p.v4_prefix, p.v6_prefix)),
            })
            .map(|(i, _)| *i)
            .collect();
        for index in stale {
            let (w, changed) = self.give_up(index, |_| true);
            maps.write_groups(&w)?;
            self.commit(changed);
            self.holders.remove(&index);
        }
        Ok(())
    }

    /// The writes that take group `index` off its networks `which` picks,
    /// and each such network's groups after.
    fn give_up(&self, index: u32, which: impl Fn(&IpNet) -> bool) -> (GroupWrites, Vec<(IpNet, u64)>) {
        let bit = 1u64 << index;
        let (mut w, mut changed) = (GroupWrites::default(), Vec::new());
        for (net, bits) in &self.nets {
            if bits & bit != 0 && which(net) {
                let left = bits & !bit;
                if left == 0 {
                    w.deletes.push(*net);
                } else if index_of(left) != index_of(*bits) {
                    w.upserts.push((*net, index_of(left)));
                }
                changed.push((*net, left));
            }
        }
        (w, changed)
    }

    /// Why the tries (`cap` networks of each family) would not take `w`
    /// whole, if they would not: a version is refused before any write,
    /// never half written.
    fn overfills(&self, w: &GroupWrites, cap: usize) -> Option<String> {
        let v4 = |n: &IpNet| n.addr().is_ipv4();
        let new = |fam: bool| w.upserts.iter().filter(|(n, _)| v4(n) == fam && !self.nets.contains_key(n)).count();
        let gone = |fam: bool| w.deletes.iter().filter(|n| v4(n) == fam).count();
        [(true, "IPv4"), (false, "IPv6")].into_iter().find_map(|(fam, name)| {
            let after = self.nets.keys().filter(|n| v4(n) == fam).count() + new(fam) - gone(fam);
            (after > cap).then(|| {
                format!("{after} {name} networks of all groups together, more than the {cap} the data plane holds")
            })
        })
    }

    /// Record what the tries took: each network's groups (none: gone).
    fn commit(&mut self, changed: Vec<(IpNet, u64)>) {
        for (net, bits) in changed {
            if bits == 0 {
                self.nets.remove(&net);
            } else {
                self.nets.insert(net, bits);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::FakeMaps;

    fn policy(groups: &str) -> Policy {
        crate::policy::file::parse("t", format!("rate = 10\n{groups}")).unwrap().policy
    }

    fn set(nets: &[&str]) -> HashSet<IpNet> {
        nets.iter().map(|n| n.parse().unwrap()).collect()
    }

    /// The default bucket prefixes (the test policies keep them).
    const B: (u32, u32) = (24, 56);

    const TWO: &str = "[[group]]\nname = \"a\"\npath = \"/a\"\nasns = [1]\nrate = 5\n\
                       [[group]]\nname = \"b\"\npath = \"/b\"\nasns = [2]\nrate = 5\n";

    #[test]
    fn a_network_of_two_groups_is_the_first_ones_and_a_new_version_changes_only_what_moved() {
        let (p, mut maps, mut l) = (policy(TWO), FakeMaps::default(), GroupLayer::default());
        let net = |s: &str| s.parse::<IpNet>().unwrap();
        l.take(&mut maps, 1, &p.groups[1], B, &set(&["198.18.0.0/24", "198.18.1.0/24"])).unwrap();
        l.take(&mut maps, 0, &p.groups[0], B, &set(&["198.18.1.0/24", "198.18.2.0/24"])).unwrap();
        assert_eq!(maps.groups.get(&net("198.18.0.0/24")), Some(&1));
        assert_eq!(maps.groups.get(&net("198.18.1.0/24")), Some(&0), "the first group of the policy holds it");
        // Group a's next version leaves 198.18.1.0/24: group b holds it again.
        let line = l.take(&mut maps, 0, &p.groups[0], B, &set(&["198.18.2.0/24", "198.18.3.0/24"])).unwrap();
        assert!(line.contains("1 added, 1 removed"), "{line}");
        assert_eq!(maps.groups.get(&net("198.18.1.0/24")), Some(&1));
        assert_eq!(maps.groups.len(), 4);
        assert_eq!((l.networks(0), l.networks(1)), (2, 2));
    }

    #[test]
    fn a_group_gone_from_the_policy_gives_its_networks_up_and_a_changed_budget_keeps_them() {
        let (p, mut maps, mut l) = (policy(TWO), FakeMaps::default(), GroupLayer::default());
        l.take(&mut maps, 0, &p.groups[0], B, &set(&["198.18.0.0/24"])).unwrap();
        l.take(&mut maps, 1, &p.groups[1], B, &set(&["198.18.9.0/24"])).unwrap();
        let cheaper = policy(&TWO.replace("rate = 5\n[[group]]", "rate = 7\n[[group]]"));
        l.follow(&mut maps, &cheaper).unwrap();
        assert_eq!(maps.groups.len(), 2, "a new rate selects the same networks");
        let one = policy("[[group]]\nname = \"a\"\npath = \"/a\"\nasns = [1]\nrate = 5\n");
        l.follow(&mut maps, &one).unwrap();
        assert_eq!(maps.groups.keys().map(ToString::to_string).collect::<Vec<_>>(), ["198.18.0.0/24"]);
    }

    #[test]
    fn a_version_the_tries_cannot_hold_is_refused_before_any_write() {
        let (p, mut maps, mut l) = (policy(TWO), FakeMaps::default(), GroupLayer::default());
        l.take(&mut maps, 0, &p.groups[0], B, &set(&["198.18.0.0/24", "198.18.1.0/24"])).unwrap();
        let three = GroupWrites {
            upserts: ["198.18.2.0/24", "198.18.1.0/24"].iter().map(|n| (n.parse().unwrap(), 1)).collect(),
            deletes: Vec::new(),
        };
        let why = l.overfills(&three, 2).unwrap();
        assert!(why.starts_with("3 IPv4 networks"), "{why}");
        let swap = GroupWrites { deletes: vec!["198.18.0.0/24".parse().unwrap()], ..three };
        assert_eq!(l.overfills(&swap, 2), None, "one in, one out");
    }

    #[test]
    fn networks_read_back_at_a_start_stay_until_their_group_reads_its_file() {
        let (p, mut maps) = (policy(TWO), FakeMaps::default());
        maps.groups.insert("198.18.0.0/24".parse().unwrap(), 0);
        maps.groups.insert("198.18.5.0/24".parse().unwrap(), 7);
        let mut l = GroupLayer::default();
        l.read_back(&mut maps).unwrap();
        l.follow(&mut maps, &p).unwrap();
        assert_eq!(maps.groups.len(), 1, "index 7 has no group in the policy");
        l.take(&mut maps, 0, &p.groups[0], B, &set(&["198.18.1.0/24"])).unwrap();
        assert_eq!(maps.groups.keys().map(ToString::to_string).collect::<Vec<_>>(), ["198.18.1.0/24"]);
    }
}

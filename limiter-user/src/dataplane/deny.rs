//! The deny set as userspace keeps it: every denied network with the
//! origins that denied it (a feed, a CrowdSec origin), the markers of
//! networks finer than the bucket prefix, and how many networks each
//! prefix length holds. Each change to it is a [`DenyWrites`], the kernel
//! writes in the order that keeps the data plane whole: the lengths in
//! use grow first, then networks and markers are written, then removed,
//! then `ACTIVE`'s change count moves (buckets re-resolve) and the
//! lengths shrink. At no moment is a network that both the old and the
//! new set deny let through. See `limiter_common::deny` for the layout.

use std::collections::{HashMap, HashSet};

use ipnet::IpNet;
use limiter_common::{
    Family,
    deny::{DENIED, DenyKey, DenyLens, FINER, MAX_ORIGINS, OWNER_KEY},
    family,
};

/// Origins one set may name at once (an owner set is a 64-bit mask).
pub const MAX_NAMED: usize = 64;

/// Who denied a network, as the set numbers it: an index of
/// `DENY_ORIGINS` (the name there is the origin).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OriginId(pub u16);

/// What a change of the set does to the kernel's maps, in order.
#[derive(Debug, Default, PartialEq)]
pub struct DenyWrites {
    /// The lengths in use while the change is written (the old and the
    /// new ones), if they differ from those in force.
    pub lens_during: Option<DenyLens>,
    /// Entries written (new networks, markers, changed values).
    pub upserts: Vec<(DenyKey, u32)>,
    /// Entries removed.
    pub deletes: Vec<DenyKey>,
    /// The lengths in use once it is written, if they differ from
    /// `lens_during`.
    pub lens_after: Option<DenyLens>,
}

impl DenyWrites {
    /// Whether it changes nothing.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.upserts.is_empty() && self.deletes.is_empty() && self.lens_during.is_none() && self.lens_after.is_none()
    }
}

/// Why a network was not taken.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DenyError {
    #[error("the deny set holds networks of {0} IPv6 prefix lengths already (at most {max})", max = limiter_common::deny::MAX_LENS)]
    TooManyLengths(usize),
    #[error(
        "the deny set is full ({0} kernel entries: networks and the markers of those finer than the bucket prefix)"
    )]
    Full(usize),
    #[error("more than {MAX_NAMED} origins")]
    TooManyOrigins,
}

/// The deny set as pinned (read back at a restart).
#[derive(Debug, Default)]
pub struct Pinned {
    pub entries: Vec<(DenyKey, u32)>,
    pub names: Vec<String>,
    pub lens: DenyLens,
}

/// The set, as userspace keeps it.
#[derive(Debug)]
pub struct DenySet {
    /// Denied networks and the origins (bits) that denied each.
    nets: HashMap<DenyKey, u64>,
    /// Markers: a bucket prefix's key, and how many finer networks lie in it.
    markers: HashMap<DenyKey, u32>,
    /// Networks per prefix length: IPv4's 0..=32, IPv6's 0..=128.
    counts: [[u32; 129]; 2],
    /// Networks each origin denies, by index (kept as the set changes, so
    /// reading them never walks the set).
    per_origin: [usize; MAX_NAMED],
    /// The bucket prefix lengths the markers are under (IPv4, IPv6).
    bucket: [u8; 2],
    /// Names of the origins, by index (empty: free).
    names: Vec<String>,
    /// Kernel entries the set may take (networks and markers).
    capacity: usize,
    /// The lengths the kernel has in force.
    lens: DenyLens,
    /// Keys touched by the change being built, with their value and
    /// origins before it.
    before: HashMap<DenyKey, (u32, u64)>,
    /// Owner records: each network's origins past its lowest, one kernel
    /// entry each (see `limiter_common::deny::OWNER`).
    shared: usize,
}

/// The origins of `owners` past the lowest (those with owner records).
fn past_lowest(owners: u64) -> u64 {
    owners & owners.wrapping_sub(1)
}

/// The key of the owner record of `origin` for network `k`.
fn owner_key(k: &DenyKey, origin: u8) -> DenyKey {
    DenyKey { pad: [OWNER_KEY, origin], ..*k }
}

fn slot(fam: Family) -> usize {
    usize::from(fam != family::IPV4)
}

impl DenySet {
    /// An empty set of `capacity` kernel entries, its markers under buckets of
    /// `v4`/`v6` bits.
    #[must_use]
    pub fn new(capacity: usize, v4: u8, v6: u8) -> Self {
        Self {
            nets: HashMap::new(),
            markers: HashMap::new(),
            counts: [[0; 129]; 2],
            per_origin: [0; MAX_NAMED],
            bucket: [v4, v6],
            names: Vec::new(),
            capacity,
            lens: DenyLens::default(),
            before: HashMap::new(),
            shared: 0,
        }
    }

    /// The bucket prefix lengths the markers are under (IPv4, IPv6).
    #[must_use]
    pub fn bucket(&self) -> (u8, u8) {
        (self.bucket[0], self.bucket[1])
    }

    /// Room for `n` networks in all without growing.
    pub fn reserve(&mut self, n: usize) {
        self.nets.reserve(n.min(self.capacity).saturating_sub(self.nets.len()));
    }

    /// How many networks it holds.
    #[must_use]
    pub fn len(&self) -> usize {
        self.nets.len()
    }

    /// Whether it holds none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }

    /// How many networks `origin` denies.
    #[must_use]
    pub fn count_of(&self, origin: OriginId) -> usize {
        self.per_origin.get(usize::from(origin.0)).copied().unwrap_or(0)
    }

    /// How many networks the origin named `name` holds (0 if it has no
    /// index), without giving it one.
    #[must_use]
    pub fn count_named(&self, name: &str) -> usize {
        self.names.iter().position(|n| n == name).map_or(0, |i| self.per_origin.get(i).copied().unwrap_or(0))
    }

    /// The origin named `name`, if it has an index.
    #[must_use]
    pub fn named(&self, name: &str) -> Option<OriginId> {
        self.names.iter().position(|n| n == name).map(|i| OriginId(u16::try_from(i).unwrap_or(u16::MAX)))
    }

    /// The origin named `name`, given an index if it has none yet.
    pub fn origin(&mut self, name: &str) -> Result<OriginId, DenyError> {
        if let Some(i) = self.names.iter().position(|n| n == name) {
            return Ok(OriginId(u16::try_from(i).unwrap_or(u16::MAX)));
        }
        // A free index; else one whose origin denies nothing now (its
        // networks removed, or none ever taken): freed for the new one, so
        // that origins that came and went never use up the indexes.
        let unused = || (0..self.names.len()).find(|&i| self.per_origin[i] == 0);
        let i = match self.names.iter().position(String::is_empty) {
            Some(i) => i,
            None if self.names.len() < MAX_NAMED.min(MAX_ORIGINS as usize) => {
                self.names.push(String::new());
                self.names.len() - 1
            }
            None => unused().ok_or(DenyError::TooManyOrigins)?,
        };
        name.clone_into(&mut self.names[i]);
        Ok(OriginId(u16::try_from(i).unwrap_or(u16::MAX)))
    }

    /// Every origin's name, by index.
    #[must_use]
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The networks `origin` denies.
    pub fn of(&self, origin: OriginId) -> impl Iterator<Item = IpNet> + '_ {
        let bit = 1u64 << origin.0;
        self.nets.iter().filter(move |(_, o)| *o & bit != 0).map(|(k, _)| net_of(k))
    }

    /// The origins that deny `net` exactly.
    #[must_use]
    pub fn origins_of(&self, net: &IpNet) -> Vec<OriginId> {
        let bits = self.nets.get(&key_of(net)).copied().unwrap_or(0);
        (0..64).filter(|i| bits & (1 << i) != 0).map(OriginId).collect()
    }

    /// Every network of the set that holds `addr`, with the names of the
    /// origins that deny it, widest first: one lookup per length the set
    /// has networks of.
    #[must_use]
    pub fn covering(&self, addr: std::net::IpAddr) -> Vec<(IpNet, Vec<&str>)> {
        let (fam, max) = if addr.is_ipv4() { (0, 32) } else { (1, 128) };
        (0..=max)
            .filter(|len| self.counts[fam][usize::from(*len)] > 0)
            .filter_map(|len| IpNet::new(addr, len).ok().map(|n| n.trunc()))
            .filter_map(|net| {
                let names: Vec<&str> = self
                    .origins_of(&net)
                    .into_iter()
                    .filter_map(|o| self.names.get(usize::from(o.0)).map(String::as_str))
                    .collect();
                (!names.is_empty()).then_some((net, names))
            })
            .collect()
    }

    /// The kernel's value of `k` as the set is now (0: no entry).
    fn value(&self, k: &DenyKey) -> u32 {
        let net = self.nets.get(k).map_or(0, |o| DENIED | o.trailing_zeros());
        let marker = if self.markers.get(k).is_some_and(|n| *n > 0) { FINER } else { 0 };
        net | marker
    }

    fn touch(&mut self, k: DenyKey) {
        if !self.before.contains_key(&k) {
            let was = (self.value(&k), self.nets.get(&k).copied().unwrap_or(0));
            self.before.insert(k, was);
        }
    }

    /// Kernel entries in use: networks, markers and owner records.
    fn entries(&self) -> usize {
        self.nets.len() + self.markers.len() + self.shared
    }

    /// The marker of `k` under the bucket prefix, if `k` is finer.
    fn marker_of(&self, k: &DenyKey) -> Option<DenyKey> {
        let b = self.bucket[slot(k.family)];
        (k.len > b).then(|| DenyKey::of(k.family, k.addr, u32::from(b)))
    }

    /// `origin` denies `net` too.
    pub fn add(&mut self, origin: OriginId, net: &IpNet) -> Result<(), DenyError> {
        self.add_within(origin, net, limiter_common::deny::MAX_LENS)
    }

    /// [`DenySet::add`], but a network of an IPv6 prefix length not in use
    /// yet is refused once `v6_lens` lengths are in use: CrowdSec keeps
    /// within a budget, so that feeds and escalation always have lengths
    /// left (a network of a length in use always fits).
    pub fn add_within(&mut self, origin: OriginId, net: &IpNet, v6_lens: usize) -> Result<(), DenyError> {
        let k = key_of(net);
        let bit = 1u64 << origin.0;
        match self.nets.get(&k).copied() {
            Some(o) if o & bit != 0 => return Ok(()),
            Some(o) => {
                // One more origin: one owner record more.
                if self.entries() + 1 > self.capacity {
                    return Err(DenyError::Full(self.capacity));
                }
                self.touch(k);
                self.nets.insert(k, o | bit);
                self.per_origin[usize::from(origin.0)] += 1;
                self.shared += 1;
                return Ok(());
            }
            None => {}
        }
        // The kernel's entries: the networks and the markers of those finer
        // than the bucket prefix (a network on a marker's key counted twice:
        // a bound, never short).
        let marker = self.marker_of(&k).filter(|m| !self.markers.contains_key(m));
        if self.entries() + 1 + usize::from(marker.is_some()) > self.capacity {
            return Err(DenyError::Full(self.capacity));
        }
        let (s, len) = (slot(k.family), usize::from(k.len));
        if self.counts[s][len] == 0 && s == 1 {
            let in_use = self.counts[1].iter().filter(|c| **c > 0).count();
            if in_use >= v6_lens.min(limiter_common::deny::MAX_LENS) {
                return Err(DenyError::TooManyLengths(in_use));
            }
        }
        self.touch(k);
        self.nets.insert(k, bit);
        self.per_origin[usize::from(origin.0)] += 1;
        self.counts[s][len] += 1;
        if let Some(m) = self.marker_of(&k) {
            self.touch(m);
            *self.markers.entry(m).or_default() += 1;
        }
        Ok(())
    }

    /// `origin` no longer denies `net` (others may still).
    pub fn remove(&mut self, origin: OriginId, net: &IpNet) {
        let k = key_of(net);
        let bit = 1u64 << origin.0;
        let Some(o) = self.nets.get(&k).copied().filter(|o| o & bit != 0) else { return };
        self.touch(k);
        self.per_origin[usize::from(origin.0)] -= 1;
        if o != bit {
            self.nets.insert(k, o & !bit);
            self.shared -= 1;
            return;
        }
        self.nets.remove(&k);
        self.counts[slot(k.family)][usize::from(k.len)] -= 1;
        if let Some(m) = self.marker_of(&k) {
            self.touch(m);
            if let Some(n) = self.markers.get_mut(&m) {
                *n -= 1;
                if *n == 0 {
                    self.markers.remove(&m);
                }
            }
        }
    }

    /// Make `origin` deny exactly `nets`: a diff (only what changed moves).
    /// Stops at the first network not taken; what was done stays (and is
    /// in the change).
    pub fn replace(&mut self, origin: OriginId, nets: &HashSet<IpNet>) -> Result<(), DenyError> {
        let gone: Vec<IpNet> = self.of(origin).filter(|n| !nets.contains(n)).collect();
        for n in nets {
            self.add(origin, n)?;
        }
        for n in &gone {
            self.remove(origin, n);
        }
        Ok(())
    }
}

mod change;
mod kernel;
mod keys;
mod markers;
#[cfg(test)]
mod tests;

pub(crate) use self::kernel::{Active, SETTLE};
pub use self::{
    kernel::DenyMaps,
    keys::{key_of, net_of},
};

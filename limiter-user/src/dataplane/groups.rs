//! The country and ASN groups' maps (`limiter_common::groups`): the two
//! tries of their networks and each policy slot's limits. The tries are
//! written network by network (the kernel's LPM trie has no batch
//! update), then `ACTIVE`'s change count moves so that every bucket
//! resolves again.

use aya::{
    Ebpf,
    maps::{
        Array, MapData,
        lpm_trie::{Key, LpmTrie},
    },
};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use limiter_common::{
    deny::active,
    groups::{GroupLimits, MAX_GROUPS},
    maps,
};

use super::{LoadError, error::Named as _, rawmap::memlock};

/// `GROUPS4`, `GROUPS6` and `GROUP_LIMITS`.
pub struct GroupMaps {
    v4: LpmTrie<MapData, u32, u32>,
    v6: LpmTrie<MapData, [u32; 2], u32>,
    limits: Array<MapData, GroupLimits>,
}

/// A change of the tries: networks (none finer than a bucket prefix,
/// IPv6 no finer than /64) and the index each now holds, then those no
/// group holds any more.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct GroupWrites {
    pub upserts: Vec<(IpNet, u32)>,
    pub deletes: Vec<IpNet>,
}

impl GroupWrites {
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.upserts.is_empty() && self.deletes.is_empty()
    }
}

impl GroupMaps {
    pub(crate) fn take(ebpf: &mut Ebpf) -> Result<Self, LoadError> {
        let mut take = |name: &'static str| ebpf.take_map(name).ok_or(LoadError::MissingMap(name));
        Ok(Self {
            v4: LpmTrie::try_from(take(maps::GROUPS4)?).on(maps::GROUPS4)?,
            v6: LpmTrie::try_from(take(maps::GROUPS6)?).on(maps::GROUPS6)?,
            limits: Array::try_from(take(maps::GROUP_LIMITS)?).on(maps::GROUP_LIMITS)?,
        })
    }

    /// Write the limits of `CONFIG` slot `slot`: `limits` by index, every
    /// other index none.
    pub(crate) fn set_limits(&mut self, slot: u32, limits: &[GroupLimits]) -> Result<(), LoadError> {
        for i in 0..MAX_GROUPS {
            let l = limits.get(i as usize).copied().unwrap_or_default();
            let at = slot * MAX_GROUPS + i;
            if self.limits.get(&at, 0).on(maps::GROUP_LIMITS)? != l {
                self.limits.set(at, l, 0).on(maps::GROUP_LIMITS)?;
            }
        }
        Ok(())
    }

    /// Write `w` into the tries: upserts, then deletes. Returns the
    /// longest single write (each is one system call: the kernel takes
    /// the trie's lock for one network at a time, and packets read the
    /// trie without it).
    pub(crate) fn write(&mut self, w: &GroupWrites) -> Result<std::time::Duration, LoadError> {
        let mut longest = std::time::Duration::ZERO;
        for (net, index) in &w.upserts {
            let t = std::time::Instant::now();
            match net {
                IpNet::V4(n) => self.v4.insert(&key4(*n), index, 0).on(maps::GROUPS4)?,
                IpNet::V6(n) => self.v6.insert(&key6(*n), index, 0).on(maps::GROUPS6)?,
            }
            longest = longest.max(t.elapsed());
        }
        for net in &w.deletes {
            let t = std::time::Instant::now();
            // Absent already (a restart's read-back raced a write): fine.
            let _ = match net {
                IpNet::V4(n) => self.v4.remove(&key4(*n)),
                IpNet::V6(n) => self.v6.remove(&key6(*n)),
            };
            longest = longest.max(t.elapsed());
        }
        Ok(longest)
    }

    /// The kernel memory of the two tries (their fdinfo's `memlock`).
    #[must_use]
    pub fn memory(&self) -> Option<u64> {
        use aya::maps::IterableMap as _;
        Some(memlock(self.v4.map())? + memlock(self.v6.map())?)
    }

    /// Every network of the tries, with its group's index.
    pub(crate) fn entries(&self) -> Result<Vec<(IpNet, u32)>, LoadError> {
        let mut out = Vec::new();
        for k in self.v4.keys() {
            let k = k.on(maps::GROUPS4)?;
            let net = Ipv4Net::new(u32::from_ne_bytes(k.data().to_ne_bytes()).to_be().into(), len(k.prefix_len()))
                .map(IpNet::V4);
            if let (Ok(net), Ok(v)) = (net, self.v4.get(&k, 0)) {
                out.push((net, v));
            }
        }
        for k in self.v6.keys() {
            let k = k.on(maps::GROUPS6)?;
            let d = k.data();
            let mut b = [0u8; 16];
            b[..4].copy_from_slice(&d[0].to_ne_bytes());
            b[4..8].copy_from_slice(&d[1].to_ne_bytes());
            if let (Ok(net), Ok(v)) = (Ipv6Net::new(b.into(), len(k.prefix_len())), self.v6.get(&k, 0)) {
                out.push((IpNet::V6(net), v));
            }
        }
        Ok(out)
    }
}

fn len(l: u32) -> u8 {
    u8::try_from(l).unwrap_or(u8::MAX)
}

fn key4(n: Ipv4Net) -> Key<u32> {
    Key::new(u32::from(n.prefix_len()), u32::from_ne_bytes(n.network().octets()))
}

fn key6(n: Ipv6Net) -> Key<[u32; 2]> {
    let o = n.network().octets();
    let w = |i: usize| u32::from_ne_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
    Key::new(u32::from(n.prefix_len().min(64)), [w(0), w(4)])
}

/// `ACTIVE`'s word with its change count moved on (slot bits kept).
#[must_use]
pub(crate) fn counted(word: u32) -> u32 {
    let count = (word >> active::COUNT_SHIFT).wrapping_add(1);
    (word & (active::CONFIG_SLOT | active::LENS_SLOT)) | count << active::COUNT_SHIFT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_moves_the_count_and_keeps_both_slots() {
        let w = 3 | 41 << active::COUNT_SHIFT;
        assert_eq!(counted(w), 3 | 42 << active::COUNT_SHIFT);
        assert_eq!(counted(u32::MAX) & 3, 3, "the count wraps, the slots stay");
    }

    #[test]
    fn keys_hold_the_network_in_network_order() {
        let k = key4("198.18.5.0/24".parse().unwrap());
        assert_eq!((k.prefix_len(), k.data().to_ne_bytes()), (24, [198, 18, 5, 0]));
        let k = key6("2001:2:0:7::/64".parse().unwrap());
        assert_eq!(k.prefix_len(), 64);
        assert_eq!(k.data()[1].to_ne_bytes(), [0, 0, 0, 7]);
    }
}

//! The deny set: networks denied by an automation layer below the
//! operator and the policy file (blocklist feeds, CrowdSec decisions),
//! up to [`crate::maps::MAX_DENIES`] of them, changed entry by entry.
//!
//! One hash map ([`crate::maps::DENY`]) holds every denied network under
//! its exact prefix ([`DenyKey`]); [`DenyLens`] says which prefix lengths
//! hold any, so a lookup asks only those. A packet does not ask them
//! itself: its bucket caches the answer with its override resolution
//! ([`crate::resolution::LISTED`]), re-resolved when the set's generation
//! moves (the upper bits of `ACTIVE`). A network finer than the bucket
//! prefix leaves a marker ([`FINER`]) under its bucket's prefix, and only
//! a bucket whose prefix holds a marker asks, per packet, for the finer
//! lengths of the source address.

use crate::{Family, family, prefix};

/// The value's bit: this network is denied.
pub const DENIED: u32 = 1 << 31;
/// The value's bit: networks finer than this one (which is a bucket
/// prefix) are denied inside it.
pub const FINER: u32 = 1 << 30;
/// The value of an owner record: a key whose `pad[0]` is [`OWNER_KEY`]
/// (which the data plane never asks) records that the origin in
/// `pad[1]` denies the network too, beside the lowest one in the
/// network's own value, so that a restarted daemon knows every origin of
/// a network several deny.
pub const OWNER: u32 = 1 << 29;
/// `pad[0]` of an owner record's key.
pub const OWNER_KEY: u8 = 1;
/// The value's bits naming who denied it (an index of
/// [`crate::maps::DENY_ORIGINS`]; the lowest of several).
pub const ORIGIN: u32 = 0xffff;
/// Origins the set can name (entries of `DENY_HITS` and `DENY_ORIGINS`).
pub const MAX_ORIGINS: u32 = 256;
/// Bytes of an origin's name in [`crate::maps::DENY_ORIGINS`].
pub const ORIGIN_NAME: usize = 48;

/// Key of [`crate::maps::DENY`]: a network, its address masked to its
/// length. IPv4 in `addr[0]`, network byte order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DenyKey {
    pub family: Family,
    pub len: u8,
    /// Zero, except in an owner record (see [`OWNER`]).
    pub pad: [u8; 2],
    pub addr: [u32; 4],
}

impl DenyKey {
    /// The network of `len` bits holding `addr` (network-order words).
    #[inline(always)]
    #[must_use]
    #[expect(clippy::cast_possible_truncation, reason = "len <= 128")]
    pub fn of(fam: Family, addr: [u32; 4], len: u32) -> Self {
        let addr =
            if fam == family::IPV4 { [prefix::mask_v4(addr[0], len), 0, 0, 0] } else { prefix::mask_v6(addr, len) };
        Self { family: fam, len: len as u8, pad: [0; 2], addr }
    }
}

/// Prefix lengths a family's networks in the set may have at once: every
/// IPv4 length (33), and as many of IPv6's 129.
pub const MAX_LENS: usize = 40;
/// The end of a list of [`DenyLens`].
pub const END: u8 = u8::MAX;

/// Value of [`crate::maps::DENY_LENS`] (two slots, one in use, chosen by
/// `ACTIVE`'s bit 1, so a packet never reads a list half written): the
/// prefix lengths that hold a denied network, per family, longest first,
/// ended by [`END`]. A lookup asks these lengths only.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DenyLens {
    pub v4: [u8; MAX_LENS],
    pub v6: [u8; MAX_LENS],
}

impl Default for DenyLens {
    fn default() -> Self {
        Self { v4: [END; MAX_LENS], v6: [END; MAX_LENS] }
    }
}

impl DenyLens {
    /// The list of `fam`.
    #[inline(always)]
    #[must_use]
    pub fn of(&self, fam: Family) -> &[u8; MAX_LENS] {
        if fam == family::IPV4 { &self.v4 } else { &self.v6 }
    }

    /// Whether `fam` has any denied network.
    #[inline(always)]
    #[must_use]
    pub fn any(&self, fam: Family) -> bool {
        self.of(fam)[0] != END
    }

    /// The lists of `lens` (each family's lengths, in any order, without
    /// repeats), or the family whose lengths do not fit.
    pub fn from_lens(v4: impl IntoIterator<Item = u8>, v6: impl IntoIterator<Item = u8>) -> Result<Self, Family> {
        let mut out = Self::default();
        fill(&mut out.v4, v4).map_err(|()| family::IPV4)?;
        fill(&mut out.v6, v6).map_err(|()| family::IPV6)?;
        Ok(out)
    }
}

/// `list` holds `lens`, longest first.
fn fill(list: &mut [u8; MAX_LENS], lens: impl IntoIterator<Item = u8>) -> Result<(), ()> {
    let mut n = 0;
    for len in lens {
        *list.get_mut(n).ok_or(())? = len;
        n += 1;
    }
    list[..n].sort_unstable_by(|a, b| b.cmp(a));
    Ok(())
}

/// `ACTIVE`'s bits: the `CONFIG` slot (bit 0), the `DENY_LENS` slot (bit
/// 1), and above them a count of the deny set's changes.
pub mod active {
    /// The `CONFIG` slot.
    pub const CONFIG_SLOT: u32 = 1;
    /// The `DENY_LENS` slot.
    pub const LENS_SLOT: u32 = 2;
    /// The change count is `active >> COUNT_SHIFT`.
    pub const COUNT_SHIFT: u32 = 2;
}

/// The longest prefix of `fam`.
#[inline(always)]
#[must_use]
pub const fn max_len(fam: Family) -> u32 {
    if fam.0 == family::IPV4.0 { 32 } else { 128 }
}

/// Value of [`crate::maps::DENY_ORIGINS`]: an origin's name, UTF-8,
/// zero-padded (empty: unused).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OriginName {
    pub bytes: [u8; ORIGIN_NAME],
}

impl Default for OriginName {
    fn default() -> Self {
        Self { bytes: [0; ORIGIN_NAME] }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_its_network_masked() {
        let a = u32::from_be_bytes([198, 18, 5, 77]).to_be();
        let k = DenyKey::of(family::IPV4, [a, 9, 9, 9], 24);
        assert_eq!(k.addr, [u32::from_be_bytes([198, 18, 5, 0]).to_be(), 0, 0, 0]);
        assert_eq!(k.len, 24);
        let v6 = [0x2001_0002_u32.to_be(), 0xffff_ffff, 0xffff_ffff, 0xffff_ffff];
        let k = DenyKey::of(family::IPV6, v6, 48);
        assert_eq!(k.addr, [0x2001_0002_u32.to_be(), u32::from_ne_bytes([0xff, 0xff, 0, 0]), 0, 0]);
    }

    #[test]
    fn lists_are_longest_first_and_bounded() {
        let l = DenyLens::from_lens([16, 32, 24], [48, 128, 64]).unwrap();
        assert_eq!(l.v4[..4], [32, 24, 16, END]);
        assert_eq!(l.v6[..4], [128, 64, 48, END]);
        assert!(l.any(family::IPV4) && !DenyLens::default().any(family::IPV6));
        assert!(DenyLens::from_lens(0..=32, []).is_ok(), "every IPv4 length fits");
        assert_eq!(DenyLens::from_lens([], 0..=40), Err(family::IPV6));
    }
}

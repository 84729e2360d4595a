//! The deny set (`limiter_common::deny`): whether a bucket's prefix is
//! denied or holds finer denied networks (asked when the bucket
//! resolves), and whether a source address is one of those finer
//! networks (asked per packet, only in a bucket with a marker).

use limiter_common::{
    BucketKey, Family,
    deny::{DENIED, DenyKey, DenyLens, END, FINER, MAX_LENS, ORIGIN, active, max_len},
    family,
    lease::ADDRESS,
    packet::Source,
    prefix, resolution,
};

use crate::{
    lease::Slot,
    maps::{ACTIVE, DENY, DENY_HITS, DENY_LENS},
};

/// The lists of lengths in use (the slot `ACTIVE` names).
#[inline(always)]
fn lens() -> Option<&'static DenyLens> {
    let slot = u32::from(ACTIVE.get(0).copied().unwrap_or(0) & active::LENS_SLOT != 0);
    DENY_LENS.get(slot)
}

/// Bits added to a bucket's override resolution `res` (neither allow
/// nor deny) by the deny set: `LISTED | origin` in its place when the
/// bucket's prefix is denied (or lies in a denied network), `res |
/// FINER` when finer networks inside it are.
#[inline(always)]
pub fn listed(key: &BucketKey, res: u32) -> u32 {
    if !lens().is_some_and(|l| l.any(key.family)) {
        return res;
    }
    let addr = [key.addr[0], key.addr[1], 0, 0];
    let len = u32::from(key.prefix_len);
    let exact = value(&DenyKey::of(key.family, addr, len));
    let found = if exact & DENIED != 0 || len == 0 { exact } else { scan(key.family, addr, 0, len - 1) };
    if found & DENIED != 0 {
        resolution::LISTED | (found & ORIGIN)
    } else if exact & FINER != 0 {
        res | resolution::FINER
    } else {
        res
    }
}

/// Whether `addr` (a source address) is denied at a length finer than
/// `bucket_len`; if so, the packet is counted under the origin. A
/// function of its own (not inlined) so that the entry point's frame
/// keeps nothing more across it.
/// With `usable` (this CPU's slots in use), a denied address is
/// remembered in this CPU's entry of it, under `version`: its next packet
/// is dropped without a lookup of the set.
#[inline(never)]
pub fn finer(src: &Source, bucket_len: u8, version: u32, usable: bool) -> bool {
    let a = &src.addr;
    let key = BucketKey { family: src.family, prefix_len: ADDRESS, class: 0, pad: 0, addr: [a[0], a[1]] };
    let lo = u64::from(a[2]) | u64::from(a[3]) << 32;
    let slot = Slot::probe(&key, usable);
    if let Some(origin) = slot.address_denied(&key, lo, version) {
        hit(origin);
        return true;
    }
    let hi = u64::from(a[0]) | u64::from(a[1]) << 32;
    let to = u64::from(max_len(src.family) | COUNT);
    let packed = u64::from(src.family.0) | (u64::from(bucket_len) + 1) << 8 | to << 16;
    #[expect(clippy::cast_possible_truncation, reason = "a map value, a u32")]
    let v = limiter_deny_scan(hi, lo, packed) as u32;
    if v & DENIED == 0 {
        return false;
    }
    slot.remember_address(&key, lo, version, v & ORIGIN);
    true
}

/// `to`'s bit in a scan: count the packet under the network's origin.
const COUNT: u32 = 1 << 8;

/// Count a packet the deny set dropped under its origin (or an enforced
/// `deny` group under the group, `limiter_common::groups::DENIED_ORIGIN`).
#[inline(always)]
pub fn hit(value: u32) {
    if value & limiter_common::groups::DENIED_ORIGIN != 0 {
        crate::groups::count(value & (limiter_common::groups::MAX_GROUPS - 1), false);
    } else if let Some(c) = DENY_HITS.get_ptr_mut(value & ORIGIN) {
        // SAFETY: per-CPU slot, only this CPU's softirq writes it.
        unsafe { *c += 1 };
    }
}

/// The value of `key` in `DENY`, 0 if none.
#[inline(always)]
fn value(key: &DenyKey) -> u32 {
    // SAFETY: a live map value, a u32 read whole (userspace replaces it
    // whole, or deletes it and the memory is freed after a grace period).
    DENY.get_ptr(key).map_or(0, |p| unsafe { core::ptr::read_volatile(p) })
}

#[inline(always)]
fn scan(fam: Family, addr: [u32; 4], from: u32, to: u32) -> u32 {
    let hi = u64::from(addr[0]) | u64::from(addr[1]) << 32;
    let lo = u64::from(addr[2]) | u64::from(addr[3]) << 32;
    let packed = u64::from(fam.0) | u64::from(from) << 8 | u64::from(to) << 16;
    #[expect(clippy::cast_possible_truncation, reason = "the answer is a map value, a u32")]
    let v = limiter_deny_scan(hi, lo, packed) as u32;
    v
}

/// The first denied network holding the address `hi`/`lo` (its four
/// network-order words, two by two) at the lengths `from..=to` that
/// `DENY_LENS` lists, longest first: its value, or 0. `packed`: family
/// (bits 0..8), `from` (8..16), `to` (16..24), and bit 24: count a hit
/// under the network's origin ([`hit`]). A global function, checked once
/// by the verifier: at most [`MAX_LENS`] steps.
#[unsafe(no_mangle)]
#[inline(never)]
#[expect(clippy::cast_possible_truncation, reason = "fields of `packed` and the address's words")]
pub extern "C" fn limiter_deny_scan(hi: u64, lo: u64, packed: u64) -> u64 {
    let fam = Family(packed as u8);
    let (from, to) = (((packed >> 8) & 0xff) as u8, ((packed >> 16) & 0xff) as u8);
    let Some(lens) = lens() else { return 0 };
    // One loop per family, each with its own masking: the verifier walks
    // each once, without the other's branches.
    let v = if fam == family::IPV4 {
        let a = hi as u32;
        first_denied(&lens.v4, from, to, |len| DenyKey {
            family: fam,
            len,
            pad: [0; 2],
            addr: [prefix::mask_v4(a, u32::from(len)), 0, 0, 0],
        })
    } else {
        // The address as two numbers (its bytes are in network order).
        let (h, l) = (u64::from_be(hi), u64::from_be(lo));
        first_denied(&lens.v6, from, to, |len| {
            let (h, l) = (mask64(h, u32::from(len)), mask64(l, u32::from(len).saturating_sub(64)));
            let (h, l) = (h.to_be(), l.to_be());
            DenyKey { family: fam, len, pad: [0; 2], addr: [h as u32, (h >> 32) as u32, l as u32, (l >> 32) as u32] }
        })
    };
    if v & DENIED != 0 && packed & (1 << 24) != 0 {
        hit(v);
    }
    u64::from(v)
}

/// The value of the first network of `list`'s lengths within
/// `from..=to` (longest first) that is denied, or 0.
#[inline(always)]
fn first_denied(list: &[u8; MAX_LENS], from: u8, to: u8, key: impl Fn(u8) -> DenyKey) -> u32 {
    let mut i = 0;
    while i < MAX_LENS {
        let len = list[i];
        if len == END || len < from {
            break;
        }
        if len <= to {
            let v = value(&key(len));
            if v & DENIED != 0 {
                return v;
            }
        }
        i += 1;
    }
    0
}

/// The top `len` bits of `x` (`len` up to 64).
#[inline(always)]
fn mask64(x: u64, len: u32) -> u64 {
    if len >= 64 {
        x
    } else if len == 0 {
        0
    } else {
        x & !(u64::MAX >> len)
    }
}

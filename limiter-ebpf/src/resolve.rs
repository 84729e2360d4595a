//! A bucket's resolution: the most specific override holding its
//! prefix (operator and policy file); without one, its country or ASN
//! group; below an `allow` or a `deny` (override or group) the deny
//! set's answer; as a global function, cached in the bucket under the
//! packet's version.

use core::ptr::write_volatile;

use aya_ebpf::maps::lpm_trie::Key;
use limiter_common::{BucketKey, family, resolution};

use crate::{
    deny, groups,
    maps::{BUCKETS, OVR4_0, OVR4_1, OVR6_0, OVR6_1},
    packed::{SLOT_BIT, STORE},
};

/// The prefix's resolution ([`resolve`]) as a global function: its own
/// stack frame beside the charge functions', so that no call chain holds
/// three stack frames. `packed` as theirs; with [`STORE`], the prefix's
/// bucket caches it under the packet's version.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn limiter_resolve(head: u64, tail: u64, packed: u64) -> u64 {
    let key = BucketKey::from_words(head, tail);
    let res = resolve(&key, u32::from(packed & SLOT_BIT != 0));
    if packed & STORE != 0
        && let Some(p) = BUCKETS.get_ptr_mut(key)
    {
        // SAFETY: a live map value; an aligned 8-byte store is single-copy
        // atomic, so version and resolution are always a pair. Racing
        // CPUs write the same value.
        unsafe { write_volatile(&raw mut (*p).resolved, (packed >> 32) << 32 | u64::from(res)) };
    }
    u64::from(res)
}

/// The prefix's own resolution for code outside the charge (the cookie
/// path), through [`limiter_resolve`] (not stored in a bucket), without
/// the bits that name its group: a prefix of a group gets cookies as any.
#[cfg_attr(feature = "without-syn-cookies", expect(dead_code, reason = "SYN cookies only"))]
#[inline(always)]
#[expect(clippy::cast_possible_truncation, reason = "a resolution is a u32")]
pub fn resolved(key: &BucketKey, slot: u32) -> u32 {
    let (head, tail) = key.words();
    resolution::ungrouped(limiter_resolve(head, tail, if slot != 0 { SLOT_BIT } else { 0 }) as u32)
}

/// Most specific override containing the bucket's prefix (the bucket's
/// address is already masked, so overrides no longer than it match);
/// without one, the prefix's group ([`groups::limiter_group_of`]); below an `allow` or
/// a `deny` (an override or a group: the policy file outranks the
/// automation that fills the deny set), the deny set's answer
/// ([`deny::listed`]).
#[inline(always)]
pub fn resolve(key: &BucketKey, slot: u32) -> u32 {
    match override_of(key, slot) {
        r @ (resolution::ALLOW | resolution::DENY) => r,
        resolution::CLASS => {
            let (head, tail) = key.words();
            let found = groups::limiter_group_of(head, tail, u64::from(slot));
            #[expect(clippy::cast_possible_truncation, reason = "the low half is the resolution")]
            let res = found as u32;
            if found >> 32 != 0 { res } else { deny::listed(key, res) }
        }
        r => deny::listed(key, r),
    }
}

/// The override trie's answer alone.
#[inline(always)]
fn override_of(key: &BucketKey, slot: u32) -> u32 {
    let found = if key.family == family::IPV4 {
        let k = Key::new(32, key.addr[0]);
        if slot == 0 { OVR4_0.get(&k) } else { OVR4_1.get(&k) }
    } else {
        let k = Key::new(128, [key.addr[0], key.addr[1], 0, 0]);
        if slot == 0 { OVR6_0.get(&k) } else { OVR6_1.get(&k) }
    };
    found.copied().unwrap_or(resolution::CLASS)
}

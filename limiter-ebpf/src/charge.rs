//! Charging a packet to its prefix's bucket: override resolution (cached
//! in the bucket per policy version), `allow`/`deny`, the new-source
//! budget, the GCRA step with compare-and-swap, and the aggregate tier.

use core::{
    intrinsics::{AtomicOrdering, atomic_cxchg},
    ptr::{read_volatile, write_volatile},
};

use aya_ebpf::maps::lpm_trie::Key;
use limiter_common::{
    BucketKey, BucketState, ClassLimits, Config, Reason, cost, family, gcra, maps::MAX_OVERRIDES, mode, packet::Source,
    reason::MAX_CAS_RETRIES, resolution, rules::bucket_key,
};

use crate::{
    count::RefusalCache,
    maps::{BUCKETS, NEW_SOURCES, OVR_LIMITS, OVR4_0, OVR4_1, OVR6_0, OVR6_1},
    program::Packet,
    window::charge_window,
};

pub const BPF_NOEXIST: u64 = 1;
const EEXIST: i32 = 17;

/// One packet's whole context for charging.
pub struct Charge<'a> {
    pub pkt: &'a Packet<'a>,
    pub cfg: &'a Config,
    pub src: &'a Source,
    /// Rule class, `0..MAX_CLASSES`.
    pub class: usize,
    pub key: &'a BucketKey,
    /// The active `CONFIG` slot (0 or 1) and its policy version.
    pub slot: u32,
    pub version: u32,
    /// 1/16 ns.
    pub now: u64,
}

/// The reason a packet gets from its bucket (and the aggregate tier);
/// `None` if the policy names limits that are not there.
#[inline(always)]
pub fn charge(c: &Charge, cache: &RefusalCache) -> Option<Reason> {
    let bucket = BUCKETS.get_ptr_mut(c.key);
    let res = match bucket {
        Some(p) => cached_resolution(p, c.key, c.slot, c.version),
        None => resolve(c.key, c.slot),
    };
    Some(match res {
        resolution::ALLOW => admit_listed(bucket, c, res, Reason::Allowed),
        resolution::DENY => admit_listed(bucket, c, res, Reason::Denied),
        _ => {
            let limits = limits_for(c.cfg, c.class, c.slot, res)?;
            let units = if limits.cost == cost::BYTES { c.pkt.len() } else { 1 };
            if limits.slices != 0 {
                return Some(charge_window_prefix(bucket, c, limits, units, res));
            }
            let inc = units * limits.unit;
            let resolved = (u64::from(c.version) << 32) | u64::from(res);
            let shadow = limits.mode == mode::SHADOW;
            let mut r = match bucket {
                Some(p) => {
                    let step = charge_existing(p, c.now, inc, limits.tau);
                    // A smaller packet may fit where this one did not:
                    // only packet-cost refusals hold for the next packet.
                    if let Cas::Refused(seen) = step
                        && limits.cost != cost::BYTES
                    {
                        let until = seen.saturating_add(inc).saturating_sub(limits.tau);
                        cache.remember(c.key, c.version, until, shadow);
                    }
                    step.reason()
                }
                None if !new_source_admitted(c.cfg, c.now) => Reason::NewSourceLimited,
                None => charge_new(c.key, c.now, inc, limits.tau, resolved),
            };
            if r == Reason::Admitted && c.class == 0 && c.cfg.agg_unit != 0 {
                r = charge_aggregate(c, bucket, Fine { units, inc, resolved });
            }
            if r == Reason::RateLimited && shadow { Reason::ShadowDropped } else { r }
        }
    })
}

/// A window quota: the bucket entry only caches the override resolution
/// (and, created under the new-source budget, bounds churn as for
/// buckets); the counts are in `WINDOWS`.
#[inline(always)]
fn charge_window_prefix(
    bucket: Option<*mut BucketState>,
    c: &Charge,
    limits: &ClassLimits,
    units: u64,
    res: u32,
) -> Reason {
    if bucket.is_none() {
        if !new_source_admitted(c.cfg, c.now) {
            return Reason::NewSourceLimited;
        }
        let resolved = (u64::from(c.version) << 32) | u64::from(res);
        let _ = BUCKETS.insert(c.key, BucketState { tat: 0, resolved }, BPF_NOEXIST);
    }
    let r = charge_window(c.key, c.now, units, limits);
    if r == Reason::RateLimited && limits.mode == mode::SHADOW { Reason::ShadowDropped } else { r }
}

/// The bucket's cached override resolution, refreshed (one trie lookup and
/// one 8-byte store) when the policy version has changed since.
#[inline(always)]
#[expect(clippy::cast_possible_truncation, reason = "the low half of the word is the resolution")]
fn cached_resolution(p: *mut BucketState, key: &BucketKey, slot: u32, version: u32) -> u32 {
    // SAFETY: p points to a live map value; an aligned 8-byte access is
    // single-copy atomic, so version and resolution are always a pair.
    let cached = unsafe { read_volatile(&raw const (*p).resolved) };
    if (cached >> 32) as u32 == version {
        return cached as u32;
    }
    let res = resolve(key, slot);
    // SAFETY: as above. Racing CPUs write the same value.
    unsafe { write_volatile(&raw mut (*p).resolved, (u64::from(version) << 32) | u64::from(res)) };
    res
}

/// Most specific override containing the bucket's prefix (the bucket's
/// address is already masked, so overrides no longer than it match).
#[inline(always)]
pub fn resolve(key: &BucketKey, slot: u32) -> u32 {
    let found = if key.family == family::IPV4 {
        let k = Key::new(32, key.addr[0]);
        if slot == 0 { OVR4_0.get(&k) } else { OVR4_1.get(&k) }
    } else {
        let k = Key::new(128, [key.addr[0], key.addr[1], 0, 0]);
        if slot == 0 { OVR6_0.get(&k) } else { OVR6_1.get(&k) }
    };
    found.copied().unwrap_or(resolution::CLASS)
}

/// Limits for a packet of `class` whose prefix resolved to `res`: an
/// override's own limits apply to the default class only.
#[inline(always)]
fn limits_for(cfg: &Config, class: usize, slot: u32, res: u32) -> Option<&ClassLimits> {
    if res != resolution::CLASS && class == 0 && res <= MAX_OVERRIDES {
        return OVR_LIMITS.get(slot * MAX_OVERRIDES + res - 1);
    }
    cfg.classes.get(class)
}

/// `allow` / `deny`: no charge. An allowed prefix gets a bucket only to
/// cache the trie lookup, and only while the new-source budget admits it
/// (the packet passes either way). A denied one never does. Otherwise a
/// spoofed flood across a listed range would fill the LRU with buckets
/// that hold no state and evict the buckets of real senders, which would
/// then come back with a fresh allowance (invariant 3); without a bucket a
/// packet pays one trie lookup instead.
#[inline(always)]
fn admit_listed(bucket: Option<*mut BucketState>, c: &Charge, res: u32, reason: Reason) -> Reason {
    if bucket.is_none() && res == resolution::ALLOW && new_source_admitted(c.cfg, c.now) {
        let resolved = (u64::from(c.version) << 32) | u64::from(res);
        let _ = BUCKETS.insert(c.key, BucketState { tat: gcra::fresh_tat(c.now), resolved }, BPF_NOEXIST);
    }
    reason
}

/// What the fine bucket was charged for this packet.
#[derive(Clone, Copy)]
struct Fine {
    units: u64,
    inc: u64,
    resolved: u64,
}

/// The aggregate tier, charged after the fine bucket admitted the packet:
/// a flood its own bucket refuses never reaches (and never drains) its
/// aggregate. If the aggregate refuses, the fine charge is refunded, so a
/// packet is charged to both tiers or to neither.
#[inline(always)]
fn charge_aggregate(c: &Charge, fine: Option<*mut BucketState>, f: Fine) -> Reason {
    let agg = bucket_key(c.src, c.cfg.agg_v4_prefix, c.cfg.agg_v6_prefix, 0);
    let inc = f.units * c.cfg.agg_unit;
    let r = match BUCKETS.get_ptr_mut(agg) {
        Some(p) => charge_existing(p, c.now, inc, c.cfg.agg_tau).reason(),
        None => charge_new(&agg, c.now, inc, c.cfg.agg_tau, f.resolved),
    };
    if r == Reason::Admitted {
        return r;
    }
    // The fine bucket is looked up again only if this packet created it.
    if let Some(p) = fine.or_else(|| BUCKETS.get_ptr_mut(c.key)) {
        refund(p, f.inc);
    }
    Reason::AggregateLimited
}

/// Give back a charge of `inc`: it was added to `tat` by this packet, so
/// `tat >= inc` and subtracting it returns exactly what was taken.
#[inline(always)]
fn refund(p: *mut BucketState, inc: u64) {
    // SAFETY: p points to a live map value.
    let _ = cas(unsafe { &raw mut (*p).tat }, |cur| Some(cur.saturating_sub(inc)));
}

/// A prefix without a bucket draws one unit from the shared new-source
/// budget before a bucket is created, so spoofed sources can neither churn
/// the LRU nor each buy a fresh allowance faster than the budget allows
/// (invariant 3).
#[inline(always)]
fn new_source_admitted(cfg: &Config, now: u64) -> bool {
    if cfg.new_unit == 0 {
        return true;
    }
    let Some(p) = NEW_SOURCES.get_ptr_mut(0) else { return true };
    matches!(cas(p, |cur| gcra::admit(cur, now, cfg.new_unit, cfg.new_tau)), Cas::Done)
}

/// First packet of a prefix: create its bucket (full, then charged).
#[inline(always)]
fn charge_new(key: &BucketKey, now: u64, inc: u64, tau: u64, resolved: u64) -> Reason {
    let fresh = gcra::fresh_tat(now);
    let (tat, reason) = match gcra::admit(fresh, now, inc, tau) {
        Some(t) => (t, Reason::Admitted),
        None => (fresh, Reason::RateLimited),
    };
    match BUCKETS.insert(key, BucketState { tat, resolved }, BPF_NOEXIST) {
        Ok(()) => reason,
        // Another CPU created it between our lookup and insert: charge that one.
        Err(e) if e == -EEXIST => match BUCKETS.get_ptr_mut(key) {
            Some(p) => charge_existing(p, now, inc, tau).reason(),
            None => Reason::BucketInsertFailed,
        },
        Err(_) => Reason::BucketInsertFailed,
    }
}

/// One GCRA step applied with compare-and-swap, retried a bounded number of
/// times. CAS makes the update exact across CPUs: no race overshoot
/// (invariant 1).
#[inline(always)]
pub fn charge_existing(p: *mut BucketState, now: u64, inc: u64, tau: u64) -> Cas {
    // SAFETY: p points to a live map value.
    cas(unsafe { &raw mut (*p).tat }, |cur| gcra::admit(cur, now, inc, tau))
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Cas {
    Done,
    /// `step` returned `None` for the value seen: nothing was written.
    Refused(u64),
    /// Other CPUs won `MAX_CAS_RETRIES` races in a row.
    Contended,
}

/// Replace `*p` with `step(*p)` atomically, retrying a bounded number of
/// times when another CPU changed it in between.
#[inline(always)]
fn cas(p: *mut u64, step: impl Fn(u64) -> Option<u64>) -> Cas {
    for _ in 0..MAX_CAS_RETRIES {
        // An atomic load crashes the BPF backend; a volatile 8-byte load is
        // single-copy atomic on the BPF ISA, which is all we need here.
        // SAFETY: callers pass a live map value.
        let cur = unsafe { read_volatile(p) };
        let Some(new) = step(cur) else { return Cas::Refused(cur) };
        // SAFETY: as above; BPF_CMPXCHG on a map value is verifier-approved.
        let (_, swapped) =
            unsafe { atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(p, cur, new) };
        if swapped {
            return Cas::Done;
        }
    }
    Cas::Contended
}

impl Cas {
    /// The reason a bucket charge gives.
    #[inline(always)]
    fn reason(self) -> Reason {
        match self {
            Cas::Done => Reason::Admitted,
            Cas::Refused(_) => Reason::RateLimited,
            Cas::Contended => Reason::Contended,
        }
    }
}

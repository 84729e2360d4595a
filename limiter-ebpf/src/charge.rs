//! Charging a packet to its prefix's bucket: override resolution (cached
//! in the bucket per policy version), `allow`/`deny`, the new-source
//! budget, the GCRA step with compare-and-swap, and the aggregate tier.

use core::ptr::{read_volatile, write_volatile};

use aya_ebpf::maps::lpm_trie::Key;
use limiter_common::{
    BucketKey, BucketState, ClassLimits, Config, REASON_COUNT, Reason, cost, family, gcra, maps::MAX_OVERRIDES, mode,
    packet::Source, resolution, rules::coarser,
};

use crate::{
    atomic::{Cas, cas, charge_existing, refund},
    lease::{Slot, charge_leasing},
    maps::{BPF_NOEXIST, BUCKETS, CONFIG, NEW_SOURCES, OVR_LIMITS, OVR4_0, OVR4_1, OVR6_0, OVR6_1},
    packet::Packet,
    window::charge_window,
};

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

/// What the charge itself needs of a packet: its bucket and its length,
/// under one policy at one instant.
struct Job<'a> {
    /// The policy (a `CONFIG` entry).
    cfg: &'a Config,
    key: BucketKey,
    class: usize,
    /// The `CONFIG` slot and its policy version.
    slot: u32,
    version: u32,
    now: u64,
    len: u64,
}

/// [`limiter_charge_bucket`]'s answer when the prefix has no bucket.
const NO_BUCKET: u64 = u64::MAX;
/// The answer of both charge functions for a window-quota class: this bit
/// and the prefix's override resolution. The entry point then calls
/// [`limiter_charge_window`] itself, so that no call chain holds three
/// stack frames.
const WINDOW: u64 = 1 << 32;

/// The reason a packet gets from its bucket (and the aggregate tier).
/// Both halves are global functions: the verifier checks each once, on
/// its own, rather than once for every state in which a packet reaches
/// it, which leases and their refusals would multiply past its limit.
#[inline(always)]
pub fn charge(c: &Charge, slot: &Slot) -> Reason {
    let (head, tail) = c.key.words();
    let packed = c.pkt.len() | (c.class as u64) << 32 | u64::from(c.slot) << 40 | u64::from(slot.usable()) << 41;
    let mut code = limiter_charge_bucket(head, tail, c.now, packed);
    if code == NO_BUCKET {
        code = limiter_charge_new(head, tail, c.now, packed);
    }
    if code & WINDOW != 0 {
        code = limiter_charge_window(head, tail, c.now, packed, code & u64::from(u32::MAX));
    }
    reason_of(code)
}

/// The job of a global charge function: `packed` holds the frame length
/// (low 32 bits), the class (bits 32..40), the `CONFIG` slot (bit 40),
/// and whether this CPU's slot is in use (bit 41).
#[inline(always)]
#[expect(clippy::cast_possible_truncation, reason = "fields of `packed`; versions compare in their low 32 bits")]
fn job(head: u64, tail: u64, now: u64, packed: u64) -> Option<Job<'static>> {
    let slot = ((packed >> 40) & 1) as u32;
    let cfg = CONFIG.get(slot)?;
    let key = BucketKey::from_words(head, tail);
    let class = ((packed >> 32) & 0xff) as usize;
    Some(Job { cfg, key, class, slot, version: cfg.version as u32, now, len: packed & 0xffff_ffff })
}

/// The charge of a packet whose prefix has no bucket: `allow`/`deny`, the
/// new-source budget, then a full bucket (or window entry) charged once.
/// Returns the reason's index or [`WINDOW`].
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn limiter_charge_new(head: u64, tail: u64, now: u64, packed: u64) -> u64 {
    let Some(j) = job(head, tail, now, packed) else { return Reason::NoConfig as u64 };
    let r = match resolve(&j.key, j.slot) {
        res @ resolution::ALLOW => admit_listed(&j, res, Reason::Allowed),
        resolution::DENY => Reason::Denied,
        res => match limits_for(j.cfg, j.class, j.slot, res) {
            None => Reason::NoConfig,
            Some(_) if !new_source_admitted(j.cfg, j.now) => Reason::NewSourceLimited,
            Some(limits) => {
                let units = if limits.cost == cost::BYTES { j.len } else { 1 };
                let resolved = (u64::from(j.version) << 32) | u64::from(res);
                if limits.is_window() {
                    let _ = BUCKETS.insert(j.key, BucketState { tat: 0, resolved }, BPF_NOEXIST);
                    return WINDOW | u64::from(res);
                }
                let inc = units * limits.unit;
                let r = charge_new(&j.key, j.now, inc, limits.tau, resolved);
                finish_fine(&j, limits, r, None, Fine { units, inc, resolved })
            }
        },
    };
    r as u64
}

/// The charge of a packet whose prefix has a bucket: its override
/// resolution (cached in the bucket), `allow`/`deny`, its window or its
/// token bucket (through this CPU's slot), and the aggregate tier.
/// Returns the reason's index, [`NO_BUCKET`] or [`WINDOW`].
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn limiter_charge_bucket(head: u64, tail: u64, now: u64, packed: u64) -> u64 {
    let Some(j) = job(head, tail, now, packed) else { return Reason::NoConfig as u64 };
    let Some(p) = BUCKETS.get_ptr_mut(j.key) else { return NO_BUCKET };
    let res = cached_resolution(p, &j.key, j.slot, j.version);
    let r = match res {
        resolution::ALLOW => Reason::Allowed,
        resolution::DENY => Reason::Denied,
        _ => match limits_for(j.cfg, j.class, j.slot, res) {
            None => Reason::NoConfig,
            Some(limits) if limits.is_window() => return WINDOW | u64::from(res),
            Some(limits) => {
                let units = if limits.cost == cost::BYTES { j.len } else { 1 };
                let inc = units * limits.unit;
                let cpu_slot = Slot::probe(&j.key, (packed >> 41) & 1 != 0);
                let r = charge_leasing(p, &cpu_slot, &j.key, j.version, j.now, j.cfg.cpus, limits, inc);
                let resolved = (u64::from(j.version) << 32) | u64::from(res);
                finish_fine(&j, limits, r, Some(p), Fine { units, inc, resolved })
            }
        },
    };
    r as u64
}

/// The reason whose index is `code` (`NoConfig` if none). Written so the
/// index is bounded before any use: a table lookup computed ahead of the
/// check would be refused by the verifier.
#[inline(always)]
#[expect(clippy::cast_possible_truncation, reason = "checked against REASON_COUNT")]
fn reason_of(code: u64) -> Reason {
    let i = if code < REASON_COUNT as u64 { code as u32 } else { Reason::NoConfig as u32 };
    // SAFETY: `Reason` is `repr(u32)` with the discriminants
    // `0..REASON_COUNT` (limiter_common's `discriminants_are_slot_indexes`).
    unsafe { core::mem::transmute::<u32, Reason>(i) }
}

/// After the fine bucket: the aggregate tier for an admitted packet of the
/// default class, and shadow mode for a refused one.
#[inline(always)]
fn finish_fine(j: &Job, limits: &ClassLimits, r: Reason, fine: Option<*mut BucketState>, f: Fine) -> Reason {
    let r = if r == Reason::Admitted && j.class == 0 && j.cfg.agg_unit != 0 { charge_aggregate(j, fine, f) } else { r };
    if r == Reason::RateLimited && limits.mode == mode::SHADOW { Reason::ShadowDropped } else { r }
}

/// A window quota (`res`: the prefix's override resolution): the bucket
/// entry only caches the resolution (and, created under the new-source
/// budget, bounds churn as for buckets); the counts are in `WINDOWS`.
/// Returns the reason's index. A global function, with its own stack
/// frame.
#[unsafe(no_mangle)]
#[inline(never)]
#[expect(clippy::cast_possible_truncation, reason = "a resolution is a u32")]
pub extern "C" fn limiter_charge_window(head: u64, tail: u64, now: u64, packed: u64, res: u64) -> u64 {
    let Some(j) = job(head, tail, now, packed) else { return Reason::NoConfig as u64 };
    let Some(limits) = limits_for(j.cfg, j.class, j.slot, res as u32) else { return Reason::NoConfig as u64 };
    let units = if limits.cost == cost::BYTES { j.len } else { 1 };
    let r = charge_window(&j.key, j.now, units, limits);
    (if r == Reason::RateLimited && limits.mode == mode::SHADOW { Reason::ShadowDropped } else { r }) as u64
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
fn admit_listed(j: &Job, res: u32, reason: Reason) -> Reason {
    if new_source_admitted(j.cfg, j.now) {
        let resolved = (u64::from(j.version) << 32) | u64::from(res);
        let _ = BUCKETS.insert(j.key, BucketState { tat: gcra::fresh_tat(j.now), resolved }, BPF_NOEXIST);
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
fn charge_aggregate(j: &Job, fine: Option<*mut BucketState>, f: Fine) -> Reason {
    let agg = coarser(&j.key, j.cfg.agg_v4_prefix, j.cfg.agg_v6_prefix);
    let inc = f.units * j.cfg.agg_unit;
    let r = match BUCKETS.get_ptr_mut(agg) {
        Some(p) => charge_existing(p, j.now, inc, j.cfg.agg_tau).reason(),
        None => charge_new(&agg, j.now, inc, j.cfg.agg_tau, f.resolved),
    };
    if r == Reason::Admitted {
        return r;
    }
    // The fine bucket is looked up again only if this packet created it.
    if let Some(p) = fine.or_else(|| BUCKETS.get_ptr_mut(j.key)) {
        refund(p, f.inc);
    }
    Reason::AggregateLimited
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

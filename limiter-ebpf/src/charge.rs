//! Charging a packet to its prefix's bucket: override resolution (cached
//! in the bucket per policy version), `allow`/`deny`, the new-source
//! budget, the GCRA step with compare-and-swap, and the aggregate tier.

use core::ptr::read_volatile;

use aya_ebpf::maps::Array;
use limiter_common::{
    BucketKey, BucketState, ClassLimits, Config, REASON_COUNT, Reason, cost, gcra, mode, packet::Source, resolution,
    rules::coarser,
};

use crate::{
    atomic::{Cas, cas, charge_existing, refund},
    deny, groups,
    job::{Job, job, limits_for},
    lease::{Slot, charge_leasing},
    maps::{BPF_NOEXIST, BUCKETS, DENY_SOURCES, NEW_SOURCES},
    packed::{ANY_VERSION, CHECKED, CLASS_SHIFT, SLOT_BIT, STORE, USABLE_BIT},
    packet::Packet,
    resolve::limiter_resolve,
    window::charge_window,
};

const EEXIST: i32 = 17;

/// One packet's whole context for charging.
pub struct Charge<'a> {
    pub pkt: &'a Packet<'a>,
    #[cfg_attr(feature = "without-syn-cookies", expect(dead_code, reason = "SYN cookies only"))]
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

/// [`limiter_charge_bucket`]'s answer when the prefix has no bucket.
const NO_BUCKET: u64 = u64::MAX;
/// The answer of both charge functions for a window-quota class: this bit
/// and the prefix's override resolution. The entry point then calls
/// [`limiter_charge_window`] itself, so that no call chain holds three
/// stack frames.
const WINDOW: u64 = 1 << 32;
/// The answer of both charge functions, uncharged, for a bucket whose
/// prefix holds finer denied networks ([`resolution::FINER`]) when the
/// packet's address was not yet asked: the entry point asks
/// ([`deny::finer`], it has the whole address) and charges again with
/// [`CHECKED`].
const FINER_CHECK: u64 = 1 << 33;

/// The reason a packet gets from its bucket (and the aggregate tier).
/// Both halves are global functions: the verifier checks each once, on
/// its own, rather than once for every state in which a packet reaches
/// it, which leases and their refusals would multiply past its limit.
#[inline(always)]
pub fn charge(c: &Charge, slot: &Slot, checked: bool) -> Reason {
    let usable = slot.usable();
    // Twice at most: a bucket with finer denied networks answers
    // uncharged until the address is known not to be one of them.
    let mut packed = packed(c, usable) | if checked { CHECKED } else { 0 };
    let mut code = charge_once(c, packed);
    while code & FINER_CHECK != 0 && packed & CHECKED == 0 {
        if deny::finer(c.src, c.key.prefix_len, c.version, usable) {
            return Reason::Denied;
        }
        packed |= CHECKED;
        code = charge_once(c, packed);
    }
    let (head, tail) = c.key.words();
    if code & WINDOW != 0 {
        code = limiter_charge_window(head, tail, c.now, packed, code & u64::from(u32::MAX));
    } else if code & groups::GROUP_STEP != 0 {
        code = groups::limiter_charge_group(head, tail, c.now, packed, code & u64::from(u32::MAX));
    }
    reason_of(code)
}

/// The charge functions' `packed` for `c`.
#[inline(always)]
fn packed(c: &Charge, usable: bool) -> u64 {
    let len = if c.pkt.len() > 0xffff { 0xffff } else { c.pkt.len() };
    len | (c.class as u64) << CLASS_SHIFT
        | if c.slot != 0 { SLOT_BIT } else { 0 }
        | if usable { USABLE_BIT } else { 0 }
        | u64::from(c.version) << 32
}

/// The bucket's charge, or the new prefix's. The prefix is resolved
/// here, beside the charge functions rather than inside them, so that no
/// call chain holds three stack frames: when it has no bucket, or its
/// bucket's resolution is stale.
#[inline(always)]
fn charge_once(c: &Charge, packed: u64) -> u64 {
    let ((head, tail), now) = (c.key.words(), c.now);
    let code = limiter_charge_bucket(head, tail, now, packed);
    if code != NO_BUCKET && code != STALE {
        return code;
    }
    // Stale: the resolution is stored in the bucket, which is charged
    // again, taking it whatever version it then holds (so at most twice).
    let res = limiter_resolve(head, tail, packed | if code == STALE { STORE } else { 0 });
    let code = if code == STALE { limiter_charge_bucket(head, tail, now, packed | ANY_VERSION) } else { NO_BUCKET };
    if code == NO_BUCKET { limiter_charge_new(head, tail, now, packed, res) } else { code }
}

/// [`limiter_charge_bucket`]'s answer when its bucket's cached resolution
/// is older than the policy or the deny set.
const STALE: u64 = u64::MAX - 1;

/// The charge of a packet whose prefix has no bucket: `allow`/`deny`, the
/// new-source budget, then a full bucket (or window entry) charged once.
/// Returns the reason's index or [`WINDOW`].
#[unsafe(no_mangle)]
#[inline(never)]
#[expect(clippy::cast_possible_truncation, reason = "a resolution is a u32")]
pub extern "C" fn limiter_charge_new(head: u64, tail: u64, now: u64, packed: u64, res: u64) -> u64 {
    let Some(j) = job(head, tail, now, packed) else { return Reason::NoConfig as u64 };
    let res = res as u32;
    let resolved = (u64::from(j.version) << 32) | u64::from(res);
    if let Some(g) = resolution::allowing_group(res) {
        groups::count(g, true);
        return admit_listed(&j, resolved) as u64;
    }
    let r = match res {
        resolution::ALLOW => admit_listed(&j, resolved),
        resolution::DENY => deny_listed(&j, resolved),
        res if resolution::listed(res) => {
            deny::hit(res);
            deny_listed(&j, resolved)
        }
        // Finer denied networks inside: the bucket is made (uncharged)
        // to cache that, and the packet's address is asked first.
        res if res & resolution::FINER != 0 && packed & CHECKED == 0 => {
            if !new_source_admitted(j.cfg, j.now, &NEW_SOURCES) {
                return Reason::NewSourceLimited as u64;
            }
            let _ = BUCKETS.insert(j.key, BucketState { tat: gcra::fresh_tat(j.now), resolved }, BPF_NOEXIST);
            return FINER_CHECK;
        }
        res => match limits_for(j.cfg, j.class, j.slot, res) {
            None => Reason::NoConfig,
            Some(_) if !new_source_admitted(j.cfg, j.now, &NEW_SOURCES) => Reason::NewSourceLimited,
            Some(limits) => {
                let units = if limits.cost == cost::BYTES { j.len } else { 1 };
                if limits.is_window() {
                    let _ = BUCKETS.insert(j.key, BucketState { tat: 0, resolved }, BPF_NOEXIST);
                    return WINDOW | u64::from(res & !resolution::FINER);
                }
                let inc = units * limits.unit;
                let r = charge_new(&j.key, j.now, inc, limits.tau, resolved);
                return groups::to_group(finish_fine(&j, limits, r, None, Fine { units, inc, resolved }), res);
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
    let Some(res) = cached_resolution(p, j.version, packed & ANY_VERSION != 0) else { return STALE };
    // This CPU's entry remembers a denial, or finer denied networks, so
    // that the next packet of the bucket needs no lookup of it.
    let remember = |finer: bool, origin: u64| {
        Slot::probe(&j.key, packed & USABLE_BIT != 0).remember(&j.key, j.version, finer, origin);
    };
    if let Some(g) = resolution::allowing_group(res) {
        groups::count(g, true);
        return Reason::Allowed as u64;
    }
    let r = match res {
        resolution::ALLOW => Reason::Allowed,
        resolution::DENY => {
            remember(false, u64::MAX);
            Reason::Denied
        }
        res if resolution::listed(res) => {
            deny::hit(res);
            remember(false, u64::from(res & limiter_common::deny::ORIGIN));
            Reason::Denied
        }
        res if res & resolution::FINER != 0 && packed & CHECKED == 0 => {
            remember(true, 0);
            return FINER_CHECK;
        }
        res => match limits_for(j.cfg, j.class, j.slot, res) {
            None => Reason::NoConfig,
            Some(limits) if limits.is_window() => return WINDOW | u64::from(res & !resolution::FINER),
            Some(limits) => {
                let units = if limits.cost == cost::BYTES { j.len } else { 1 };
                let inc = units * limits.unit;
                // A bucket with finer denied networks (its packets come
                // back `CHECKED`) is never leased: a lease would admit
                // them without asking; nor is a group's of byte cost. A
                // group's of packets is: its packets admitted from the
                // lease are charged to this CPU's lease of the group's
                // budget (`lease::Slot::hit`).
                let usable = packed & (USABLE_BIT | CHECKED) == USABLE_BIT
                    && (limits.cost == cost::PACKETS || resolution::group(res).is_none());
                let cpu_slot = Slot::probe(&j.key, usable);
                let r = charge_leasing(p, &cpu_slot, &j.key, j.version, j.now, j.cfg.cpus, limits, inc);
                let resolved = (u64::from(j.version) << 32) | u64::from(res);
                return groups::to_group(finish_fine(&j, limits, r, Some(p), Fine { units, inc, resolved }), res);
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

/// The bucket's cached resolution, if it is of this `version` (or of
/// `any` version).
#[inline(always)]
#[expect(clippy::cast_possible_truncation, reason = "the low half of the word is the resolution")]
fn cached_resolution(p: *mut BucketState, version: u32, any: bool) -> Option<u32> {
    // SAFETY: p points to a live map value; an aligned 8-byte access is
    // single-copy atomic, so version and resolution are always a pair.
    let cached = unsafe { read_volatile(&raw const (*p).resolved) };
    ((cached >> 32) as u32 == version || any).then_some(cached as u32)
}

/// `allow` / `deny`: no charge. A listed prefix gets a bucket only to
/// cache its resolution, under a budget: an allowed one the new-source
/// budget (the packet passes either way), a denied one a budget of its
/// own at the same rate (`DENY_SOURCES`), so that a spoofed flood across
/// a denied range neither spends the budget real senders need nor fills
/// the LRU faster than that rate, evicting the buckets of real senders,
/// which would then come back with a fresh allowance (invariant 3).
/// Without a bucket a packet pays the resolution instead.
#[inline(always)]
fn admit_listed(j: &Job, resolved: u64) -> Reason {
    if new_source_admitted(j.cfg, j.now, &NEW_SOURCES) {
        let _ = BUCKETS.insert(j.key, BucketState { tat: gcra::fresh_tat(j.now), resolved }, BPF_NOEXIST);
    }
    Reason::Allowed
}

/// A denied prefix (override or deny set): [`admit_listed`]'s bucket,
/// under the deny budget.
#[inline(always)]
fn deny_listed(j: &Job, resolved: u64) -> Reason {
    if new_source_admitted(j.cfg, j.now, &DENY_SOURCES) {
        let _ = BUCKETS.insert(j.key, BucketState { tat: gcra::fresh_tat(j.now), resolved }, BPF_NOEXIST);
    }
    Reason::Denied
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
fn new_source_admitted(cfg: &Config, now: u64, budget: &Array<u64>) -> bool {
    if cfg.new_unit == 0 {
        return true;
    }
    let Some(p) = budget.get_ptr_mut(0) else { return true };
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

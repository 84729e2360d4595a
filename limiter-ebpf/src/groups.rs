//! Country and ASN groups (`limiter_common::groups`): the group of a
//! bucket's prefix (asked when the bucket resolves), and the group's
//! shared budget (charged per packet, after the prefix's own bucket).

use aya_ebpf::maps::lpm_trie::Key;
use limiter_common::{
    BucketKey, Reason, cost, family,
    groups::{DENIED_ORIGIN, GroupHits, GroupLimits, MAX_GROUPS, action},
    lease, mode, resolution,
    rules::coarser,
};

use crate::{
    atomic::{Cas, cas, refund, refund_tat},
    job::{job, limits_for},
    lease::Slot,
    maps::{BUCKETS, GROUP_BUCKETS, GROUP_HITS, GROUP_LIMITS, GROUPS4, GROUPS6},
    packed::USABLE_BIT,
};

/// The answer of both charge functions for a packet admitted by its
/// prefix's bucket (and aggregate) whose prefix is in a group: this bit
/// and the prefix's resolution. The entry point then charges the group
/// ([`limiter_charge_group`]), so that no call chain holds three stack
/// frames.
pub const GROUP_STEP: u64 = 1 << 34;

/// The resolution of the prefix `head`/`tail` (a bucket key's words)
/// when no override holds it: [`resolution::CLASS`], the group it is in,
/// or (an enforced `deny` group) a deny-set denial naming the group
/// ([`DENIED_ORIGIN`]); bit 32: an enforced `allow` or `deny` group,
/// which the deny set is not asked below (the policy file outranks the
/// automation that fills it), under `CONFIG` slot `slot`. A global
/// function, so that the resolution's frame stays small beside the deny
/// set's scan.
#[unsafe(no_mangle)]
#[inline(never)]
#[expect(clippy::cast_possible_truncation, reason = "a slot is 0 or 1")]
pub extern "C" fn limiter_group_of(head: u64, tail: u64, slot: u64) -> u64 {
    let g = of(&BucketKey::from_words(head, tail));
    match limits(slot as u32, g) {
        Some((i, l)) if l.action == action::DENY && l.mode != mode::SHADOW => {
            1 << 32 | u64::from(resolution::LISTED | DENIED_ORIGIN | i)
        }
        Some((_, l)) if l.action == action::ALLOW && l.mode != mode::SHADOW => {
            1 << 32 | u64::from(g | resolution::GROUP_ALLOWS)
        }
        _ => u64::from(g),
    }
}

/// The prefix's resolution when no override holds it: [`resolution::CLASS`],
/// or the group its prefix is in.
#[inline(always)]
fn of(key: &BucketKey) -> u32 {
    let found = if key.family == family::IPV4 {
        GROUPS4.get(Key::new(32, key.addr[0]))
    } else {
        GROUPS6.get(Key::new(64, [key.addr[0], key.addr[1]]))
    };
    found.map_or(resolution::CLASS, |g| resolution::grouped(*g))
}

/// The limits of the group `res` names under `CONFIG` slot `slot`, if it
/// names one this policy holds.
#[inline(always)]
pub fn limits(slot: u32, res: u32) -> Option<(u32, &'static GroupLimits)> {
    let g = resolution::group(res)?;
    // Masked rather than compared: a bound the verifier keeps on a spill.
    let g = g & (MAX_GROUPS - 1);
    let l = GROUP_LIMITS.get((slot & 1) * MAX_GROUPS + g)?;
    (l.action != action::NONE).then_some((g, l))
}

/// Count a packet of group `g`.
#[inline(always)]
pub fn count(g: u32, passed: bool) {
    if let Some(h) = GROUP_HITS.get_ptr_mut(g) {
        // SAFETY: per-CPU slot, only this CPU's softirq writes it.
        count_in(unsafe { &mut *h }, passed);
    }
}

#[inline(always)]
fn count_in(h: &mut GroupHits, passed: bool) {
    if passed {
        h.passed += 1;
    } else {
        h.dropped += 1;
    }
}

/// What the group of `res` says of one more packet at `now` under policy
/// `version`: a rate group `Admitted` (charged, counted as passed) or why
/// not (nothing charged; counted as dropped); a shadow `deny` group
/// `ShadowDropped`; any other (an `allow` group in shadow mode)
/// `Admitted`, counted. A rate group's packet is charged to this CPU's
/// lease of the group's budget while it holds, else to the budget, taking
/// a new lease when the budget holds plenty (as a bucket's: see
/// `limiter_common::lease`), after what the old one left went back.
#[inline(always)]
pub fn charge(slot: u32, res: u32, now: u64, version: u32, cpus: u32) -> Reason {
    let Some((g, l)) = limits(slot, res) else { return Reason::Admitted };
    let Some(h) = GROUP_HITS.get_ptr_mut(g) else { return Reason::Admitted };
    // SAFETY: per-CPU slot, only this CPU's softirq touches it.
    let h = unsafe { &mut *h };
    let shadow = l.mode == mode::SHADOW;
    let r = match l.action {
        action::RATE if h.lease_holds(version, now) => {
            h.spend();
            Reason::Admitted
        }
        action::RATE => match GROUP_BUCKETS.get_ptr_mut(g) {
            Some(p) => {
                // What the old lease left goes back, unless a policy since
                // gave the index another group's limits (then it is let go:
                // at most a lease, once).
                if h.lease_credit != 0 && h.lease_unit == l.unit {
                    refund_tat(p, h.lease_credit);
                }
                h.lease_credit = 0;
                let lease = lease::lease(l.unit, l.tau, false, cpus);
                let mut leased = false;
                let step = cas(p, |cur| {
                    let (next, took) = lease::admit(cur, now, l.unit, l.tau, lease, cpus)?;
                    leased = took;
                    Some(next)
                });
                match step {
                    Cas::Done => {
                        if leased {
                            h.lease_credit = lease;
                            h.lease_unit = l.unit;
                            h.lease_until = now.saturating_add(lease);
                            h.lease_version = version;
                        }
                        Reason::Admitted
                    }
                    Cas::Refused(_) if shadow => Reason::ShadowDropped,
                    Cas::Refused(_) => Reason::GroupLimited,
                    Cas::Contended => Reason::Contended,
                }
            }
            None => Reason::Admitted,
        },
        action::DENY if shadow => Reason::ShadowDropped,
        _ => Reason::Admitted,
    };
    count_in(h, r == Reason::Admitted);
    r
}

/// A packet both tiers admitted, of a prefix in a group: [`GROUP_STEP`]
/// and the resolution, for the entry point to charge the group
/// ([`limiter_charge_group`]); otherwise the reason's index.
#[inline(always)]
pub fn to_group(r: Reason, res: u32) -> u64 {
    if r == Reason::Admitted && resolution::group(res).is_some() { GROUP_STEP | u64::from(res) } else { r as u64 }
}

/// The group's shared budget (`res`: the prefix's resolution, in a
/// group), charged after the prefix's bucket and its aggregate admitted
/// the packet: if the group refuses, both are refunded, so a packet is
/// charged to every tier or to none, and a flood its own bucket refuses
/// never drains its group (a shadow group's refusal passes the packet,
/// charged to its prefix as any). A global function, its own frame beside the
/// charge's. Returns the reason's index.
#[unsafe(no_mangle)]
#[inline(never)]
#[expect(clippy::cast_possible_truncation, reason = "a resolution is a u32")]
pub extern "C" fn limiter_charge_group(head: u64, tail: u64, now: u64, packed: u64, res: u64) -> u64 {
    let Some(j) = job(head, tail, now, packed) else { return Reason::NoConfig as u64 };
    let res = res as u32;
    // A lease the bucket's charge took for this CPU is the group's: its
    // packets are charged to the group's lease too.
    // (Any group's: a shadow `deny` group's packets, never leased by the
    // group, each reach it this way.)
    if let Some(g) = resolution::group(res) {
        Slot::probe(&j.key, packed & USABLE_BIT != 0).mark_group(&j.key, g);
    }
    let r = charge(j.slot, res, now, j.version, j.cfg.cpus);
    // Passed (a shadow group's would-be drop too): the prefix's charge
    // stands, as if the group were not there.
    if r == Reason::Admitted || r == Reason::ShadowDropped {
        return r as u64;
    }
    if let Some(limits) = limits_for(j.cfg, j.class, j.slot, res) {
        let units = if limits.cost == cost::BYTES { j.len } else { 1 };
        if let Some(p) = BUCKETS.get_ptr_mut(j.key) {
            refund(p, units * limits.unit);
        }
        if j.class == 0
            && j.cfg.agg_unit != 0
            && let Some(p) = BUCKETS.get_ptr_mut(coarser(&j.key, j.cfg.agg_v4_prefix, j.cfg.agg_v6_prefix))
        {
            refund(p, units * j.cfg.agg_unit);
        }
    }
    r as u64
}

//! Entry points and the charging step.

use core::{
    intrinsics::{AtomicOrdering, atomic_cxchg},
    ptr::{read_volatile, write_volatile},
};

use aya_ebpf::{
    bindings::xdp_action, helpers::bpf_ktime_get_coarse_ns, macros::xdp, maps::lpm_trie::Key, programs::XdpContext,
};
use aya_log_ebpf::debug;
use limiter_common::{
    BucketKey, BucketState, ClassLimits, Config, DropEvent, MAX_CLASSES, MAX_MATCHERS, Reason, Refusal, Verdict, cost,
    family, flags, gcra,
    maps::MAX_OVERRIDES,
    mode,
    prefix::{mask_v4, mask_v6},
    reason::MAX_CAS_RETRIES,
    resolution, stat_index,
};

use crate::{
    maps::{
        ACTIVE, BUCKETS, CLASS_STATS, CONFIG, DROP_EVENTS, DROP_SAMPLER, NEW_SOURCES, OVR_LIMITS, OVR4_0, OVR4_1,
        OVR6_0, OVR6_1, REFUSALS, STATS, TEST_CLOCK,
    },
    parse::{Source, parse},
};

const BPF_NOEXIST: u64 = 1;
const EEXIST: i32 = 17;

/// Production entry point.
///
/// Clock: `bpf_ktime_get_coarse_ns` (CLOCK_MONOTONIC_COARSE, kernel 5.11+).
/// It costs ~17 ns against ~50 ns for `bpf_ktime_get_ns` on these machines,
/// and lags true time by at most one jiffy (4 ms at HZ=250). Error bound:
/// over a window W the bucket may admit up to `rate * jiffy` units beyond
/// `burst + rate * W`, and a sender conforming to `(rate, burst)` may see up
/// to `rate * jiffy` units refused at the very edge of its allowance.
#[xdp]
pub fn limiter(ctx: XdpContext) -> u32 {
    let mut fam = 0;
    // SAFETY: a BPF helper with no arguments.
    let reason = try_limiter(&ctx, &mut fam, || unsafe { bpf_ktime_get_coarse_ns() });
    finish(&ctx, reason, fam)
}

/// Test entry point: identical code, but `now` comes from `TEST_CLOCK[0]`
/// so tests replay packet sequences with exact timestamps.
#[xdp]
pub fn limiter_test_clock(ctx: XdpContext) -> u32 {
    let mut fam = 0;
    let reason = try_limiter(&ctx, &mut fam, || TEST_CLOCK.get(0).copied().unwrap_or(0));
    finish(&ctx, reason, fam)
}

/// Count the reason and turn it into the XDP action. Every path ends here.
#[inline(always)]
fn finish(ctx: &XdpContext, reason: Reason, fam: u32) -> u32 {
    if let Some(c) = STATS.get_ptr_mut(stat_index(reason, fam)) {
        let len = (ctx.data_end() - ctx.data()) as u64;
        // SAFETY: per-CPU slot, only this CPU's softirq writes it.
        unsafe {
            (*c).packets += 1;
            (*c).bytes += len;
        }
    }
    match reason.verdict() {
        Verdict::Pass => xdp_action::XDP_PASS,
        Verdict::Drop => xdp_action::XDP_DROP,
    }
}

#[inline(always)]
fn try_limiter(ctx: &XdpContext, fam: &mut u32, now: impl FnOnce() -> u64) -> Reason {
    let src = match parse(ctx, fam) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let slot = ACTIVE.get(0).copied().unwrap_or(0) & 1;
    let Some(cfg) = CONFIG.get(slot) else {
        return Reason::NoConfig;
    };
    if cfg.flags & flags::CONFIGURED == 0 {
        return Reason::NoConfig;
    }
    let class = classify(cfg, &src);
    let key = prefix_key(&src, cfg.v4_prefix, cfg.v6_prefix, class as u8);
    let version = cfg.version as u32;
    let now = gcra::to_fixed(now());
    // The cache is kept only while no aggregate refund can lower a tat
    // (see `limiter_common::Refusal`); otherwise it is not even probed.
    let refusal = if cfg.agg_unit == 0 { REFUSALS.get_ptr_mut(Refusal::slot(&key)) } else { None };
    let reason = match still_refused(refusal, &key, version, now) {
        Some(r) => r,
        None => match charge(ctx, cfg, &src, class, &key, slot, version, now, refusal) {
            Some(r) => r,
            None => return Reason::NoConfig,
        },
    };
    count_class(ctx, class, reason);
    if reason.verdict() == Verdict::Drop {
        sample_drop(ctx, cfg, &key, reason, now);
    }
    reason
}

/// The reason a packet of `key` gets from its bucket (and the aggregate
/// tier); `None` if the policy names limits that are not there.
#[inline(always)]
#[expect(clippy::too_many_arguments, reason = "one call site, inlined: the packet's whole context")]
fn charge(
    ctx: &XdpContext,
    cfg: &Config,
    src: &Source,
    class: usize,
    key: &BucketKey,
    slot: u32,
    version: u32,
    now: u64,
    refusal: Option<*mut Refusal>,
) -> Option<Reason> {
    let bucket = BUCKETS.get_ptr_mut(key);
    let res = match bucket {
        Some(p) => cached_resolution(p, key, slot, version),
        None => resolve(key, slot),
    };
    Some(match res {
        resolution::ALLOW => admit_listed(bucket, cfg, key, now, version, res, Reason::Allowed),
        resolution::DENY => admit_listed(bucket, cfg, key, now, version, res, Reason::Denied),
        _ => {
            let limits = limits_for(cfg, class, slot, res)?;
            let units = if limits.cost == cost::BYTES { (ctx.data_end() - ctx.data()) as u64 } else { 1 };
            let inc = units * limits.unit;
            let resolved = (u64::from(version) << 32) | u64::from(res);
            let shadow = limits.mode == mode::SHADOW;
            let mut r = match bucket {
                Some(p) => {
                    let c = charge_existing(p, now, inc, limits.tau);
                    // A smaller packet may fit where this one did not:
                    // only packet-cost refusals hold for the next packet.
                    if let Cas::Refused(seen) = c
                        && limits.cost != cost::BYTES
                    {
                        let until = seen.saturating_add(inc).saturating_sub(limits.tau);
                        remember_refusal(refusal, key, version, until, shadow);
                    }
                    c.reason()
                }
                None if !new_source_admitted(cfg, now) => Reason::NewSourceLimited,
                None => charge_new(key, now, inc, limits.tau, resolved),
            };
            if r == Reason::Admitted && class == 0 && cfg.agg_unit != 0 {
                r = charge_aggregate(src, cfg, bucket, key, now, units, resolved, inc);
            }
            if r == Reason::RateLimited && shadow { Reason::ShadowDropped } else { r }
        }
    })
}

/// The cached refusal of `key`, if this CPU saw its bucket refuse under
/// this policy and `now` is still before the end of that refusal.
#[inline(always)]
fn still_refused(entry: Option<*mut Refusal>, key: &BucketKey, version: u32, now: u64) -> Option<Reason> {
    let e = entry?;
    // SAFETY: per-CPU slot, only this CPU's softirq touches it.
    let e = unsafe { &*e };
    if now >= e.until || e.version != version || e.key != *key {
        return None;
    }
    Some(if e.shadow != 0 { Reason::ShadowDropped } else { Reason::RateLimited })
}

#[inline(always)]
fn remember_refusal(entry: Option<*mut Refusal>, key: &BucketKey, version: u32, until: u64, shadow: bool) {
    if let Some(e) = entry {
        // SAFETY: per-CPU slot, only this CPU's softirq touches it.
        unsafe { *e = Refusal { key: *key, version, until, shadow: u32::from(shadow), pad: 0 } };
    }
}

/// One in `drop_sample` drops (per CPU) goes to the ring buffer for the
/// top-offenders list. Drop path only; the admit path pays nothing.
/// A sampled drop is also logged through aya-log, at debug level only
/// (off unless the daemon runs with debug logging) and at most once a
/// second per CPU.
#[inline(always)]
fn sample_drop(ctx: &XdpContext, cfg: &Config, key: &BucketKey, reason: Reason, now: u64) {
    let every = u64::from(cfg.drop_sample);
    let Some(n) = DROP_SAMPLER.get_ptr_mut(0) else { return };
    // SAFETY: per-CPU slot, only this CPU's softirq writes it.
    let seen = unsafe {
        *n += 1;
        *n
    };
    if every == 0 || seen & (every - 1) != 0 {
        return;
    }
    let _ = DROP_EVENTS.output(DropEvent { key: *key, reason: reason as u32 }, 0);
    let Some(last) = DROP_SAMPLER.get_ptr_mut(1) else { return };
    // SAFETY: per-CPU slot, only this CPU's softirq writes it.
    unsafe {
        if now.wrapping_sub(*last) >= gcra::to_fixed(gcra::NS_PER_S) {
            *last = now;
            debug!(
                ctx,
                "sampled drop: family {} /{} class {} reason {}", key.family, key.prefix_len, key.class, reason as u32
            );
        }
    }
}

/// The bucket's cached override resolution, refreshed (one trie lookup and
/// one 8-byte store) when the policy version has changed since.
#[inline(always)]
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
fn resolve(key: &BucketKey, slot: u32) -> u32 {
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
/// that hold no state and evict the buckets of real senders (which would
/// then come back with a fresh allowance); without a bucket a packet pays
/// one trie lookup instead.
#[inline(always)]
fn admit_listed(
    bucket: Option<*mut BucketState>,
    cfg: &Config,
    key: &BucketKey,
    now: u64,
    version: u32,
    res: u32,
    reason: Reason,
) -> Reason {
    if bucket.is_none() && res == resolution::ALLOW && new_source_admitted(cfg, now) {
        let resolved = (u64::from(version) << 32) | u64::from(res);
        let _ = BUCKETS.insert(key, BucketState { tat: gcra::fresh_tat(now), resolved }, BPF_NOEXIST);
    }
    reason
}

/// The first matcher that fits the packet names its class; else class 0.
#[inline(always)]
fn classify(cfg: &Config, src: &Source) -> usize {
    for i in 0..MAX_MATCHERS {
        if i as u32 >= cfg.n_matchers {
            break;
        }
        let m = &cfg.matchers[i];
        if m.proto != 0 && m.proto != src.proto {
            continue;
        }
        let any_port = m.port_lo == 0 && m.port_hi == u16::MAX;
        if !any_port && (src.port_known == 0 || src.dport < m.port_lo || src.dport > m.port_hi) {
            continue;
        }
        if m.syn != 0 && src.syn == 0 {
            continue;
        }
        return usize::from(m.class) & (MAX_CLASSES - 1);
    }
    0
}

#[inline(always)]
fn count_class(ctx: &XdpContext, class: usize, reason: Reason) {
    let Some(c) = CLASS_STATS.get_ptr_mut(class as u32) else {
        return;
    };
    let len = (ctx.data_end() - ctx.data()) as u64;
    // SAFETY: per-CPU slot, only this CPU's softirq writes it.
    let slot = unsafe {
        match (reason, reason.verdict()) {
            (Reason::ShadowDropped, _) => &mut (*c).shadow,
            // Also a bucket that could not be inserted: it fails open.
            (_, Verdict::Pass) => &mut (*c).admitted,
            (_, Verdict::Drop) => &mut (*c).dropped,
        }
    };
    slot.packets += 1;
    slot.bytes += len;
}

/// The bucket key of `src` masked to the family's prefix length.
#[inline(always)]
fn prefix_key(src: &Source, v4_len: u32, v6_len: u32, class: u8) -> BucketKey {
    if src.family == family::IPV4 {
        BucketKey {
            family: family::IPV4,
            prefix_len: v4_len as u8,
            class,
            pad: 0,
            addr: [mask_v4(src.addr[0], v4_len), 0],
        }
    } else {
        // v6_len <= MAX_V6_BUCKET_PREFIX (policy-checked): the first 64
        // bits hold the whole prefix.
        let [a, b, _, _] = mask_v6(src.addr, v6_len);
        BucketKey { family: family::IPV6, prefix_len: v6_len as u8, class, pad: 0, addr: [a, b] }
    }
}

/// The aggregate tier, charged after the fine bucket admitted the packet:
/// a flood its own bucket refuses never reaches (and never drains) its
/// aggregate. If the aggregate refuses, the fine charge is refunded, so a
/// packet is charged to both tiers or to neither.
#[inline(always)]
fn charge_aggregate(
    src: &Source,
    cfg: &Config,
    fine: Option<*mut BucketState>,
    fine_key: &BucketKey,
    now: u64,
    units: u64,
    resolved: u64,
    fine_inc: u64,
) -> Reason {
    let agg = prefix_key(src, cfg.agg_v4_prefix, cfg.agg_v6_prefix, 0);
    let inc = units * cfg.agg_unit;
    let r = match BUCKETS.get_ptr_mut(&agg) {
        Some(p) => charge_existing(p, now, inc, cfg.agg_tau).reason(),
        None => charge_new(&agg, now, inc, cfg.agg_tau, resolved),
    };
    if r == Reason::Admitted {
        return r;
    }
    // The fine bucket is looked up again only if this packet created it.
    if let Some(p) = fine.or_else(|| BUCKETS.get_ptr_mut(fine_key)) {
        refund(p, fine_inc);
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
/// the LRU nor each buy a fresh allowance faster than the budget allows.
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
/// times. CAS makes the update exact across CPUs: no race overshoot.
#[inline(always)]
pub(crate) fn charge_existing(p: *mut BucketState, now: u64, inc: u64, tau: u64) -> Cas {
    // SAFETY: p points to a live map value.
    cas(unsafe { &raw mut (*p).tat }, |cur| gcra::admit(cur, now, inc, tau))
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cas {
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

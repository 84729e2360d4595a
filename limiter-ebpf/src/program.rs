//! Entry points and the charging step.

use core::{
    intrinsics::{AtomicOrdering, atomic_cxchg},
    ptr::read_volatile,
};

use aya_ebpf::{
    bindings::xdp_action, helpers::bpf_ktime_get_coarse_ns, macros::xdp, programs::XdpContext,
};
use limiter_common::{
    BucketKey, BucketState, Config, MAX_CLASSES, MAX_MATCHERS, Reason, Verdict, cost, family,
    flags, gcra, mode,
    prefix::{mask_v4, mask_v6},
    reason::MAX_CAS_RETRIES,
};

use crate::{
    maps::{ACTIVE, BUCKETS, CLASS_STATS, CONFIG, STATS, TEST_CLOCK},
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
    // SAFETY: a BPF helper with no arguments.
    finish(
        &ctx,
        try_limiter(&ctx, || unsafe { bpf_ktime_get_coarse_ns() }),
    )
}

/// Test entry point: identical code, but `now` comes from `TEST_CLOCK[0]`
/// so tests replay packet sequences with exact timestamps.
#[xdp]
pub fn limiter_test_clock(ctx: XdpContext) -> u32 {
    finish(
        &ctx,
        try_limiter(&ctx, || TEST_CLOCK.get(0).copied().unwrap_or(0)),
    )
}

/// Bench baseline: the cheapest possible XDP program, for ratios.
#[xdp]
pub fn baseline_drop(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_DROP
}

/// Count the reason and turn it into the XDP action. Every path ends here.
#[inline(always)]
fn finish(ctx: &XdpContext, reason: Reason) -> u32 {
    if let Some(c) = STATS.get_ptr_mut(reason as u32) {
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
fn try_limiter(ctx: &XdpContext, now: impl FnOnce() -> u64) -> Reason {
    let src = match parse(ctx) {
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
    let Some(limits) = cfg.classes.get(class) else {
        return Reason::NoConfig;
    };
    let key = bucket_key(&src, cfg, class as u8);
    let inc = if limits.cost == cost::BYTES {
        (ctx.data_end() - ctx.data()) as u64 * limits.unit
    } else {
        limits.unit
    };
    let mut reason = charge(
        &key,
        gcra::to_fixed(now()),
        inc,
        limits.tau,
        cfg.version as u32,
    );
    if reason == Reason::RateLimited && limits.mode == mode::SHADOW {
        reason = Reason::ShadowDropped;
    }
    count_class(ctx, class, reason);
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
        match reason {
            Reason::Admitted => &mut (*c).admitted,
            Reason::ShadowDropped => &mut (*c).shadow,
            _ => &mut (*c).dropped,
        }
    };
    slot.packets += 1;
    slot.bytes += len;
}

#[inline(always)]
fn bucket_key(src: &Source, cfg: &Config, class: u8) -> BucketKey {
    if src.family == family::IPV4 {
        BucketKey {
            family: family::IPV4,
            prefix_len: cfg.v4_prefix as u8,
            class,
            pad: 0,
            addr: [mask_v4(src.addr[0], cfg.v4_prefix), 0, 0, 0],
        }
    } else {
        BucketKey {
            family: family::IPV6,
            prefix_len: cfg.v6_prefix as u8,
            class,
            pad: 0,
            addr: mask_v6(src.addr, cfg.v6_prefix),
        }
    }
}

#[inline(always)]
fn charge(key: &BucketKey, now: u64, inc: u64, tau: u64, version: u32) -> Reason {
    if let Some(p) = BUCKETS.get_ptr_mut(key) {
        return charge_existing(p, now, inc, tau);
    }
    let fresh = gcra::fresh_tat(now);
    let (tat, reason) = match gcra::admit(fresh, now, inc, tau) {
        Some(t) => (t, Reason::Admitted),
        None => (fresh, Reason::RateLimited),
    };
    match BUCKETS.insert(
        key,
        BucketState {
            tat,
            version,
            limit: 0,
        },
        BPF_NOEXIST,
    ) {
        Ok(()) => reason,
        // Another CPU created it between our lookup and insert: charge that one.
        Err(e) if e == -EEXIST => match BUCKETS.get_ptr_mut(key) {
            Some(p) => charge_existing(p, now, inc, tau),
            None => Reason::BucketInsertFailed,
        },
        Err(_) => Reason::BucketInsertFailed,
    }
}

/// One GCRA step applied with compare-and-swap, retried a bounded number of
/// times. CAS makes the update exact across CPUs: no race overshoot.
#[inline(always)]
fn charge_existing(p: *mut BucketState, now: u64, inc: u64, tau: u64) -> Reason {
    for _ in 0..MAX_CAS_RETRIES {
        // An atomic load crashes the BPF backend; a volatile 8-byte load is
        // single-copy atomic on the BPF ISA, which is all we need here.
        // SAFETY: p points to a live map value for the duration of the program.
        let cur = unsafe { read_volatile(&raw const (*p).tat) };
        let Some(new) = gcra::admit(cur, now, inc, tau) else {
            return Reason::RateLimited;
        };
        // SAFETY: as above; BPF_CMPXCHG on a map value is verifier-approved.
        let (_, swapped) = unsafe {
            atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(
                &raw mut (*p).tat,
                cur,
                new,
            )
        };
        if swapped {
            return Reason::Admitted;
        }
    }
    Reason::Contended
}

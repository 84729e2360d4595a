//! Entry points: parse, classify, key, then this CPU's slot (a lease or a
//! cached refusal) or a charge; every packet is counted once, under its
//! class, reason and family, and every path ends in [`finish`], which
//! returns the reason's verdict (invariant 9).

use aya_ebpf::{
    bindings::xdp_action,
    helpers::{bpf_jiffies64, bpf_ktime_get_coarse_ns},
    macros::xdp,
    programs::XdpContext,
};
use limiter_common::{
    Family, Reason, UNCLASSIFIED, Verdict, family, flags, gcra,
    packet::{IPPROTO_TCP, parse},
    rules::{bucket_key, classify},
};

use crate::{
    answer,
    charge::{Charge, charge},
    count::{count, sample_drop, sample_pass},
    deny,
    lease::{Hit, Slot},
    maps::{ACTIVE, CLOCK_CACHE, CONFIG, TEST_CLOCK},
    packet::Packet,
    state, tunnel,
};

/// Production entry point.
///
/// Clock: `bpf_ktime_get_coarse_ns` (CLOCK_MONOTONIC_COARSE, kernel 5.11+).
/// It costs a fraction of `bpf_ktime_get_ns`, and lags true time by at
/// most one jiffy (4 ms at HZ=250). Error bound: over a window W the bucket
/// may admit up to `rate * jiffy` units beyond `burst + rate * W`, and a
/// sender conforming to `(rate, burst)` may see up to `rate * jiffy` units
/// refused at the very edge of its allowance (invariants 1 and 2).
#[xdp]
pub fn limiter(ctx: XdpContext) -> u32 {
    production(&ctx)
}

/// The production program, for its two entry points: [`limiter`] (the
/// interface's own) and `chain::limiter_chain` (a dispatcher's slot).
#[inline(always)]
pub fn production(ctx: &XdpContext) -> u32 {
    let pkt = Packet(ctx);
    let mut fam = family::NONE;
    let counted = try_limiter(&pkt, &mut fam, coarse_now);
    let tunnels = state::tunnels(&counted);
    finish(&pkt, state::settle(&pkt, counted, false), fam, tunnels)
}

/// `bpf_ktime_get_coarse_ns`, read once per jiffy on each CPU: the coarse
/// clock only moves at the tick, when the jiffies do, and reading
/// `jiffies64` costs one helper call where the coarse clock costs several
/// nested ones. The tick updates the jiffies a moment before the clock: a
/// read that finds the clock not yet moved is not kept, but a CPU that
/// read nothing in the previous jiffy and reads in that moment keeps the
/// previous tick's value for the rest of the jiffy, so the clock may lag
/// by two jiffies instead of one (never stepping back).
#[inline(always)]
fn coarse_now() -> u64 {
    // SAFETY: BPF helpers with no arguments.
    let (jiffy, read) = (unsafe { bpf_jiffies64() }, || unsafe { bpf_ktime_get_coarse_ns() });
    let Some(c) = CLOCK_CACHE.get_ptr_mut(0) else { return read() };
    // SAFETY: per-CPU slot, only this CPU's softirq touches it.
    let c = unsafe { &mut *c };
    if c.jiffy == jiffy {
        return c.ns;
    }
    let ns = read();
    if ns > c.ns {
        *c = limiter_common::ClockCache { jiffy, ns };
    }
    ns
}

/// Test entry point: identical code, but `now` comes from `TEST_CLOCK[0]`
/// so tests and `limiter replay` run packets with exact timestamps.
#[xdp]
pub fn limiter_test_clock(ctx: XdpContext) -> u32 {
    let pkt = Packet(&ctx);
    let mut fam = family::NONE;
    let counted = try_limiter(&pkt, &mut fam, || TEST_CLOCK.get(0).copied().unwrap_or(0));
    let tunnels = state::tunnels(&counted);
    finish(&pkt, state::settle(&pkt, counted, true), fam, tunnels)
}

/// Turn the reason into the XDP action, counting it first if the packet
/// was not classified (`Err`: malformed, not IP, no policy; a classified
/// packet, `Ok`, was counted under its class). A passed packet, while the
/// policy forwards some destination (`tunnels`), is the tunnel's to
/// forward or pass. Every path ends here.
#[inline(always)]
fn finish(pkt: &Packet, counted: Result<Reason, Reason>, fam: Family, tunnels: bool) -> u32 {
    let reason = match counted {
        Ok(r) => r,
        Err(r) => {
            let _ = count(UNCLASSIFIED, r, fam, pkt.len());
            r
        }
    };
    match reason.verdict() {
        Verdict::Pass if tunnels => tunnel::forward(pkt),
        Verdict::Pass => xdp_action::XDP_PASS,
        Verdict::Drop => xdp_action::XDP_DROP,
        Verdict::Tx => xdp_action::XDP_TX,
    }
}

/// The packet's reason (`Err`: not classified, not counted) and what the
/// out-of-state check is asked (see `state::settle`).
#[inline(always)]
#[expect(clippy::cast_possible_truncation, reason = "class < MAX_CLASSES; versions compare in their low 32 bits")]
fn try_limiter(pkt: &Packet, fam: &mut Family, now: impl FnOnce() -> u64) -> Result<(Reason, u64), Reason> {
    let src = parse(pkt, fam)?;
    // `ACTIVE`: the `CONFIG` slot, the `DENY_LENS` slot, and the deny
    // set's change count above them.
    let active = ACTIVE.get(0).copied().unwrap_or(0);
    let slot = active & limiter_common::deny::active::CONFIG_SLOT;
    let Some(cfg) = CONFIG.get(slot) else {
        return Err(Reason::NoConfig);
    };
    if cfg.flags & flags::CONFIGURED == 0 {
        return Err(Reason::NoConfig);
    }
    let class = classify(cfg, &src);
    let key = bucket_key(&src, cfg.v4_prefix, cfg.v6_prefix, class as u8);
    // Cached resolutions and leases hold until the policy or the deny set
    // changes: both counts only grow, so their sum names each state.
    let version = (cfg.version as u32).wrapping_add(active >> limiter_common::deny::active::COUNT_SHIFT);
    let now = gcra::to_fixed(now());
    let cookies = cfg.flags & flags::SYN_COOKIES != 0 && src.proto == IPPROTO_TCP && src.port_known == 1;
    let c = Charge { pkt, cfg, src: &src, class, key: &key, slot, version, now };
    if cookies && let Some(r) = cookies::intercept(&c) {
        let _ = count(class, r, *fam, pkt.len());
        return Ok((r, 0));
    }
    // Slots are used only while no aggregate refund can lower a tat (see
    // `limiter_common::lease::CpuSlot`); otherwise not even probed.
    let slot = Slot::probe(&key, cfg.agg_unit == 0);
    let reason = match slot.hit(&key, version, now, pkt.len()) {
        Hit::Reason(r) => r,
        Hit::Listed(value) => {
            deny::hit(value);
            Reason::Denied
        }
        // The bucket is known to hold finer denied networks: the address
        // is asked without a lookup of the bucket.
        Hit::Finer if deny::finer(&src, key.prefix_len, version, true) => Reason::Denied,
        Hit::Finer => charge(&c, &slot, true),
        Hit::Miss => charge(&c, &slot, false),
    };
    // A SYN the new-source budget refuses trips `auto` SYN cookies and is
    // answered with one.
    let reason = match reason {
        Reason::NewSourceLimited if cookies => cookies::on_budget_refusal(&c).unwrap_or(reason),
        r => r,
    };
    let reason = answer::unless_own(pkt.0, cfg, class, reason, now, pkt.len());
    let seen = count(class, reason, *fam, pkt.len());
    // Out-of-state TCP: a segment to judge is judged (and sampled) after
    // this program's work (`state::settle`), which corrects this count
    // if it drops the segment.
    let asked = state::ask(pkt, cfg, class, reason, now, seen) | state::tunnels_on(cfg);
    if state::judged(asked) {
        return Ok((reason, asked));
    }
    // Shadow mode's would-be drops are sampled too: `limiter top` shows
    // what enforcing would drop before it does. A pass is copied only
    // while a capture asks for passes (one load and one test otherwise).
    if reason.verdict() == Verdict::Drop || reason == Reason::ShadowDropped {
        sample_drop::<true>(pkt.0, cfg, &key, reason, now, seen);
    } else if reason.verdict() == Verdict::Pass {
        sample_pass::<true>(pkt.0, &key, reason, now, seen);
    }
    Ok((reason, asked))
}

/// SYN cookies, or (the object built with `without-syn-cookies`) none:
/// every SYN is charged as any packet, and no cookie helper is called.
#[cfg(not(feature = "without-syn-cookies"))]
use crate::cookie as cookies;

#[cfg(feature = "without-syn-cookies")]
mod cookies {
    use limiter_common::Reason;

    use crate::charge::Charge;

    #[inline(always)]
    pub fn intercept(_: &Charge) -> Option<Reason> {
        None
    }

    #[inline(always)]
    pub fn on_budget_refusal(_: &Charge) -> Option<Reason> {
        None
    }
}

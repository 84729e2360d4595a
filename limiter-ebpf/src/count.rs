//! What every packet leaves behind: one counter, of its class, reason and
//! family (per CPU, so no atomics in softirq), and for a 1-in-N random
//! sample of drops an event for the top-offenders list and escalation (with each
//! verified SYN cookie's address as proof of source).

use aya_ebpf::bindings::xdp_md;
use aya_ebpf::programs::XdpContext;
use aya_log_ebpf::debug;
use limiter_common::{
    BucketKey, Config, DropEvent, Family, Reason, family, gcra,
    packet::{Frame as _, word as w},
    stat_index,
};

use crate::packet::Packet;

use crate::maps::{DROP_EVENTS, DROP_SAMPLER, STATS};

/// An address proved itself (a verified SYN cookie): told to userspace
/// unsampled, in the drop events' ring, for escalation's proof of source.
#[cfg_attr(feature = "without-syn-cookies", expect(dead_code, reason = "SYN cookies only"))]
#[inline(always)]
pub fn proven(ctx: &XdpContext, key: &BucketKey) {
    let (head, tail) = key.words();
    limiter_drop_event(ctx.ctx, head, tail, Reason::SynCookieVerified as u64);
}

/// One event, written in place in the ring (reserve, fill, submit): built
/// on the stack and copied, its 32 bytes took the SYN-ACK path's call
/// chain past the verifier's 512-byte combined stack limit.
#[inline(always)]
fn event(key: &BucketKey, src: Option<&[u32; 4]>, reason: Reason, held: u32) {
    let Some(mut e) = DROP_EVENTS.reserve::<DropEvent>(0) else { return };
    let p = e.as_mut_ptr();
    // SAFETY: `p` is the reserved record, DropEvent-sized; each field is
    // written straight into it (no copy of the whole on the stack).
    unsafe {
        (&raw mut (*p).key).write(*key);
        (&raw mut (*p).reason).write(reason as u32);
        (&raw mut (*p).src).write(src.copied().unwrap_or_default());
        (&raw mut (*p).held).write(held);
        (&raw mut (*p).pad).write(0);
    }
    e.submit(0);
}

/// MurmurHash3's 64-bit finalizer: every bit of `k` moves every bit out,
/// so the low bits of consecutive counts fall as at random (no stride).
#[inline(always)]
const fn mix(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

/// A sampled drop's event, with the packet's source address read again
/// from the packet here, as a global function: the address is not kept
/// on the main program's stack to the end of a packet's path, which kept
/// the combined stack of the call chain through the SYN-ACK builder over
/// the verifier's 512 bytes.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn limiter_drop_event(ctx: *mut xdp_md, head: u64, tail: u64, reason: u64) -> u64 {
    let xdp = XdpContext::new(ctx);
    let pkt = Packet(&xdp);
    let key = BucketKey::from_words(head, tail);
    let src = source_of(&pkt, key.family == family::IPV6);
    // The reason's index, and above it whether the segment was held.
    let of_held_connection = u32::from(reason & HELD != 0);
    let reason = Reason::from_index(u32::try_from(reason & !HELD).unwrap_or(u32::MAX)).unwrap_or(Reason::NoConfig);
    event(&key, src.as_ref(), reason, of_held_connection);
    0
}

/// [`limiter_drop_event`]'s `reason` bit: the segment's connection is
/// held by this host ([`crate::held`]).
const HELD: u64 = 1 << 32;

/// The source address of an IPv4 or IPv6 packet behind up to two VLAN
/// tags (as the parser found it), network byte order.
#[inline(always)]
fn source_of(pkt: &Packet, v6: bool) -> Option<[u32; 4]> {
    let l3 = pkt.l3()?;
    if v6 {
        let a = pkt.bytes_at::<16>(l3 + 8)?;
        Some([w(a, 0), w(a, 4), w(a, 8), w(a, 12)])
    } else {
        let a = pkt.bytes_at::<4>(l3 + 12)?;
        Some([w(a, 0), 0, 0, 0])
    }
}

/// Count one packet of `len` bytes of `class` (or `UNCLASSIFIED`) under
/// `reason` and stat family `fam`; returns that counter's packets on this
/// CPU (so far, this one included).
#[inline(always)]
pub fn count(class: usize, reason: Reason, fam: Family, len: u64) -> u64 {
    let Some(c) = STATS.get_ptr_mut(stat_index(class, reason, fam)) else { return 0 };
    // SAFETY: per-CPU slot, only this CPU's softirq writes it.
    unsafe {
        (*c).packets += 1;
        (*c).bytes += len;
        (*c).packets
    }
}

/// One drop in `drop_sample` (a power of two), drawn at random for each
/// drop, goes to the ring buffer for the top-offenders list, escalation,
/// link pressure. At random, not every Nth drop of a counter: two
/// sources interleaved packet by packet at the same rate aliased with a
/// counter, one always sampled and the other never; a random draw sees
/// every source in proportion to its drops, whatever their order. The
/// draw is `seen` (the drop's counter's packets on this CPU) plus the
/// clock, through [`mix`]: the kernel's random helper cost 1.10x the
/// drop path, this draw 1.00x (`cargo xtask bench hit`). Drop path only;
/// the admit path pays nothing, and a drop that is not sampled pays the
/// draw and a test. A sampled drop is also logged through aya-log, at
/// debug level only (off unless the daemon runs with debug logging) and
/// at most once a second per CPU.
#[inline(always)]
pub fn sample_drop(ctx: &XdpContext, cfg: &Config, key: &BucketKey, reason: Reason, now: u64, seen: u64) {
    let every = u64::from(cfg.drop_sample);
    if every == 0 || mix(seen.wrapping_add(now)) & (every - 1) != 0 {
        return;
    }
    let (head, tail) = key.words();
    // Escalation's evidence, asked of the sockets for a sampled
    // rate-limited TCP drop only.
    let evidence = if reason == Reason::RateLimited && crate::held::limiter_held(ctx.ctx) == 1 { HELD } else { 0 };
    limiter_drop_event(ctx.ctx, head, tail, reason as u64 | evidence);
    let Some(last) = DROP_SAMPLER.get_ptr_mut(0) else { return };
    // SAFETY: per-CPU slot, only this CPU's softirq writes it.
    unsafe {
        if now.wrapping_sub(*last) >= gcra::to_fixed(gcra::NS_PER_S) {
            *last = now;
            debug!(
                ctx,
                "sampled drop: family {} /{} class {} reason {}",
                key.family.0,
                key.prefix_len,
                key.class,
                reason as u32
            );
        }
    }
}

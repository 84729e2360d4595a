//! What every packet leaves behind: one counter, of its class, reason and
//! family (per CPU, so no atomics in softirq), and for a 1-in-N random
//! sample of drops an event for the top-offenders list and escalation (with each
//! verified SYN cookie's address as proof of source); while a capture
//! runs, copies of drops, and of passes drawn at random.

use aya_ebpf::bindings::xdp_md;
use aya_ebpf::helpers::{bpf_ktime_get_ns, bpf_xdp_load_bytes};
use aya_ebpf::programs::XdpContext;
use aya_log_ebpf::debug;
use limiter_common::{
    BucketKey, Config, DropEvent, Family, Reason,
    capture::{CaptureHead, CaptureRecord, SNAP},
    family, gcra,
    packet::{Frame as _, word as w},
    stat_index,
};

use crate::packet::Packet;

use crate::maps::{ACTIVE, CAPTURE, CAPTURES, CONFIG, DROP_EVENTS, DROP_SAMPLER, STATS};

/// An address proved itself (a verified SYN cookie): told to userspace
/// unsampled, in the drop events' ring, for escalation's proof of source.
#[cfg_attr(feature = "without-syn-cookies", expect(dead_code, reason = "SYN cookies only"))]
#[inline(always)]
pub fn proven(ctx: &XdpContext, key: &BucketKey) {
    let (head, tail) = key.words();
    limiter_drop_event(ctx.ctx, head, tail, Reason::SynCookieVerified as u64 | PROOF, 0);
}

/// One event, written in place in the ring (reserve, fill, submit): built
/// on the stack and copied, its 32 bytes took the SYN-ACK path's call
/// chain past the verifier's 512-byte combined stack limit.
#[inline(always)]
fn event(key: &BucketKey, src: Option<&[u32; 4]>, reason: Reason, held: u32, dst: u32) {
    let Some(mut e) = DROP_EVENTS.reserve::<DropEvent>(0) else { return };
    let p = e.as_mut_ptr();
    // SAFETY: `p` is the reserved record, DropEvent-sized; each field is
    // written straight into it (no copy of the whole on the stack).
    unsafe {
        (&raw mut (*p).key).write(*key);
        (&raw mut (*p).reason).write(reason as u32);
        (&raw mut (*p).src).write(src.copied().unwrap_or_default());
        (&raw mut (*p).held).write(held);
        (&raw mut (*p).dst).write(dst);
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

/// What a drawn drop leaves: its event, when the sample drew it, with
/// the packet's source address read again from the packet (and, for a
/// rate-limited segment, whether this host holds its connection:
/// escalation's evidence), its debug line, and its copy, when a capture
/// is on and drew it. A global function, verified once whatever the
/// paths to it, so the main program pays one draw and one test for all
/// of it; the address is also not kept on the main program's stack to
/// the end of a packet's path (which took the combined stack of the call
/// chain through the SYN-ACK builder over the verifier's 512 bytes).
/// `draw` is the drop's random draw; `reason` the reason's index, or
/// [`PROOF`] with it, or [`PASSED`] with it (a passed frame while passes
/// are asked for: `draw` is then the seed of its draw, and a drawn one
/// is only copied).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn limiter_drop_event(ctx: *mut xdp_md, head: u64, tail: u64, reason: u64, draw: u64) -> u64 {
    drop_event::<true>(ctx, head, tail, reason, draw)
}

/// [`limiter_drop_event`] for the out-of-state check's packets (called
/// from its global function), which asks no socket: its segments are of
/// no rate-limited drop, and a third frame on that call chain passed the
/// verifier's 512 bytes.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn limiter_judged_event(ctx: *mut xdp_md, head: u64, tail: u64, reason: u64, draw: u64) -> u64 {
    drop_event::<false>(ctx, head, tail, reason, draw)
}

/// Both drop events' work; `HELD`: a rate-limited drop's event says
/// whether this host holds its connection.
#[inline(always)]
fn drop_event<const HELD: bool>(ctx: *mut xdp_md, head: u64, tail: u64, reason: u64, draw: u64) -> u64 {
    let xdp = XdpContext::new(ctx);
    let pkt = Packet(&xdp);
    let key = BucketKey::from_words(head, tail);
    let why = Reason::from_index(u32::try_from(reason & REASON).unwrap_or(u32::MAX)).unwrap_or(Reason::NoConfig);
    let proof = reason & PROOF != 0;
    if reason & PASSED != 0 {
        // `draw` is the pass's seed (see `sample_pass`).
        let one_in = passes();
        if drawn(mix(draw) | 1 << 63, one_in) {
            copy(ctx, &pkt, &key, why, one_in);
        }
        return 0;
    }
    if proof || drawn(draw, drop_sample()) {
        let src = source_of(&pkt, key.family == family::IPV6);
        let of_held_connection = u32::from(why == Reason::RateLimited && HELD && crate::held::limiter_held(ctx) == 1);
        let dst = limiter_drop_dst(ctx, u64::from(key.family == family::IPV6));
        #[expect(clippy::cast_possible_truncation, reason = "a DropEvent::dst, 32 bits")]
        event(&key, src.as_ref(), why, of_held_connection, dst as u32);
        if !proof {
            log_sampled(&xdp, &key, why);
        }
    }
    let one_in = CAPTURE.get(0).map_or(0, |c| c.one_in);
    if !proof && drawn(draw, one_in) {
        copy(ctx, &pkt, &key, why, one_in);
    }
    0
}

/// [`limiter_drop_event`]'s `reason`: the reason's index, and above it
/// [`PROOF`] or [`PASSED`].
const REASON: u64 = 0xffff_ffff;
/// An address proved itself: its event is sent unsampled, and the
/// (passed) packet is not a drop to copy.
const PROOF: u64 = 1 << 32;
/// A passed frame while a capture asks for passes: copied if drawn (one
/// in `LIMITER_PASSES`), no event.
const PASSED: u64 = 1 << 33;

/// Whether a draw from `seen` (a counter's packets on this CPU) and
/// `now`, as [`sample_drop`] draws, falls in the one in `one_in` (a
/// power of two).
#[inline(always)]
pub fn drawn_one_in(seen: u64, now: u64, one_in: u64) -> bool {
    mix(seen.wrapping_add(now)) & (one_in - 1) == 0
}

/// Whether `draw` falls in the one in `one_in` (a power of two; 0: none).
#[inline(always)]
fn drawn(draw: u64, one_in: u32) -> bool {
    one_in != 0 && draw & (u64::from(one_in) - 1) == 0
}

/// The policy's `drop_sample` (0 without a policy).
#[inline(always)]
fn drop_sample() -> u32 {
    let slot = ACTIVE.get(0).copied().unwrap_or(0) & limiter_common::deny::active::CONFIG_SLOT;
    CONFIG.get(slot).map_or(0, |c| c.drop_sample)
}

/// A sampled drop's debug line, at most once a second per CPU (off
/// unless the daemon runs with debug logging).
#[inline(always)]
fn log_sampled(ctx: &XdpContext, key: &BucketKey, reason: Reason) {
    let Some(last) = DROP_SAMPLER.get_ptr_mut(0) else { return };
    // SAFETY: per-CPU slot, only this CPU's softirq writes it.
    let now = unsafe { bpf_ktime_get_ns() };
    unsafe {
        if now.wrapping_sub(*last) >= gcra::NS_PER_S {
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

/// The frame, up to [`SNAP`] bytes, into `CAPTURES` (reserve, copy with
/// the kernel's helper, which reads fragments too, submit).
#[inline(always)]
fn copy(ctx: *mut xdp_md, pkt: &Packet, key: &BucketKey, reason: Reason, one_in: u32) {
    let len = pkt.len();
    if len == 0 {
        return;
    }
    // 1..=SNAP in a form the verifier of 6.1 follows: LLVM merges a
    // `caplen == 0 || caplen > SNAP` test into one compare of `caplen - 1`,
    // whose bounds the verifier does not carry back to `caplen`; hidden
    // from LLVM, the mask stays and bounds the length itself.
    let least = if len > SNAP as u64 { SNAP as u64 } else { len };
    let caplen = ((core::hint::black_box(least) - 1) & (SNAP as u64 - 1)) + 1;
    let Some(mut e) = CAPTURES.reserve::<CaptureRecord>(0) else { return };
    let p = e.as_mut_ptr();
    // SAFETY: `p` is the reserved record; `caplen` is 1..=SNAP, the size
    // of its `data`; the head's fields are written in place.
    unsafe {
        #[expect(clippy::cast_possible_truncation, reason = "caplen <= SNAP")]
        if bpf_xdp_load_bytes(ctx, 0, (&raw mut (*p).data).cast(), caplen as u32) != 0 {
            e.discard(0);
            return;
        }
        (&raw mut (*p).head).write(CaptureHead {
            t_ns: bpf_ktime_get_ns(),
            #[expect(clippy::cast_possible_truncation, reason = "a frame is far shorter than 4 GiB")]
            len: len as u32,
            #[expect(clippy::cast_possible_truncation, reason = "caplen <= SNAP")]
            caplen: caplen as u32,
            reason: reason as u32,
            class: u32::from(key.class),
            one_in,
            pad: 0,
        });
    }
    e.submit(0);
}

/// [`DropEvent::dst`] of the packet: its IP protocol, and the destination
/// port of TCP or UDP right behind the IP header (an IPv4 first fragment
/// or whole packet; IPv6 without extension headers). Read here, not by
/// the program's whole parser (that took the verifier 58,000 more
/// states), and as a global function of its own, verified once alone
/// rather than on each path of its caller.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn limiter_drop_dst(ctx: *mut xdp_md, v6: u64) -> u64 {
    let xdp = XdpContext::new(ctx);
    let pkt = Packet(&xdp);
    let v6 = v6 != 0;
    let Some(l3) = pkt.l3() else { return 0 };
    let (proto, l4) = if v6 {
        let Some(h) = pkt.bytes_at::<8>(l3) else { return 0 };
        (h[6], Some(l3 + 40))
    } else {
        let Some(h) = pkt.bytes_at::<20>(l3) else { return 0 };
        // The fragment offset's 13 bits (a count of trailing zeros is no
        // BPF instruction).
        #[expect(clippy::verbose_bit_mask, reason = "as said")]
        let first = u16::from_be_bytes([h[6], h[7]]) & 0x1fff == 0;
        (h[9], first.then_some(l3 + usize::from(h[0] & 0x0f) * 4))
    };
    let port = match (proto, l4) {
        (6 | 17, Some(off)) => pkt.bytes_at::<4>(off).map(|p| u16::from_be_bytes([p[2], p[3]])),
        _ => None,
    };
    let proto = u32::from(proto) << 16;
    u64::from(port.map_or(proto, |p| DropEvent::PORT_READ | proto | u32::from(p)))
}

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

/// Take back one packet of `len` bytes [`count`] counted under `reason`
/// on this CPU (the out-of-state check turning an admitted packet into a
/// drop after the entry point counted it).
#[inline(always)]
pub fn uncount(class: usize, reason: Reason, fam: Family, len: u64) {
    let Some(c) = STATS.get_ptr_mut(stat_index(class, reason, fam)) else { return };
    // SAFETY: per-CPU slot, only this CPU's softirq writes it.
    unsafe {
        (*c).packets = (*c).packets.wrapping_sub(1);
        (*c).bytes = (*c).bytes.wrapping_sub(len);
    }
}

/// One drop in `drop_sample` (a power of two), drawn at random for each
/// drop, goes to the ring buffer for the top-offenders list, escalation,
/// link pressure; while a capture is on, one in its own power of two is
/// copied. At random, not every Nth drop of a counter: two sources
/// interleaved packet by packet at the same rate aliased with a counter,
/// one always sampled and the other never; a random draw sees every
/// source in proportion to its drops, whatever their order. The draw is
/// `seen` (the drop's counter's packets on this CPU) plus the clock,
/// through [`mix`]: the kernel's random helper cost 1.10x the drop path,
/// this draw 1.00x (`cargo xtask bench hit`). Drop path only; the admit
/// path pays nothing, and a drop drawn by neither pays the draw, one read
/// of `CAPTURE` and one test: both masks are a power of two less one, so
/// their AND is the smaller, and a draw that passes it may be either's
/// (the global function tells which). The top bit of the draw is set so
/// that a mask of all ones (a sample of 0, a capture off) never passes.
#[inline(always)]
pub fn sample_drop<const HELD: bool>(
    ctx: &XdpContext,
    cfg: &Config,
    key: &BucketKey,
    reason: Reason,
    now: u64,
    seen: u64,
) {
    let draw = mix(seen.wrapping_add(now)) | 1 << 63;
    let events = u64::from(cfg.drop_sample).wrapping_sub(1);
    let copies = CAPTURE.get(0).map_or(u64::MAX, |c| u64::from(c.one_in).wrapping_sub(1));
    if draw & events & copies != 0 {
        return;
    }
    let (head, tail) = key.words();
    if HELD {
        limiter_drop_event(ctx.ctx, head, tail, reason as u64, draw);
    } else {
        limiter_judged_event(ctx.ctx, head, tail, reason as u64, draw);
    }
}

/// One passed frame in how many is copied (a power of two; 0: none):
/// the object's global (`.bss`, `maps::GLOBALS`), written by userspace
/// while a capture of passed frames or an attack wants them. Read
/// straight from memory: the admit path pays one load and one test while
/// nobody asks (a map lookup costs a call's worth of instructions more).
#[unsafe(no_mangle)]
static mut LIMITER_PASSES: u32 = 0;

/// `LIMITER_PASSES`, as it is now.
#[inline(always)]
pub fn passes() -> u32 {
    // SAFETY: an aligned u32 only userspace writes (one store): no torn
    // read; volatile, so it is read each time, never assumed zero.
    unsafe { core::ptr::read_volatile(&raw const LIMITER_PASSES) }
}

/// A passed frame (`reason` a pass, shadow's would-be drops aside), one
/// in `LIMITER_PASSES` drawn at random as [`sample_drop`] draws: while
/// any is asked for, the global function draws and copies (the draw
/// there, not on each of the main program's paths to here, which the
/// verifier of 6.1 walks one by one).
#[inline(always)]
pub fn sample_pass<const HELD: bool>(ctx: &XdpContext, key: &BucketKey, reason: Reason, now: u64, seen: u64) {
    if passes() == 0 {
        return;
    }
    let (head, tail) = key.words();
    if HELD {
        limiter_drop_event(ctx.ctx, head, tail, reason as u64 | PASSED, seen.wrapping_add(now));
    } else {
        limiter_judged_event(ctx.ctx, head, tail, reason as u64 | PASSED, seen.wrapping_add(now));
    }
}

//! Out-of-state TCP (`limiter_common::tcp_state`): the entry point asks
//! here, for a segment its class admitted, whether to judge it; the
//! judging is a global function of its own, called once the main
//! program's work is done, so that its frame and the lookup's tuple never
//! sit on the charge's call chain (which fills the verifier's 512 bytes
//! of combined stack). The entry point counts the segment as admitted;
//! the judge samples it, and moves its count if it drops it.

use aya_ebpf::{
    bindings::{BPF_TCP_LISTEN, xdp_md},
    programs::XdpContext,
};
use core::ptr::{read_volatile, write_volatile};
use limiter_common::{
    Config, Family, Reason, cost, family, flags, gcra, mode,
    packet::{Frame as _, tcp_flag, word as w},
    rules::key_of,
    tcp_state::{self, Held},
};

use crate::{
    atomic::refund,
    count::{count, drawn_one_in, passes, sample_drop, sample_pass, uncount},
    held::{kernel_cookie, segment, socket_then},
    maps::{ACTIVE, BUCKETS, CLOCK_CACHE, CONFIG, TCP_GUARD, TCP_HELD, TEST_CLOCK},
    packet::Packet,
};

/// [`ask`]'s answer, with the class in its low byte and the counter's
/// packets on this CPU (`seen`, for the draws) from [`SEEN_SHIFT`] up:
/// judge the segment in [`limiter_tcp_state`] (which samples it; the
/// entry point has counted it as admitted).
const JUDGE: u64 = 1 << 8;
/// The test clock's entry point: `now` is `TEST_CLOCK`.
const TEST: u64 = 1 << 9;
/// An `auto` check not engaged drew this segment: asked of the socket
/// tables for the trigger only, never dropped.
const PROBE: u64 = 1 << 10;
/// Not the judge's: the policy forwards some destination at the driver,
/// so the entry point asks `tunnel::forward` of a passed packet.
const TUNNELS: u64 = 1 << 11;
const SEEN_SHIFT: u32 = 16;
/// The class, masked to `MAX_CLASSES`: the bound the verifier of 6.1
/// needs to index the policy's classes with it (a compare of a wider
/// value it lost on the way to the load).
const CLASS: u64 = limiter_common::MAX_CLASSES as u64 - 1;
const _: () = assert!(limiter_common::MAX_CLASSES.is_power_of_two());

/// What the packet asks of [`limiter_tcp_state`] (0: nothing): one its
/// class admitted, of a class with the check on (an operator's `allow`, a
/// verified cookie, a refusal never are), judged if the check is
/// `always` or engaged, else probed one in [`tcp_state::PROBE_ONE_IN`]
/// (`seen`, the admitted counter, drawn at random). One test of the
/// policy's flags for every other class. Nothing of the packet is kept
/// for the judge: a value kept from the parse to this point would take
/// stack from the entry point's frame, which the charge's call chain
/// fills to the verifier's limit; the global function reads the segment
/// itself.
#[inline(always)]
pub fn ask(pkt: &Packet, cfg: &Config, class: usize, reason: Reason, now: u64, seen: u64) -> u64 {
    if cfg.flags >> (flags::TCP_STATE_SHIFT as usize + class) & 1 == 0 || reason != Reason::Admitted || !tcp(pkt) {
        return 0;
    }
    let class = class as u64 & CLASS;
    let what = if cfg.flags >> (flags::TCP_STATE_AUTO_SHIFT as usize + class as usize) & 1 == 0 || engaged(class, now) {
        JUDGE
    } else if drawn_one_in(seen, now, tcp_state::PROBE_ONE_IN) {
        PROBE
    } else {
        return 0;
    };
    what | class | seen << SEEN_SHIFT
}

/// [`TUNNELS`] if the policy forwards some destination.
#[inline(always)]
pub fn tunnels_on(cfg: &Config) -> u64 {
    if cfg.flags & flags::TUNNELS != 0 { TUNNELS } else { 0 }
}

/// Whether the entry point's answer asks for the tunnel (see
/// [`tunnels_on`]).
#[inline(always)]
pub fn tunnels(counted: &Result<(Reason, u64), Reason>) -> bool {
    matches!(counted, Ok((_, ask)) if ask & TUNNELS != 0)
}

/// Whether [`ask`]'s answer hands the segment to the judge, which
/// samples it (the entry point does not).
#[inline(always)]
pub fn judged(ask: u64) -> bool {
    ask & JUDGE != 0
}

/// Whether the packet may be TCP (its IP header's protocol, read again:
/// the parse's is not kept this long; an IPv6 packet with extension
/// headers may be, which the judge's own walk of them settles).
#[inline(always)]
fn tcp(pkt: &Packet) -> bool {
    let Some(l3) = pkt.l3() else { return false };
    let Some(h) = pkt.bytes_at::<10>(l3) else { return false };
    if h[0] >> 4 == 6 {
        return h[6] == limiter_common::packet::IPPROTO_TCP || limiter_common::packet::is_ext(h[6]);
    }
    h[9] == limiter_common::packet::IPPROTO_TCP
}

/// The packet's reason once [`limiter_tcp_state`] has had it (`counted`
/// as the entry point left it, with its [`ask`]; `test`: the test clock's
/// entry point).
#[inline(always)]
pub fn settle(pkt: &Packet, counted: Result<(Reason, u64), Reason>, test: bool) -> Result<Reason, Reason> {
    let (reason, ask) = counted?;
    if ask & (JUDGE | PROBE) == 0 {
        return Ok(reason);
    }
    let r = limiter_tcp_state(pkt.0.ctx, ask | if test { TEST } else { 0 });
    Ok(if r == Reason::TcpOutOfState as u64 {
        Reason::TcpOutOfState
    } else if r == Reason::ShadowDropped as u64 {
        Reason::ShadowDropped
    } else {
        Reason::Admitted
    })
}

/// Whether `class`'s `auto` check is engaged at `now`.
#[inline(always)]
fn engaged(class: u64, now: u64) -> bool {
    #[expect(clippy::cast_possible_truncation, reason = "class < MAX_CLASSES")]
    let Some(g) = TCP_GUARD.get_ptr(class as u32) else { return false };
    // SAFETY: a live map value; an aligned 8-byte load.
    now < unsafe { read_volatile(&raw const (*g).until) }
}

/// Count `n` out-of-state segments in the class's period, and hold the
/// check engaged while a period's count passes the threshold.
#[inline(always)]
fn trip(class: u64, now: u64, n: u64) {
    #[expect(clippy::cast_possible_truncation, reason = "class < MAX_CLASSES")]
    let Some(g) = TCP_GUARD.get_ptr_mut(class as u32) else { return };
    // SAFETY: a live map value. Plain loads and stores: a racing CPU may
    // lose an increment, which only delays the trigger.
    unsafe {
        let period = now >> tcp_state::PERIOD_SHIFT;
        let c = if read_volatile(&raw const (*g).period) == period {
            read_volatile(&raw const (*g).count) + n
        } else {
            write_volatile(&raw mut (*g).period, period);
            n
        };
        write_volatile(&raw mut (*g).count, c);
        if c > tcp_state::PER_PERIOD {
            write_volatile(&raw mut (*g).until, now + tcp_state::HOLD);
        }
    }
}

/// [`limiter_tcp_look`]'s answers. Not a segment to judge (not TCP, a
/// plain SYN, a later fragment), or no listener takes its port: not this
/// host's to judge.
const NOBODY: u64 = 0;
/// A connection holds it (or its cookie is valid).
const HELD: u64 = 1;
/// A listener takes its port and nothing holds the segment.
const OUT_OF_STATE: u64 = 2;
/// As [`OUT_OF_STATE`], but with ACK (and without SYN or RST): out of
/// state unless it carries a valid SYN cookie ([`limiter_tcp_cookie`]).
const LISTENER_ACK: u64 = 3;
/// [`LISTENER_ACK`] carries where the segment's TCP header starts from
/// this bit up, for [`limiter_tcp_cookie`]; the answer is below it.
const L4_SHIFT: u32 = 8;
const ANSWER: u64 = (1 << L4_SHIFT) - 1;

/// An admitted packet the entry point counted and [`ask`] handed here:
/// judged if it is a TCP segment other than a plain SYN, or (a probe of
/// an `auto` check not engaged) asked of the socket tables for the
/// trigger only. A dropped segment's count moves from admitted to its
/// reason, and it is sampled; a judged one that passes is sampled as a
/// pass. Returns its reason's index. A global function, verified once on
/// its own.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn limiter_tcp_state(ctx: *mut xdp_md, ask: u64) -> u64 {
    let xdp = XdpContext::new(ctx);
    let pkt = Packet(&xdp);
    let class = ask & CLASS;
    let seen = ask >> SEEN_SHIFT;
    let now = if ask & TEST != 0 {
        gcra::to_fixed(TEST_CLOCK.get(0).copied().unwrap_or(0))
    } else {
        gcra::to_fixed(CLOCK_CACHE.get(0).map_or(0, |c| c.ns))
    };
    let found = settled(ctx, limiter_tcp_look(ctx, now));
    if ask & PROBE != 0 {
        if found == OUT_OF_STATE {
            trip(class, now, tcp_state::PROBE_ONE_IN);
        }
        return Reason::Admitted as u64;
    }
    // The source and the config are read again only for what a pass
    // sample or a drop needs: a held connection's segment pays the
    // lookups above and a test.
    let key = |cfg: &Config| {
        let (fam, addr) = source(&pkt);
        key_of(fam, addr, cfg.v4_prefix, cfg.v6_prefix, class as u8)
    };
    if found != OUT_OF_STATE {
        if passes() != 0
            && let Some(cfg) = config()
        {
            sample_pass::<false>(&xdp, &key(cfg), Reason::Admitted, now, seen);
        }
        return Reason::Admitted as u64;
    }
    trip(class, now, 1);
    let Some(cfg) = config() else { return Reason::Admitted as u64 };
    let Some(limits) = cfg.classes.get(class as usize) else { return Reason::Admitted as u64 };
    let key = key(cfg);
    let reason = if limits.mode == mode::SHADOW {
        Reason::ShadowDropped
    } else {
        // Given back: a flood sent from a real user's prefix does not
        // spend that user's allowance (window quotas keep theirs).
        if !limits.is_window()
            && let Some(p) = BUCKETS.get_ptr_mut(key)
        {
            let units = if limits.cost == cost::BYTES { pkt.len() } else { 1 };
            refund(p, units * limits.unit);
        }
        Reason::TcpOutOfState
    };
    uncount(class as usize, Reason::Admitted, key.family, pkt.len());
    let seen = count(class as usize, reason, key.family, pkt.len());
    sample_drop::<false>(&xdp, cfg, &key, reason, now, seen);
    reason as u64
}

/// The policy in force.
#[inline(always)]
fn config() -> Option<&'static Config> {
    let active = ACTIVE.get(0).copied().unwrap_or(0);
    CONFIG.get(active & limiter_common::deny::active::CONFIG_SLOT)
}

/// The packet's family and source address, for its key and counter.
#[inline(always)]
fn source(pkt: &Packet) -> (Family, [u32; 4]) {
    let Some(l3) = pkt.l3() else { return (family::IPV4, [0; 4]) };
    if let Some(h) = pkt.bytes_at::<24>(l3)
        && h[0] >> 4 == 6
    {
        return (family::IPV6, [w(h, 8), w(h, 12), w(h, 16), w(h, 20)]);
    }
    let a = pkt.bytes_at::<16>(l3).map_or(0, |h| w(h, 12));
    (family::IPV4, [a, 0, 0, 0])
}

/// What the cache of held connections, then the kernel's socket tables,
/// say of the segment's 4-tuple ([`NOBODY`], [`HELD`], [`OUT_OF_STATE`]).
/// IPv4 with options; IPv6 whose next header is TCP (one behind
/// extension headers is not judged). A global function: the tuple and the
/// lookup's argument live in its own frame.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn limiter_tcp_look(ctx: *mut xdp_md, now: u64) -> u64 {
    let xdp = XdpContext::new(ctx);
    let Some(mut s) = segment(&Packet(&xdp)) else { return NOBODY };
    // A plain SYN opens a connection: the charge and SYN cookies see to it.
    if s.flags & (tcp_flag::SYN | tcp_flag::ACK) == tcp_flag::SYN {
        return NOBODY;
    }
    let fam = u32::from(if s.v6 { family::IPV6.0 } else { family::IPV4.0 });
    let cached = TCP_HELD.get_ptr_mut(tcp_state::slot(&s.tuple));
    if let Some(e) = cached {
        // SAFETY: this CPU's entry, only its softirq touches it.
        let e = unsafe { &*e };
        // Word by word, folded: an array's `==` is a call of a byte-wise
        // `memcmp` subprogram in BPF.
        let mut differ = e.family ^ fam;
        for i in 0..tcp_state::TUPLE_WORDS {
            differ |= e.tuple[i] ^ s.tuple[i];
        }
        if differ == 0 && e.until > now {
            return HELD;
        }
    }
    // The kernel takes a cookie from any segment with ACK and without
    // SYN or RST (a lost third segment's data carries it too).
    let ack = s.flags & (tcp_flag::SYN | tcp_flag::RST | tcp_flag::ACK) == tcp_flag::ACK;
    let pkt = Packet(&xdp);
    let l4 = usize::from(s.l4);
    let Some((state, cookie)) = socket_then(ctx, &mut s, |sk| ack && kernel_cookie(&pkt, sk, l4)) else {
        return NOBODY;
    };
    if state != BPF_TCP_LISTEN {
        if let Some(e) = cached {
            // SAFETY: as above.
            unsafe { *e = Held { tuple: s.tuple, family: fam, until: now + tcp_state::REMEMBER } };
        }
        return HELD;
    }
    if cookie {
        return HELD;
    }
    // This program's own cookies (which no listener records) are asked
    // of the cookie helper only while the policy sends them.
    let ours = config().is_some_and(|c| c.flags & flags::SYN_COOKIES != 0);
    if ack && ours { LISTENER_ACK | (l4 as u64) << L4_SHIFT } else { OUT_OF_STATE }
}

/// [`limiter_tcp_look`]'s answer with a bare ACK's cookie checked.
#[inline(always)]
fn settled(ctx: *mut xdp_md, found: u64) -> u64 {
    match found & ANSWER {
        LISTENER_ACK if limiter_tcp_cookie(ctx, found >> L4_SHIFT) == 1 => HELD,
        LISTENER_ACK => OUT_OF_STATE,
        f => f,
    }
}

/// 1 when the bare ACK carries a SYN cookie the kernel's helper accepts
/// (one this program's SYN-ACK or the kernel's own sent): the third
/// segment of a connection no socket holds yet. A global function: the
/// headers' copies the helper reads live in its own frame.
#[cfg(not(feature = "without-syn-cookies"))]
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn limiter_tcp_cookie(ctx: *mut xdp_md, l4: u64) -> u64 {
    use aya_ebpf::helpers::{bpf_tcp_raw_check_syncookie_ipv4, bpf_tcp_raw_check_syncookie_ipv6};
    let xdp = XdpContext::new(ctx);
    let pkt = Packet(&xdp);
    let Some(l3) = pkt.l3() else { return 0 };
    let Some(v) = pkt.bytes_at::<1>(l3) else { return 0 };
    // Where `segment` found the TCP header (past IPv4 options or IPv6
    // extension headers), bounded for the verifier: the walk stops at
    // 4,096 bytes.
    let Some(th) = pkt.bytes_at::<20>((l4 & 0x1fff) as usize) else { return 0 };
    let mut th = *th;
    // The IP header is asked for more than the helper reads, as in
    // `held::kernel_cookie`.
    // SAFETY: stack copies of fixed size, as long as the helper reads.
    let ok = if v[0] >> 4 == 6 {
        let Some(ip) = pkt.bytes_at::<60>(l3) else { return 0 };
        let mut ip = ip.first_chunk::<40>().copied().unwrap_or([0; 40]);
        unsafe { bpf_tcp_raw_check_syncookie_ipv6(ip.as_mut_ptr().cast(), th.as_mut_ptr().cast()) == 0 }
    } else {
        let Some(ip) = pkt.bytes_at::<40>(l3) else { return 0 };
        let mut ip = ip.first_chunk::<20>().copied().unwrap_or([0; 20]);
        unsafe { bpf_tcp_raw_check_syncookie_ipv4(ip.as_mut_ptr().cast(), th.as_mut_ptr().cast()) == 0 }
    };
    u64::from(ok)
}

/// Without the cookie helpers a bare ACK to a listener cannot be told
/// from a cookie's: it is passed, as the kernel may take it.
#[cfg(feature = "without-syn-cookies")]
#[inline(always)]
fn limiter_tcp_cookie(_: *mut xdp_md, _: u64) -> u64 {
    1
}

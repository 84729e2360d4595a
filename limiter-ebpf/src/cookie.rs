//! SYN cookies in XDP (`limiter_common::cookie`): a SYN from a prefix
//! without a bucket is answered here with a cookie SYN-ACK (`XDP_TX`),
//! storing nothing; the ACK that comes back is checked with the kernel's
//! cookie helper, and only then does its prefix get a bucket.

use core::ptr::{read_volatile, write_volatile};

use aya_ebpf::{
    bindings::{iphdr, ipv6hdr, tcphdr, xdp_md},
    helpers::{
        bpf_ktime_get_ns, bpf_tcp_raw_check_syncookie_ipv4, bpf_tcp_raw_check_syncookie_ipv6,
        bpf_tcp_raw_gen_syncookie_ipv4, bpf_tcp_raw_gen_syncookie_ipv6, bpf_xdp_adjust_tail,
    },
    programs::XdpContext,
};
use limiter_common::{
    BucketState, Config, Reason,
    cookie::{self, mode},
    family, gcra,
    packet::{Frame, IPPROTO_TCP, Source, tcp_flag},
    resolution,
    rules::bucket_key,
};

mod options;

use self::options::{ClientOptions, NO_WSCALE, limiter_syn_options};
use crate::{
    charge::Charge,
    count::proven,
    maps::{BPF_NOEXIST, BUCKETS, KERNEL_SYNS, SYN_GUARD},
    packet::Packet,
    resolve::resolved,
};

/// TCP option kind and length of MSS.
const TCPOPT_MSS: [u8; 2] = [2, 4];
/// Hop limit / TTL of the SYN-ACK.
const TTL: u8 = 64;

/// What the cookie path makes of a TCP packet before it is charged;
/// `None` lets it be charged as any other packet.
#[inline(always)]
pub fn intercept(s: &Charge) -> Option<Reason> {
    let f = s.src.tcp_flags & (tcp_flag::SYN | tcp_flag::ACK | tcp_flag::RST | tcp_flag::FIN);
    if f == tcp_flag::SYN {
        let m = *s.cfg.cookies.mode.get(s.class)?;
        // A prefix that holds a bucket is charged as today.
        if m == mode::OFF || BUCKETS.get_ptr(s.key).is_some() {
            return None;
        }
        if !engaged(s.cfg, s.class, m, s.now, true) || resolved(s.key, s.slot) != resolution::CLASS {
            return None;
        }
        return answer(s);
    }
    // Any other segment: the class its connection's SYN was in (an ACK
    // itself is in another class when the SYN's class matches `syn = true`
    // only). While that class's cookies are engaged, a prefix without a
    // bucket gets one only through a verified cookie: a RST, a FIN, a
    // SYN-ACK or a segment without flags from it is refused, so spoofed
    // segments can neither make buckets nor spend the new-source budget.
    let syn_class = s.cfg.cookies.class_of(s.src.dport)?;
    let m = *s.cfg.cookies.mode.get(syn_class)?;
    if m == mode::OFF || !engaged(s.cfg, syn_class, m, s.now, false) {
        return None;
    }
    #[expect(clippy::cast_possible_truncation, reason = "class < MAX_CLASSES")]
    let skey = bucket_key(s.src, s.cfg.v4_prefix, s.cfg.v6_prefix, syn_class as u8);
    if BUCKETS.get_ptr(skey).is_some() {
        return None;
    }
    if f != tcp_flag::ACK {
        return Some(Reason::SynCookieInvalid);
    }
    if !valid(s.pkt, s.src)? {
        return Some(Reason::SynCookieInvalid);
    }
    // Proven: a bucket with its whole allowance, new-source budget or not.
    let resolved = (u64::from(s.version) << 32) | u64::from(resolved(&skey, s.slot));
    let _ = BUCKETS.insert(skey, BucketState { tat: gcra::fresh_tat(s.now), resolved }, BPF_NOEXIST);
    // The address proved itself: escalation may count its drops.
    proven(s.pkt.0, &skey);
    Some(Reason::SynCookieVerified)
}

/// A SYN of an `auto` (or `always`) class was refused by the new-source
/// budget: trip `auto`, and answer this SYN with a cookie instead.
#[inline(always)]
pub fn on_budget_refusal(s: &Charge) -> Option<Reason> {
    if s.src.tcp_flags & (tcp_flag::SYN | tcp_flag::ACK | tcp_flag::RST | tcp_flag::FIN) != tcp_flag::SYN {
        return None;
    }
    let m = *s.cfg.cookies.mode.get(s.class)?;
    if m == mode::OFF {
        return None;
    }
    #[expect(clippy::cast_possible_truncation, reason = "class < MAX_CLASSES")]
    if let Some(g) = SYN_GUARD.get_ptr_mut(s.class as u32) {
        // SAFETY: a live map value; racing CPUs store about the same time.
        unsafe { write_volatile(&raw mut (*g).until, s.now + cookie::HOLD) };
    }
    answer(s)
}

/// Whether the class's cookies are on at `now`. With `count`, this SYN
/// from a prefix without a bucket is counted first, and trips `auto` when
/// the period's count passes the class's threshold.
#[inline(always)]
#[expect(clippy::cast_possible_truncation, reason = "class < MAX_CLASSES")]
fn engaged(cfg: &Config, class: usize, m: u8, now: u64, count: bool) -> bool {
    if m == mode::ALWAYS {
        return true;
    }
    let Some(g) = SYN_GUARD.get_ptr_mut(class as u32) else { return false };
    // SAFETY: a live map value. Plain loads and stores: a racing CPU may
    // lose an increment, which only delays the trigger by a packet.
    unsafe {
        if count {
            let period = now / cookie::PERIOD;
            let n = if read_volatile(&raw const (*g).period) == period {
                read_volatile(&raw const (*g).count) + 1
            } else {
                write_volatile(&raw mut (*g).period, period);
                1
            };
            write_volatile(&raw mut (*g).count, n);
            let limit = cfg.cookies.per_period.get(class).copied().unwrap_or(u32::MAX);
            if n > u64::from(limit) {
                write_volatile(&raw mut (*g).until, now + cookie::HOLD);
            }
        }
        now < read_volatile(&raw const (*g).until)
    }
}

/// Answer the SYN: once a second per port and family it goes to the
/// kernel (which keeps the listener accepting cookies, see
/// [`cookie::REFRESH`]); otherwise a cookie SYN-ACK from here. IPv4 with
/// options and IPv6 with extension headers are charged as today.
#[inline(always)]
fn answer(s: &Charge) -> Option<Reason> {
    let v6 = s.src.family == family::IPV6;
    let l3 = plain_l3(s.pkt, v6)?;
    let idx = u32::from(s.src.dport) + if v6 { 65_536 } else { 0 };
    if let Some(p) = KERNEL_SYNS.get_ptr_mut(idx) {
        // SAFETY: a live map value; racing CPUs may both hand one over.
        unsafe {
            if s.now >= read_volatile(p).saturating_add(cookie::REFRESH) {
                write_volatile(p, s.now);
                return Some(Reason::SynCookieToKernel);
            }
        }
    }
    let mss = if v6 { s.cfg.cookies.mss6 } else { s.cfg.cookies.mss4 };
    let offer = u32::from(mss) | u32::from(s.cfg.cookies.opts) << 16 | u32::from(s.cfg.cookies.wscale) << 24;
    let r = if v6 {
        limiter_synack_v6(s.pkt.0.ctx, l3 as u64, u64::from(offer))
    } else {
        limiter_synack_v4(s.pkt.0.ctx, l3 as u64, u64::from(offer))
    };
    (r == u64::from(SENT)).then_some(Reason::SynCookieSent)
}

/// [`synack`] built and sent the SYN-ACK (anything else: it did not, and
/// the packet is as it was).
const SENT: u32 = 1;

/// Where the IP header starts if the packet is plain: 0 to 2 VLAN tags,
/// then IPv4 without options or fragmentation, or IPv6 whose next header
/// is TCP. Worked out again here rather than carried from the parser, so
/// that the verifier does not follow every layout's offsets through the
/// rest of the program.
#[inline(always)]
fn plain_l3(pkt: &Packet, v6: bool) -> Option<usize> {
    let tag = |et: [u8; 2]| et == [0x81, 0x00] || et == [0x88, 0xa8];
    let mut l3 = 14;
    let mut et = *pkt.bytes_at::<2>(12)?;
    if tag(et) {
        l3 = 18;
        et = *pkt.bytes_at::<2>(16)?;
        if tag(et) {
            l3 = 22;
            et = *pkt.bytes_at::<2>(20)?;
        }
    }
    if v6 {
        let ip = pkt.bytes_at::<8>(l3)?;
        (et == [0x86, 0xdd] && ip[6] == IPPROTO_TCP).then_some(l3)
    } else {
        let ip = pkt.bytes_at::<10>(l3)?;
        // Version 4, IHL 5; neither MF nor a fragment offset.
        (et == [0x08, 0x00] && ip[0] == 0x45 && ip[6].trailing_zeros() >= 6 && ip[7] == 0 && ip[9] == IPPROTO_TCP)
            .then_some(l3)
    }
}

/// Turn the SYN whose IP header (of `IPLEN` bytes, no options or
/// extension headers) is at `l3` into its cookie SYN-ACK, in place. Run
/// inside [`limiter_synack_v4`] or [`limiter_synack_v6`]: it takes the raw
/// context and fetches every pointer itself. Returns [`SENT`] or 0.
///
/// `offer`: the MSS to advertise | [`cookie::opt`] bits << 16 | our window
/// scale << 24.
#[inline(always)]
#[expect(clippy::cast_possible_truncation, reason = "l3 <= 22, offer is 32 bits")]
fn synack<const IPLEN: usize>(ctx: *mut xdp_md, l3: u64, offer: u64) -> u64 {
    let xdp = XdpContext::new(ctx);
    let pkt = &Packet(&xdp);
    if l3 > 22 {
        return 0;
    }
    build::<IPLEN>(pkt, l3 as usize, offer as u32).map_or(0, |()| u64::from(SENT))
}

/// [`synack`] for IPv4, as a global function: the verifier checks it once,
/// on its own, not once per state of every path that reaches it (the walk
/// of the SYN's options and the SYN-ACK's layouts multiply them).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn limiter_synack_v4(ctx: *mut xdp_md, l3: u64, offer: u64) -> u64 {
    synack::<20>(ctx, l3, offer)
}

/// [`synack`] for IPv6 (see [`limiter_synack_v4`]).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn limiter_synack_v6(ctx: *mut xdp_md, l3: u64, offer: u64) -> u64 {
    synack::<40>(ctx, l3, offer)
}

/// Built in place, with the few bytes it needs kept in registers: the
/// whole of it runs in [`synack`]'s small stack frame. Beside the MSS, when
/// the host allows it (`offer`) and the client sent a timestamp: SACK
/// permitted and timestamps (12 bytes), window scale (4), as the kernel
/// lays them out; the timestamp carries the client's window scale and
/// SACK for the kernel to read back from the ACK's echo.
#[inline(always)]
#[expect(clippy::cast_possible_truncation, clippy::cast_possible_wrap, reason = "lengths of a few hundred bytes")]
fn build<const IPLEN: usize>(pkt: &Packet, l3: usize, offer: u32) -> Option<()> {
    // The IP header checked first and handed to the cookie helper as it
    // is: checked after the TCP header, the compiler would drop the check
    // as implied, which the verifier cannot follow (l3 is not a constant).
    let ip = pkt.bytes_at::<IPLEN>(l3)?;
    let l4 = l3 + IPLEN;
    let th = pkt.bytes_at::<20>(l4)?;
    let (ports, seq) = (word(th, 0), u32::from_be_bytes([th[4], th[5], th[6], th[7]]));
    let client = ClientOptions::unpack(limiter_syn_options(pkt.0.ctx, l4 as u64));
    let (cookie, cookie_mss) = gen_cookie::<IPLEN>(ip, th, client.mss)?;
    let opts = (offer >> 16) as u8;
    let ts = client.tsval.filter(|_| opts & cookie::opt::TIMESTAMPS != 0);
    let sack = ts.is_some() && client.sack && opts & cookie::opt::SACK != 0;
    let wscale = ts.is_some() && client.wscale != NO_WSCALE && opts & cookie::opt::WSCALE != 0;
    let ts_len = if ts.is_some() { 12 } else { 0 };
    let tcp_len = 24 + ts_len + if wscale { 4 } else { 0 };
    let want = (l4 + tcp_len) as i32;
    let have = pkt.len() as i32;
    // SAFETY: the helper re-validates the context; every pointer into the
    // packet is fetched again below. The headers before the tail are kept.
    if want != have && unsafe { bpf_xdp_adjust_tail(pkt.0.ctx, want - have) } != 0 {
        return None;
    }
    // Ethernet: back to where it came from.
    let eth = *pkt.bytes_at::<12>(0)?;
    pkt.put(0, &[eth[6], eth[7], eth[8], eth[9], eth[10], eth[11], eth[0], eth[1], eth[2], eth[3], eth[4], eth[5]])?;
    reply_ip::<IPLEN>(pkt, l3, tcp_len as u16)?;
    // TCP: ports swapped, the cookie as our sequence number.
    let port = ports.to_ne_bytes();
    let ack = seq.wrapping_add(1).to_be_bytes();
    let ours = cookie.to_be_bytes();
    let win = cookie::synack_window(cookie_mss).to_be_bytes();
    let adv = (offer as u16).to_be_bytes();
    #[rustfmt::skip]
    pkt.put(l4, &[
        port[2], port[3], port[0], port[1],
        ours[0], ours[1], ours[2], ours[3],
        ack[0], ack[1], ack[2], ack[3],
        ((tcp_len / 4) as u8) << 4, tcp_flag::SYN | tcp_flag::ACK, win[0], win[1],
        0, 0, 0, 0,
        TCPOPT_MSS[0], TCPOPT_MSS[1], adv[0], adv[1],
    ])?;
    let mut sum = cookie::sum16(pkt.bytes_at::<24>(l4)?, 0);
    if let Some(echo) = ts {
        // SAFETY: a helper without arguments.
        let now = unsafe { bpf_ktime_get_ns() };
        let client_ws = if wscale { Some(client.wscale) } else { None };
        let tsval = cookie::timestamp(now, client_ws, sack).to_be_bytes();
        let echo = echo.to_be_bytes();
        let head = if sack { [4, 2] } else { [1, 1] };
        #[rustfmt::skip]
        pkt.put(l4 + 24, &[
            head[0], head[1], 8, 10,
            tsval[0], tsval[1], tsval[2], tsval[3],
            echo[0], echo[1], echo[2], echo[3],
        ])?;
        sum = cookie::sum16(pkt.bytes_at::<12>(l4 + 24)?, sum);
    }
    if wscale {
        pkt.put(l4 + 24 + ts_len, &[1, 3, 3, (offer >> 24) as u8])?;
        sum = cookie::sum16(pkt.bytes_at::<4>(l4 + 24 + ts_len)?, sum);
    }
    // Pseudo-header (the reply's addresses, TCP, its length), then the header.
    let addrs = if IPLEN == 40 {
        cookie::sum16(pkt.bytes_at::<32>(l3 + 8)?, 0)
    } else {
        cookie::sum16(pkt.bytes_at::<8>(l3 + 12)?, 0)
    };
    pkt.put(l4 + 16, &cookie::fold(sum + addrs + 6 + tcp_len as u32).to_be_bytes())
}

/// The kernel's SYN cookie for the SYN whose IP and TCP headers are `ip` and `th`, and the MSS it
/// encodes. The helper reads the MSS option from the header it is given:
/// it gets the SYN's fixed header and that one option, so the verifier
/// sees a fixed-size buffer whatever else the SYN carried.
#[inline(always)]
#[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "the helper's u64: cookie | mss << 32")]
fn gen_cookie<const IPLEN: usize>(ip: &[u8; IPLEN], th: &[u8; 20], client_mss: u16) -> Option<(u32, u16)> {
    let flags = th[12];
    if flags >> 4 < 5 {
        return None;
    }
    let mut syn = [0u8; 24];
    syn[..20].copy_from_slice(th);
    let mut th_len = 20;
    syn[12] = (5 << 4) | (flags & 0x0f);
    if client_mss != 0 {
        syn[12] = (6 << 4) | (flags & 0x0f);
        syn[20..22].copy_from_slice(&TCPOPT_MSS);
        syn[22..24].copy_from_slice(&client_mss.to_be_bytes());
        th_len = 24;
    }
    // SAFETY: `ip` is IPLEN bytes inside the packet (an iphdr or ipv6hdr
    // for the helper to read), `syn` th_len initialized bytes on the stack.
    let got = unsafe {
        if IPLEN == 40 {
            bpf_tcp_raw_gen_syncookie_ipv6(
                ip.as_ptr().cast_mut().cast::<ipv6hdr>(),
                syn.as_mut_ptr().cast::<tcphdr>(),
                th_len,
            )
        } else {
            bpf_tcp_raw_gen_syncookie_ipv4(
                ip.as_ptr().cast_mut().cast::<iphdr>(),
                syn.as_mut_ptr().cast::<tcphdr>(),
                th_len,
            )
        }
    };
    (got >= 0).then_some((got as u32, (got >> 32) as u16))
}

/// The reply's IP header, in place: addresses swapped word by word, the
/// rest of a fresh header.
#[inline(always)]
fn reply_ip<const IPLEN: usize>(pkt: &Packet, l3: usize, tcp_len: u16) -> Option<()> {
    let (src, words) = if IPLEN == 40 { (l3 + 8, 4) } else { (l3 + 12, 1) };
    for i in 0..4 {
        if i < words {
            let theirs = *pkt.bytes_at::<4>(src + 4 * i)?;
            let ours = *pkt.bytes_at::<4>(src + 4 * (i + words))?;
            pkt.put(src + 4 * i, &ours)?;
            pkt.put(src + 4 * (i + words), &theirs)?;
        }
    }
    if IPLEN == 40 {
        let len = tcp_len.to_be_bytes();
        pkt.put(l3, &[0x60, 0, 0, 0, len[0], len[1], 6, TTL])
    } else {
        let len = (20 + tcp_len).to_be_bytes();
        pkt.put(l3, &[0x45, 0, len[0], len[1], 0, 0, 0x40, 0, TTL, 6, 0, 0])?;
        let sum = cookie::fold(cookie::sum16(pkt.bytes_at::<20>(l3)?, 0));
        pkt.put(l3 + 10, &sum.to_be_bytes())
    }
}

#[inline(always)]
fn word(b: &[u8; 20], i: usize) -> u32 {
    u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// Whether the ACK carries a cookie the kernel issued for its addresses
/// and ports (checked by the kernel's helper, on copies of the headers).
#[inline(always)]
/// `None` for a packet that is not plain (see [`plain_l3`]): such an ACK
/// is charged as any packet, as a SYN of that shape would have been.
fn valid(pkt: &Packet, src: &Source) -> Option<bool> {
    let v6 = src.family == family::IPV6;
    let l3 = plain_l3(pkt, v6)?;
    let l4 = l3 + if v6 { 40 } else { 20 };
    let mut th = *pkt.bytes_at::<20>(l4)?;
    // SAFETY: stack copies of fixed size, as long as the helper reads.
    Some(if v6 {
        let mut ip = *pkt.bytes_at::<40>(l3)?;
        unsafe { bpf_tcp_raw_check_syncookie_ipv6(ip.as_mut_ptr().cast(), th.as_mut_ptr().cast()) == 0 }
    } else {
        let mut ip = *pkt.bytes_at::<20>(l3)?;
        unsafe { bpf_tcp_raw_check_syncookie_ipv4(ip.as_mut_ptr().cast(), th.as_mut_ptr().cast()) == 0 }
    })
}

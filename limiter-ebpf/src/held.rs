//! Whether a TCP segment belongs to a connection this host holds (one
//! established, in SYN-RECV as a request, or in TIME_WAIT): the kernel's
//! socket tables, asked with `bpf_skc_lookup_tcp` on the segment's
//! 4-tuple, read at fixed offsets. For the out-of-state check
//! (`state`), and for a sampled rate-limited drop: such drops are
//! evidence a blind spoofer cannot forge without the connection's ports,
//! which escalation needs before it announces an address upstream.

use aya_ebpf::{
    bindings::{
        BPF_F_CURRENT_NETNS, BPF_TCP_LISTEN, bpf_sock, bpf_sock_tuple__bindgen_ty_1__bindgen_ty_1 as V4,
        bpf_sock_tuple__bindgen_ty_1__bindgen_ty_2 as V6, xdp_md,
    },
    helpers::{bpf_sk_release, bpf_skc_lookup_tcp, bpf_tcp_check_syncookie},
    programs::XdpContext,
};
use limiter_common::packet::{Frame as _, IPPROTO_TCP, tcp_flag, word as w};

use crate::packet::Packet;

/// A TCP segment's 4-tuple as it carries it (the source is the peer),
/// laid out as `bpf_sock_tuple` (IPv4: source, destination, ports;
/// IPv6: the same, 36 bytes), and its flags byte.
pub struct Segment {
    pub tuple: [u32; TUPLE_WORDS],
    pub v6: bool,
    pub flags: u8,
}

pub use limiter_common::tcp_state::TUPLE_WORDS;

/// The packet's TCP segment: IPv4 (with options, a whole packet or a
/// first fragment) or IPv6 whose next header is TCP, behind up to two
/// VLAN tags; `None` for anything else.
#[inline(always)]
pub fn segment(pkt: &Packet) -> Option<Segment> {
    let l3 = pkt.l3()?;
    let v6 = pkt.bytes_at::<1>(l3)?[0] >> 4 == 6;
    let mut s = Segment { tuple: [0; TUPLE_WORDS], v6, flags: 0 };
    let (l4, at) = if v6 {
        let h = pkt.bytes_at::<40>(l3)?;
        if h[6] != IPPROTO_TCP {
            return None;
        }
        for i in 0..8 {
            s.tuple[i] = w(h, 8 + 4 * i);
        }
        (l3 + 40, 8)
    } else {
        let h = pkt.bytes_at::<20>(l3)?;
        // A later fragment carries no TCP header.
        if h[9] != IPPROTO_TCP || u16::from_be_bytes([h[6], h[7]]) & 0x1fff != 0 {
            return None;
        }
        s.tuple[0] = w(h, 12);
        s.tuple[1] = w(h, 16);
        (l3 + usize::from(h[0] & 0x0f) * 4, 2)
    };
    let th = pkt.bytes_at::<14>(l4)?;
    s.tuple[at] = w(th, 0);
    s.flags = th[13];
    Some(s)
}

/// The state of the socket of the interface's network namespace that
/// `s` reaches (`BPF_TCP_LISTEN` for a listener found by its port
/// alone), or `None`.
#[inline(always)]
pub fn socket(ctx: *mut xdp_md, s: &mut Segment) -> Option<u32> {
    socket_then(ctx, s, |_| false).map(|(state, _)| state)
}

/// [`socket`], and for a listener what `listener` says of it, asked
/// while the lookup's reference is held.
#[inline(always)]
#[expect(
    clippy::cast_sign_loss,
    clippy::cast_possible_truncation,
    reason = "BPF_F_CURRENT_NETNS is -1 by definition; a tuple is 12 or 36 bytes"
)]
pub fn socket_then(
    ctx: *mut xdp_md,
    s: &mut Segment,
    listener: impl FnOnce(*mut bpf_sock) -> bool,
) -> Option<(u32, bool)> {
    let size = if s.v6 { size_of::<V6>() } else { size_of::<V4>() };
    // SAFETY: the tuple's words are laid out as `bpf_sock_tuple` of the
    // family whose size is given, and live as long as the call.
    let sk = unsafe {
        bpf_skc_lookup_tcp(ctx.cast(), s.tuple.as_mut_ptr().cast(), size as u32, BPF_F_CURRENT_NETNS as u64, 0)
    };
    if sk.is_null() {
        return None;
    }
    // SAFETY: a socket the lookup returned, released right after.
    let state = unsafe { (*sk).state };
    let said = state == BPF_TCP_LISTEN && listener(sk);
    // SAFETY: the reference the lookup took.
    unsafe { bpf_sk_release(sk.cast()) };
    Some((state, said))
}

/// Whether the kernel takes the packet, a bare ACK to the listener `sk`,
/// as the third segment of a connection it answered with its own SYN
/// cookie: the kernel's check (`bpf_tcp_check_syncookie`), which refuses
/// at once unless the listener sent a cookie in the last two minutes (as
/// the kernel's own receive path does). IPv4 with options too: the
/// helper reads the addresses of the header's first 20 bytes and the TCP
/// header after the options.
#[inline(always)]
pub fn kernel_cookie(pkt: &Packet, sk: *mut bpf_sock) -> bool {
    let Some(l3) = pkt.l3() else { return false };
    let Some(v) = pkt.bytes_at::<1>(l3) else { return false };
    // SAFETY: the headers are inside the packet (checked by `bytes_at`)
    // for the lengths given; the helper only reads them.
    let r = if v[0] >> 4 == 6 {
        let (Some(ip), Some(th)) = (pkt.bytes_at::<40>(l3), pkt.bytes_at::<20>(l3 + 40)) else { return false };
        unsafe {
            bpf_tcp_check_syncookie(sk.cast(), ip.as_ptr().cast_mut().cast(), 40, th.as_ptr().cast_mut().cast(), 20)
        }
    } else {
        // Its header is asked for 40 bytes (with the TCP header's least,
        // every segment has them): the compiler would drop a 20-byte
        // check as implied by the segment's parse, and the verifier,
        // which does not follow that, would refuse the helper's read.
        let (Some(ip), Some(th)) = (pkt.bytes_at::<40>(l3), pkt.bytes_at::<20>(ipv4_l4(l3, v[0]))) else {
            return false;
        };
        unsafe {
            bpf_tcp_check_syncookie(sk.cast(), ip.as_ptr().cast_mut().cast(), 20, th.as_ptr().cast_mut().cast(), 20)
        }
    };
    r == 0
}

/// Where the TCP header of an IPv4 packet whose header starts at `l3`
/// with first byte `vihl` starts: after its options, if any. A header
/// shorter than 20 bytes never gets here (the parse refuses it), and is
/// not tested again on purpose: the compiler would take that test and
/// the TCP header's bounds check as implying the IP header's, and drop
/// the latter, which the verifier does not follow.
#[inline(always)]
pub fn ipv4_l4(l3: usize, vihl: u8) -> usize {
    l3 + usize::from(vihl & 0x0f) * 4
}

/// 1 when the packet is a TCP segment with ACK (not a bare SYN) of a
/// connection a socket of the interface's network namespace holds. A
/// global function: the tuple lives in its own frame.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn limiter_held(ctx: *mut xdp_md) -> u64 {
    let xdp = XdpContext::new(ctx);
    let Some(mut s) = segment(&Packet(&xdp)) else { return 0 };
    if s.flags & (tcp_flag::ACK | tcp_flag::SYN) != tcp_flag::ACK {
        return 0;
    }
    u64::from(socket(ctx, &mut s).is_some_and(|state| state != BPF_TCP_LISTEN))
}

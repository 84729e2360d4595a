//! Whether a TCP segment belongs to a connection this host holds (one
//! established, in SYN-RECV as a request, or in TIME_WAIT): the kernel's
//! socket tables, asked with `bpf_skc_lookup_tcp` on the segment's
//! 4-tuple. Asked only for a sampled rate-limited drop: such drops are
//! evidence a blind spoofer cannot forge without the connection's ports,
//! which escalation needs before it announces an address upstream.

use aya_ebpf::{
    bindings::{
        BPF_F_CURRENT_NETNS, BPF_TCP_LISTEN, bpf_sock_tuple, bpf_sock_tuple__bindgen_ty_1 as Tuple,
        bpf_sock_tuple__bindgen_ty_1__bindgen_ty_1 as V4, bpf_sock_tuple__bindgen_ty_1__bindgen_ty_2 as V6, xdp_md,
    },
    helpers::{bpf_sk_release, bpf_skc_lookup_tcp},
    programs::XdpContext,
};
use limiter_common::{
    family,
    packet::{Frame as _, IPPROTO_TCP, parse, tcp_flag, word as w},
};

use crate::packet::Packet;

/// 1 when the packet is a TCP segment (not a bare SYN) of a connection a
/// socket of the interface's network namespace holds. A global function:
/// the parse and the tuple live in its own frame.
#[unsafe(no_mangle)]
#[inline(never)]
#[expect(
    clippy::cast_sign_loss,
    clippy::cast_possible_truncation,
    reason = "BPF_F_CURRENT_NETNS is -1 by definition; a tuple is 12 or 36 bytes"
)]
pub extern "C" fn limiter_held(ctx: *mut xdp_md) -> u64 {
    let xdp = XdpContext::new(ctx);
    let pkt = Packet(&xdp);
    let mut fam = family::NONE;
    let Ok(src) = parse(&pkt, &mut fam) else { return 0 };
    if src.proto != IPPROTO_TCP || src.port_known == 0 || src.tcp_flags & tcp_flag::ACK == 0 {
        return 0;
    }
    let Some(l3) = pkt.l3() else { return 0 };
    let (sport, dport) = (src.sport.to_be(), src.dport.to_be());
    let netns = BPF_F_CURRENT_NETNS as u64;
    // SAFETY (both lookups): the helper reads the tuple's part of the
    // family it is given the size of, written just before.
    let sk = if fam == family::IPV4 {
        let Some(a) = pkt.bytes_at::<4>(l3 + 16) else { return 0 };
        let ip = V4 { saddr: src.addr[0], daddr: w(a, 0), sport, dport };
        let mut t = bpf_sock_tuple { __bindgen_anon_1: Tuple { ipv4: ip } };
        unsafe { bpf_skc_lookup_tcp(ctx.cast(), &raw mut t, size_of::<V4>() as u32, netns, 0) }
    } else {
        let Some(a) = pkt.bytes_at::<16>(l3 + 24) else { return 0 };
        let ip = V6 { saddr: src.addr, daddr: [w(a, 0), w(a, 4), w(a, 8), w(a, 12)], sport, dport };
        let mut t = bpf_sock_tuple { __bindgen_anon_1: Tuple { ipv6: ip } };
        unsafe { bpf_skc_lookup_tcp(ctx.cast(), &raw mut t, size_of::<V6>() as u32, netns, 0) }
    };
    if sk.is_null() {
        return 0;
    }
    // A listener found by its port alone holds no connection.
    // SAFETY: a socket the lookup returned, released right after.
    let held = unsafe { (*sk).state } != BPF_TCP_LISTEN;
    // SAFETY: the reference the lookup took.
    unsafe { bpf_sk_release(sk.cast()) };
    u64::from(held)
}

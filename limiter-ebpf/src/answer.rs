//! Answers to this host's own sockets: a reflection class holds amplified
//! answers from its source ports to a small budget per prefix, but the
//! host's own resolver (or NTP server) answers from the same ports, and a
//! flood reflected off it shares its prefix's bucket. A packet of such a
//! class that its budget refused is asked of the host's UDP sockets: if it
//! answers one this host connected to the packet's source address and
//! port, it passes (`own_answer`), charged to that socket's own budget
//! (`OWN_ANSWERS`: the class's allowance again, per connected socket).
//! Only on that drop path, so admitted packets and every other class pay
//! nothing; an unconnected socket (a server's, bound to a port every
//! sender may reach) is no proof and is not asked for. The socket's
//! budget bounds what a local user opens by connecting a socket to a
//! spoofed source: the class's allowance per socket, not the flood.

use aya_ebpf::{
    bindings::{
        BPF_F_CURRENT_NETNS, BPF_TCP_ESTABLISHED, bpf_sock_tuple, bpf_sock_tuple__bindgen_ty_1 as Tuple,
        bpf_sock_tuple__bindgen_ty_1__bindgen_ty_1 as V4, bpf_sock_tuple__bindgen_ty_1__bindgen_ty_2 as V6, xdp_md,
    },
    helpers::{bpf_sk_lookup_udp, bpf_sk_release},
    programs::XdpContext,
};
use limiter_common::{
    AnswerKey, Config, Reason, cost, family, flags,
    packet::{Frame as _, IPPROTO_UDP, parse, word as w},
};

use crate::{
    atomic::{Cas, cas},
    maps::{BPF_NOEXIST, OWN_ANSWERS},
    packet::Packet,
};

/// `reason`, or [`Reason::OwnAnswer`] when a budget refused a packet of
/// a class that asks (see the module) and it answers a socket this host
/// connected. Everything else is read again in [`limiter_own_answer`], on
/// the drop path only: a value kept here over the charge's calls would
/// take stack from the entry point's frame, which the charge's call chain
/// already fills to the verifier's limit.
#[inline(always)]
pub fn unless_own(ctx: &XdpContext, cfg: &Config, class: usize, reason: Reason, now: u64, len: u64) -> Reason {
    let refused = matches!(
        reason,
        Reason::RateLimited
            | Reason::Contended
            | Reason::NewSourceLimited
            | Reason::AggregateLimited
            | Reason::GroupLimited
    );
    let asks = cfg.flags & (1 << (flags::ANSWERS_SHIFT as usize + class)) != 0;
    if !(refused && asks) {
        return reason;
    }
    let Some(l) = cfg.classes.get(class) else { return reason };
    let inc = if l.cost == cost::BYTES { len * l.unit } else { l.unit };
    if limiter_own_answer(ctx.ctx, now, inc, l.tau) == 1 { Reason::OwnAnswer } else { reason }
}

/// 1 when the packet is UDP, answers a socket of the interface's network
/// namespace connected to its source address and port, and that socket's
/// budget (`inc` of a GCRA of tolerance `tau` at `now`) admits it. A
/// global function: the parse, the lookup's tuple and the key live in its
/// own frame, off the charge's call chain.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn limiter_own_answer(ctx: *mut xdp_md, now: u64, inc: u64, tau: u64) -> u64 {
    let xdp = XdpContext::new(ctx);
    let pkt = Packet(&xdp);
    let mut fam = family::NONE;
    let Ok(src) = parse(&pkt, &mut fam) else { return 0 };
    if src.proto != IPPROTO_UDP || src.port_known == 0 {
        return 0;
    }
    // The destination, which the parse does not keep.
    let Some(l3) = pkt.l3() else { return 0 };
    let (sport, dport) = (src.sport.to_be(), src.dport.to_be());
    // The tuple as the packet has it: the sender is the socket's peer.
    let mut key = AnswerKey {
        peer: src.addr,
        ports: u32::from(sport) | (u32::from(dport) << 16),
        family: u32::from(fam.0),
        ..AnswerKey::default()
    };
    let sk = if fam == family::IPV4 {
        let Some(a) = pkt.bytes_at::<4>(l3 + 16) else { return 0 };
        key.local[0] = w(a, 0);
        key.peer = [src.addr[0], 0, 0, 0];
        let ip = V4 { saddr: src.addr[0], daddr: key.local[0], sport, dport };
        let mut t = bpf_sock_tuple { __bindgen_anon_1: Tuple { ipv4: ip } };
        // SAFETY: the helper reads the tuple's IPv4 part, written above.
        unsafe { lookup(ctx, &mut t, size_of::<V4>()) }
    } else {
        let Some(a) = pkt.bytes_at::<16>(l3 + 24) else { return 0 };
        key.local = [w(a, 0), w(a, 4), w(a, 8), w(a, 12)];
        let ip = V6 { saddr: src.addr, daddr: key.local, sport, dport };
        let mut t = bpf_sock_tuple { __bindgen_anon_1: Tuple { ipv6: ip } };
        // SAFETY: the helper reads the tuple's IPv6 part, written above.
        unsafe { lookup(ctx, &mut t, size_of::<V6>()) }
    };
    if sk.is_null() {
        return 0;
    }
    // A connected UDP socket is in TCP_ESTABLISHED; one bound only is in
    // TCP_CLOSE (and the lookup found it by its local port alone).
    // SAFETY: a socket the lookup returned, released right after.
    let connected = unsafe { (*sk).state } == BPF_TCP_ESTABLISHED;
    // SAFETY: the reference the lookup took.
    unsafe { bpf_sk_release(sk.cast()) };
    if !connected {
        return 0;
    }
    // The socket's budget: a full one when first seen.
    if OWN_ANSWERS.get_ptr_mut(key).is_none() {
        let _ = OWN_ANSWERS.insert(key, now, BPF_NOEXIST);
    }
    let Some(tat) = OWN_ANSWERS.get_ptr_mut(key) else { return 0 };
    u64::from(cas(tat, |cur| limiter_common::gcra::admit(cur, now, inc, tau)) == Cas::Done)
}

/// The UDP socket of the interface's namespace the tuple reaches, if any.
///
/// # Safety
/// `size` bytes of `t` are written.
#[inline(always)]
#[expect(
    clippy::cast_sign_loss,
    clippy::cast_possible_truncation,
    reason = "BPF_F_CURRENT_NETNS is -1 by definition; a tuple is 12 or 36 bytes"
)]
unsafe fn lookup(ctx: *mut xdp_md, t: &mut bpf_sock_tuple, size: usize) -> *mut aya_ebpf::bindings::bpf_sock {
    // SAFETY: per the caller.
    unsafe { bpf_sk_lookup_udp(ctx.cast(), t, size as u32, BPF_F_CURRENT_NETNS as u64, 0) }
}

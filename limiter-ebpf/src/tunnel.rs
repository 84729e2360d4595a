//! Forwarding at the driver (`limiter_common::tunnel`): a packet the
//! entry point passes, while the policy forwards some destination, is
//! asked of the service map here; one to a service is wrapped in the
//! service's outer headers to its backend and sent out of the interface
//! the route to the backend takes (`XDP_TX` on the one it came in on,
//! else `XDP_REDIRECT`). A global function of its own, called after the
//! verdict as the out-of-state judge is, so its frame never sits on the
//! charge's call chain.

use aya_ebpf::{
    bindings::{
        BPF_FIB_LKUP_RET_FRAG_NEEDED, BPF_FIB_LKUP_RET_SUCCESS, bpf_fib_lookup as FibParams, xdp_action, xdp_md,
    },
    helpers::{bpf_fib_lookup, bpf_jiffies64, bpf_redirect, bpf_xdp_adjust_head, bpf_xdp_adjust_tail},
    programs::XdpContext,
};
use core::ptr::read_volatile;

use limiter_common::{
    packet::{Frame, IPPROTO_TCP, IPPROTO_UDP},
    tunnel::{
        Backend, Flow, HOP_JIFFIES, Hop, ICMP_FRAME_V4, ICMP_FRAME_V6, NO_BACKEND, QUOTE_V4, QUOTE_V6, Service,
        ServiceKey, TABLE_SIZE, encap, flow_hash, fold, outcome, overhead, service, state,
    },
};

use crate::{
    maps::{
        TUNNEL_BACKENDS, TUNNEL_CONNS, TUNNEL_FIB, TUNNEL_HITS, TUNNEL_HOPS, TUNNEL_OUTCOMES, TUNNEL_SERVICES,
        TUNNEL_TABLE,
    },
    packet::Packet,
};

const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
const IPPROTO_IPIP: u8 = 4;
const IPPROTO_IPV6: u8 = 41;

/// The XDP action for a packet the entry point passes (`XDP_PASS` if it
/// is not to a service, or the service says so).
#[inline(always)]
pub fn forward(pkt: &Packet) -> u32 {
    match limiter_tunnel(pkt.0.ctx) {
        a if a == u64::from(xdp_action::XDP_TX) => xdp_action::XDP_TX,
        a if a == u64::from(xdp_action::XDP_REDIRECT) => xdp_action::XDP_REDIRECT,
        a if a == u64::from(xdp_action::XDP_DROP) => xdp_action::XDP_DROP,
        _ => xdp_action::XDP_PASS,
    }
}

/// A passed packet: forwarded if it is to a service (returns its XDP
/// action).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn limiter_tunnel(ctx: *mut xdp_md) -> u64 {
    let xdp = XdpContext::new(ctx);
    let pkt = Packet(&xdp);
    let pass = u64::from(xdp_action::XDP_PASS);
    let Some(l3) = pkt.l3() else { return pass };
    let Some(version) = pkt.bytes_at::<1>(l3) else { return pass };
    let v6 = version[0] >> 4 == 6;
    let mut key = ServiceKey::default();
    let mut flow = Flow::default();
    // The inner header's DSCP and ECN (copied to the outer header), and
    // where its transport header starts (0: not read).
    let (tos, l4, proto) = if v6 {
        let Some(h) = pkt.bytes_at::<40>(l3) else { return pass };
        flow.src.copy_from_slice(&h[8..24]);
        flow.dst.copy_from_slice(&h[24..40]);
        key.v6 = 1;
        let plain = h[6] == IPPROTO_TCP || h[6] == IPPROTO_UDP;
        (h[0] << 4 | h[1] >> 4, if plain { l3 + 40 } else { 0 }, h[6])
    } else {
        let Some(h) = pkt.bytes_at::<20>(l3) else { return pass };
        if h[0] >> 4 != 4 {
            return pass;
        }
        flow.src[..4].copy_from_slice(&h[12..16]);
        flow.dst[..4].copy_from_slice(&h[16..20]);
        #[expect(clippy::verbose_bit_mask, reason = "the fragment offset's bits and MF, as the header names them")]
        let whole = h[6] & 0x3f == 0 && h[7] == 0;
        (h[1], if whole { l3 + usize::from(h[0] & 0xf) * 4 } else { 0 }, h[9])
    };
    key.addr = flow.dst;
    if l4 == 0 {
        // A fragment or a header chain: no ports to pick a backend by.
        // Counted if its address is a service's (the port-0 entry).
        // SAFETY: a map value read only while this program runs.
        if unsafe { TUNNEL_SERVICES.get(key) }.is_some() {
            outcome_of(outcome::UNREAD);
        }
        return pass;
    }
    if proto != IPPROTO_TCP && proto != IPPROTO_UDP {
        return pass;
    }
    let Some(ports) = pkt.bytes_at::<4>(l4) else { return pass };
    key.port = u16::from_be_bytes([ports[2], ports[3]]);
    key.proto = proto;
    // SAFETY: a map value read only while this program runs.
    let Some(svc) = (unsafe { TUNNEL_SERVICES.get(key) }) else { return pass };
    flow.ports = *ports;
    flow.proto = proto;
    let hash = flow_hash(&flow.src, &flow.ports, proto);
    let Some((idx, backend)) = backend_of(&flow, svc, hash) else {
        outcome_of(outcome::NO_BACKEND);
        return if svc.flags & service::EMPTY_PASS != 0 { pass } else { u64::from(xdp_action::XDP_DROP) };
    };
    let inner = (xdp.data_end() - xdp.data()).saturating_sub(l3);
    let outer_v6 = svc.v6 == 1;
    let over = overhead(svc.encap, outer_v6);
    let ingress = unsafe { (*ctx).ingress_ifindex };
    let Some(hop) = hop_of(ctx, idx, svc, backend, ingress) else {
        // No route XDP can send on (the next hop's address not resolved,
        // forwarding off, no route): dropped. The stack would drop the
        // wrapped packet too (its source is this host's); the daemon's
        // checks keep each backend's next hop resolved.
        outcome_of(outcome::UNROUTABLE);
        return u64::from(xdp_action::XDP_DROP);
    };
    if inner + over > hop.mtu as usize {
        outcome_of(outcome::TOO_BIG);
        if svc.flags & service::TOO_BIG_PASS != 0 {
            return pass;
        }
        let mtu = (hop.mtu as usize).saturating_sub(over);
        let asked = u64::from(v6) | (l3 as u64) << 8 | (mtu as u64) << 16 | ((l3 + inner) as u64) << 32;
        if svc.flags & service::TOO_BIG_DROP == 0 && limiter_too_big(ctx, asked) == 1 {
            return u64::from(xdp_action::XDP_TX);
        }
        return u64::from(xdp_action::XDP_DROP);
    }
    // The outer headers replace the Ethernet header and any VLAN tags.
    #[expect(clippy::cast_possible_truncation, clippy::cast_possible_wrap, reason = "under 64 bytes")]
    let grow = (14 + over) as i32 - l3 as i32;
    // SAFETY: the helper moves the frame's start; nothing of it is held.
    if unsafe { bpf_xdp_adjust_head(ctx, -grow) } != 0 {
        outcome_of(outcome::NO_ROOM);
        return pass;
    }
    if wrap(&pkt, svc, hop, Inner { hash, len: inner, tos, v6 }, backend).is_none() {
        outcome_of(outcome::NO_ROOM);
        return u64::from(xdp_action::XDP_DROP);
    }
    if let Some(c) = TUNNEL_HITS.get_ptr_mut(idx) {
        // SAFETY: per-CPU slot, only this CPU's softirq writes it.
        unsafe {
            (*c).packets += 1;
            (*c).bytes += inner as u64;
        }
    }
    if hop.ifindex == ingress {
        return u64::from(xdp_action::XDP_TX);
    }
    // SAFETY: a helper taking an interface index.
    #[expect(clippy::cast_sign_loss, reason = "XDP_REDIRECT or XDP_ABORTED")]
    let r = unsafe { bpf_redirect(hop.ifindex, 0) } as u64;
    r
}

/// Turn a packet too big for the path once wrapped into the ICMP error
/// that tells its sender the largest packet that fits, `mtu` (IPv4's
/// "fragmentation needed", type 3 code 4; ICMPv6's "packet too big",
/// type 2), from the service address, quoting the packet's header and 8
/// bytes, sent back out of the interface it came in on. `None` (the
/// caller drops it): a frame with VLAN tags, IPv4 options, or too short
/// to quote.
#[inline(always)]
fn too_big(ctx: *mut xdp_md, v6: bool, l3: usize, mtu: usize, len: usize) -> Option<()> {
    // Against the verifier's view of a global function's argument.
    let (l3, mtu, len) = (l3 & 0xff, mtu & 0xffff, len & 0xffff);
    let xdp = XdpContext::new(ctx);
    let pkt = Packet(&xdp);
    let (quote, frame) = if v6 { (QUOTE_V6, ICMP_FRAME_V6) } else { (QUOTE_V4, ICMP_FRAME_V4) };
    if l3 != 14 || !pkt.holds(14, quote) || (!v6 && pkt.bytes_at::<1>(14)?[0] != 0x45) {
        return None;
    }
    let grow = frame - 14 - quote;
    #[expect(clippy::cast_possible_truncation, clippy::cast_possible_wrap, reason = "under 64 bytes")]
    // SAFETY: the helper moves the frame's start; nothing of it is held.
    if unsafe { bpf_xdp_adjust_head(ctx, -(grow as i32)) } != 0 {
        return None;
    }
    let len = len + grow;
    #[expect(clippy::cast_possible_truncation, clippy::cast_possible_wrap, reason = "a frame is under 64 KiB")]
    // SAFETY: as above; the frame only shrinks to `frame` bytes.
    if unsafe { bpf_xdp_adjust_tail(ctx, frame as i32 - len as i32) } != 0 {
        return None;
    }
    #[expect(clippy::cast_possible_truncation, reason = "an MTU is under 64 KiB")]
    let (hi, lo) = ((mtu >> 8) as u8, mtu as u8);
    if v6 {
        let f = pkt.bytes_mut::<ICMP_FRAME_V6>(0)?;
        swap_eth::<ICMP_FRAME_V6, { ICMP_FRAME_V6 - 14 - QUOTE_V6 }>(f);
        f[12] = 0x86;
        f[13] = 0xdd;
        // From the quote's destination to its source (the quote starts
        // at 62: its source at 70, its destination at 86).
        for i in 0..16 {
            f[22 + i] = f[86 + i];
        }
        for i in 0..16 {
            f[38 + i] = f[70 + i];
        }
        let head = [0x60, 0, 0, 0, 0, 56, 58, 64, 2, 0, 0, 0, 0, 0, hi, lo];
        for (i, b) in head.iter().enumerate() {
            f[if i < 8 { 14 + i } else { 46 + i }] = *b;
        }
        let pseudo = sum_at(&f[22..54], 56 + 58);
        let c = fold(sum_at(&f[54..], pseudo)).to_be_bytes();
        f[56] = c[0];
        f[57] = c[1];
        return Some(());
    }
    let f = pkt.bytes_mut::<ICMP_FRAME_V4>(0)?;
    swap_eth::<ICMP_FRAME_V4, { ICMP_FRAME_V4 - 14 - QUOTE_V4 }>(f);
    f[12] = 0x08;
    f[13] = 0x00;
    // The quote starts at 42: its source at 54, its destination at 58.
    for i in 0..4 {
        f[26 + i] = f[58 + i];
        f[30 + i] = f[54 + i];
    }
    let head = [0x45, 0, 0, 56, 0, 0, 0, 0, 64, 1, 0, 0];
    for (i, b) in head.iter().enumerate() {
        f[14 + i] = *b;
    }
    let c = fold(sum_at(&f[14..34], 0)).to_be_bytes();
    f[24] = c[0];
    f[25] = c[1];
    let icmp = [3, 4, 0, 0, 0, 0, hi, lo];
    for (i, b) in icmp.iter().enumerate() {
        f[34 + i] = *b;
    }
    let c = fold(sum_at(&f[34..], 0)).to_be_bytes();
    f[36] = c[0];
    f[37] = c[1];
    Some(())
}

/// The Ethernet header the frame came with, `GROW` bytes on, written at
/// its start with its addresses swapped.
#[inline(always)]
fn swap_eth<const N: usize, const GROW: usize>(f: &mut [u8; N]) {
    const { assert!(GROW + 12 <= N) };
    for i in 0..6 {
        let (d, src) = (f[GROW + i], f[GROW + 6 + i]);
        f[i] = src;
        f[6 + i] = d;
    }
}

/// `sum` plus the 16-bit words of `bytes`, each read from the packet
/// again (volatile): the compiler would otherwise keep the bytes just
/// written in registers, and spill them onto a stack that has no room.
#[inline(always)]
fn sum_at(bytes: &[u8], mut sum: u32) -> u32 {
    let mut i = 0;
    while i + 1 < bytes.len() {
        // SAFETY: two reads inside the slice.
        let (a, b) = unsafe { (read_volatile(&raw const bytes[i]), read_volatile(&raw const bytes[i + 1])) };
        sum += u32::from(a) << 8 | u32::from(b);
        i += 2;
    }
    sum
}

/// [`too_big`] as a global function of its own: its frame stays off
/// [`limiter_tunnel`]'s (`asked`: IPv6 in bit 0, the IP header's offset
/// from bit 8, the MTU from bit 16, the frame's length from bit 32). Returns 1 if the answer is ready.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn limiter_too_big(ctx: *mut xdp_md, asked: u64) -> u64 {
    let (v6, l3, mtu, len) = (asked & 1 == 1, (asked >> 8) as usize, (asked >> 16) as usize, (asked >> 32) as usize);
    u64::from(too_big(ctx, v6, l3, mtu, len).is_some())
}

/// The backend's next hop on this CPU: the one kept, if looked up less
/// than [`HOP_JIFFIES`] ago, else looked up now (twice: with the longest
/// packet, whose refusal says the route's MTU, then with none, which
/// finds the neighbour) and kept. `None`: no route XDP can send on; not
/// kept, so the next packet asks again.
#[inline(always)]
fn hop_of<'a>(ctx: *mut xdp_md, idx: u32, svc: &Service, backend: &Backend, ingress: u32) -> Option<&'a Hop> {
    let kept = TUNNEL_HOPS.get_ptr_mut(idx)?;
    // SAFETY: a helper with no arguments; a per-CPU slot only this CPU's
    // softirq writes.
    let (now, kept) = unsafe { (bpf_jiffies64(), &mut *kept) };
    if kept.ifindex != 0 && now.wrapping_sub(kept.at) < HOP_JIFFIES {
        return Some(kept);
    }
    // The lookup's parameters in this CPU's scratch slot: 64 bytes the
    // stack has no room for.
    let fib = TUNNEL_FIB.get_ptr_mut(0)?;
    // SAFETY: a per-CPU slot only this CPU's softirq uses, of a
    // `bpf_fib_lookup`'s size and alignment (all-zero is a valid one).
    let fib = unsafe { &mut *fib.cast::<FibParams>() };
    *fib = unsafe { core::mem::zeroed() };
    let ask = |fib: &mut FibParams, len: u16| {
        fib.ifindex = ingress;
        fib.__bindgen_anon_1.tot_len = len;
        if svc.v6 == 1 {
            fib.family = AF_INET6;
            fib.__bindgen_anon_3.ipv6_src = words(&svc.source);
            fib.__bindgen_anon_4.ipv6_dst = words(&backend.addr);
        } else {
            fib.family = AF_INET;
            fib.__bindgen_anon_3.ipv4_src =
                u32::from_ne_bytes([svc.source[0], svc.source[1], svc.source[2], svc.source[3]]);
            fib.__bindgen_anon_4.ipv4_dst =
                u32::from_ne_bytes([backend.addr[0], backend.addr[1], backend.addr[2], backend.addr[3]]);
        }
        // SAFETY: `fib` is a `bpf_fib_lookup` of its own size.
        #[expect(clippy::cast_possible_truncation, clippy::cast_possible_wrap, reason = "64 bytes")]
        unsafe {
            bpf_fib_lookup(ctx.cast(), &raw mut *fib, size_of::<FibParams>() as i32, 0)
        }
    };
    let mtu = if ask(fib, u16::MAX) == i64::from(BPF_FIB_LKUP_RET_FRAG_NEEDED) {
        // SAFETY: the helper's answer to a packet too big is the MTU.
        u32::from(unsafe { fib.__bindgen_anon_1.mtu_result })
    } else {
        u32::from(u16::MAX)
    };
    if ask(fib, 0) != i64::from(BPF_FIB_LKUP_RET_SUCCESS) {
        kept.ifindex = 0;
        return None;
    }
    kept.at = now;
    kept.ifindex = fib.ifindex;
    kept.mtu = mtu;
    kept.dmac = fib.dmac;
    kept.smac = fib.smac;
    Some(kept)
}

/// What the outer headers take of the inner packet.
struct Inner {
    hash: u32,
    len: usize,
    tos: u8,
    v6: bool,
}

/// Write the outer headers at the frame's new start: the Ethernet header
/// (to the next hop), the outer IP header, and for FOU and GUE a UDP header (GUE's 4 bytes after it).
/// Written in place: the program's stack has no room for copies.
#[inline(always)]
#[expect(clippy::cast_possible_truncation, reason = "header fields take the hash's low bits; lengths under 64 KiB")]
fn wrap(pkt: &Packet, svc: &Service, hop: &Hop, inner: Inner, backend: &Backend) -> Option<()> {
    let eth = pkt.bytes_mut::<14>(0)?;
    eth[..6].copy_from_slice(&hop.dmac);
    eth[6..12].copy_from_slice(&hop.smac);
    let hash = inner.hash;
    if svc.v6 == 1 {
        eth[12..].copy_from_slice(&[0x86, 0xdd]);
        let h = pkt.bytes_mut::<40>(14)?;
        h[0] = 0x60 | inner.tos >> 4;
        h[1] = inner.tos << 4 | (hash >> 16) as u8 & 0xf;
        h[2..4].copy_from_slice(&(hash as u16).to_be_bytes());
        h[4..6].copy_from_slice(&(inner.len as u16).to_be_bytes());
        h[6] = IPPROTO_IPV6;
        h[7] = svc.ttl;
        h[8..24].copy_from_slice(&svc.source);
        h[24..40].copy_from_slice(&backend.addr);
        return Some(());
    }
    eth[12..].copy_from_slice(&[0x08, 0x00]);
    let total = (inner.len + overhead(svc.encap, false)) as u16;
    let h = pkt.bytes_mut::<20>(14)?;
    h[0] = 0x45;
    h[1] = inner.tos;
    h[2..4].copy_from_slice(&total.to_be_bytes());
    h[4..6].copy_from_slice(&[0, 0]);
    h[6..8].copy_from_slice(&[0x40, 0]);
    h[8] = svc.ttl;
    h[9] = if svc.encap == encap::IPIP { IPPROTO_IPIP } else { IPPROTO_UDP };
    h[10..12].copy_from_slice(&[0, 0]);
    h[12..16].copy_from_slice(&svc.source[..4]);
    h[16..20].copy_from_slice(&backend.addr[..4]);
    let sum = limiter_common::tunnel::ipv4_checksum(h);
    h[10..12].copy_from_slice(&sum.to_be_bytes());
    if svc.encap == encap::IPIP {
        return Some(());
    }
    let u = pkt.bytes_mut::<8>(34)?;
    // A source port of the flow's, in the dynamic range.
    u[..2].copy_from_slice(&(0xc000 | hash as u16 & 0x3fff).to_be_bytes());
    u[2..4].copy_from_slice(&svc.port.to_be_bytes());
    u[4..6].copy_from_slice(&(total - 20).to_be_bytes());
    u[6..8].copy_from_slice(&[0, 0]);
    if svc.encap == encap::GUE {
        // GUE's header: version 0, no options, the inner protocol.
        let g = pkt.bytes_mut::<4>(42)?;
        *g = [0, if inner.v6 { IPPROTO_IPV6 } else { IPPROTO_IPIP }, 0, 0];
    }
    Some(())
}

/// The flow's backend: the connection table's, while that backend is of
/// this service and not down; else the one the flow's slot of the
/// service's table names, remembered for the flow (`None`: no backend
/// up).
#[inline(always)]
fn backend_of<'a>(flow: &Flow, svc: &Service, hash: u32) -> Option<(u32, &'a Backend)> {
    // SAFETY: map values read only while this program runs.
    if let Some(&i) = unsafe { TUNNEL_CONNS.get(flow) }
        && let Some(b) = TUNNEL_BACKENDS.get(i)
        && b.service == svc.index
        && b.state != state::DOWN
    {
        return Some((i, b));
    }
    let slot = svc.index.wrapping_mul(TABLE_SIZE).wrapping_add(hash % TABLE_SIZE);
    let i = TUNNEL_TABLE.get(slot).copied().unwrap_or(NO_BACKEND);
    let b = TUNNEL_BACKENDS.get(i)?;
    let _ = TUNNEL_CONNS.insert(flow, i, 0);
    Some((i, b))
}

/// Count one packet of a service under `outcome`.
#[inline(always)]
fn outcome_of(outcome: u32) {
    if let Some(c) = TUNNEL_OUTCOMES.get_ptr_mut(outcome) {
        // SAFETY: per-CPU slot, only this CPU's softirq writes it.
        unsafe { *c += 1 };
    }
}

/// An IPv6 address as `bpf_fib_lookup`'s four words, in network order.
#[inline(always)]
fn words(a: &[u8; 16]) -> [u32; 4] {
    let w = |i: usize| u32::from_ne_bytes([a[i], a[i + 1], a[i + 2], a[i + 3]]);
    [w(0), w(4), w(8), w(12)]
}

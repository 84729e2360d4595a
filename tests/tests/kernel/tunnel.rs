//! Forwarding at the driver, packet by packet (BPF_PROG_TEST_RUN in a
//! namespace of the test's own, where the route to the backends leaves
//! by a veth whose next hops are static neighbours): the outer headers
//! as each encapsulation writes them, checked field by field with sums
//! computed here; the connection table holding a flow on its backend
//! while the table changes, until that backend is down; no backend; and
//! the ICMP answer to a packet too big once wrapped, over IPv4 and IPv6.

use std::net::{Ipv4Addr, Ipv6Addr};

use limiter_common::{
    flags, programs,
    tunnel::{Backend, NO_BACKEND, Service, ServiceKey, TABLE_SIZE, encap, outcome, service, state},
};
use limiter_tests::{
    kernel::{self, XDP_DROP, XDP_PASS},
    packet::{ETH_P_IP, ETH_P_IPV6, Frame, IPPROTO_TCP},
    tunnel::{fib_ns as routes, ones_sum as sum},
};

use limiter::dataplane::xdp_action::{XDP_REDIRECT, XDP_TX};
const VIP: Ipv4Addr = Ipv4Addr::new(198, 18, 7, 100);
const VIP6: &str = "2001:2:0:7::100";
const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 5, 10);
const SOURCE: [u8; 4] = [198, 19, 0, 1];
use limiter_tests::tunnel::{FIB_BACKENDS as B, FIB_MACS as B_MAC};
const TTL: u8 = 33;

fn addr16(a: [u8; 4]) -> [u8; 16] {
    let mut o = [0; 16];
    o[..4].copy_from_slice(&a);
    o
}

fn key(port: u16) -> ServiceKey {
    ServiceKey { addr: addr16(VIP.octets()), port, proto: IPPROTO_TCP, v6: 0 }
}

fn svc(encap: u8, flags: u8) -> Service {
    Service { index: 0, encap, flags, ttl: TTL, v6: 0, port: 5555, pad: 0, source: addr16(SOURCE) }
}

fn backend(i: usize, st: u8) -> (u32, Backend) {
    (u32::try_from(i).unwrap(), Backend { addr: addr16(B[i]), state: st, pad: [0; 3], service: 0 })
}

fn table_of(b: u32) -> Vec<u32> {
    vec![b; TABLE_SIZE as usize]
}

/// A TCP segment from `src`:`sport` to the service's port 80 with TOS
/// 0x28 and `payload` bytes.
fn seg(src: Ipv4Addr, sport: u16, payload: usize) -> Vec<u8> {
    let mut f = Frame::eth(ETH_P_IP).ipv4(src, IPPROTO_TCP, 0, 0x4000).tcp_ports(sport, 80, 0x10).payload(payload).to_v4(VIP).bytes;
    f[15] = 0x28;
    let len = u16::try_from(f.len() - 14).unwrap();
    f[16..18].copy_from_slice(&len.to_be_bytes());
    f
}

fn loaded() -> limiter::dataplane::DataPlane {
    let mut c = kernel::config(1_000_000, 1_000_000, false, 24, 56);
    c.config.flags |= flags::TUNNELS;
    let mut l = kernel::open_bench(&c, 1024);
    l.load_program(programs::LIMITER_TEST_CLOCK).unwrap();
    l
}

/// The outer IPv4 header at 14, checked field by field: which backend
/// it goes to.
fn outer_v4(out: &[u8], proto: u8, inner_len: usize, extra: usize) -> usize {
    assert_eq!(&out[12..14], &[0x08, 0x00]);
    let h = &out[14..34];
    assert_eq!(h[0], 0x45);
    assert_eq!(h[1], 0x28, "the inner DSCP and ECN are copied");
    assert_eq!(usize::from(u16::from_be_bytes([h[2], h[3]])), 20 + extra + inner_len, "total length");
    assert_eq!(h[6] & 0x40, 0x40, "DF");
    assert_eq!(h[8], TTL);
    assert_eq!(h[9], proto);
    assert_eq!(sum(h, 0), 0xffff, "the outer header's checksum");
    assert_eq!(h[12..16], SOURCE);
    B.iter().position(|b| h[16..20] == *b).expect("to a backend")
}

#[test]
fn each_encapsulation_writes_its_outer_headers_and_keeps_the_packet_whole() {
    kernel::require_root();
    let (ns, k0) = routes();
    let mut l = loaded();
    let input = seg(CLIENT, 40_000, 100);
    let inner = &input[14..];
    ns.run_in(|| {
        // IPIP.
        l.set_tunnel(&[key(80)], svc(encap::IPIP, 0), &[backend(0, state::UP)], &table_of(0)).unwrap();
        let (action, out) = l.run_out(1_000_000_000, &input).unwrap();
        assert_eq!(action, XDP_REDIRECT, "sent out of k0, not the interface it came in on");
        assert_eq!(out[..6], B_MAC[0]);
        assert_eq!(out[6..12], k0);
        assert_eq!(outer_v4(&out, 4, inner.len(), 0), 0);
        assert_eq!(&out[34..], inner, "the inner packet whole");
        // GUE: a UDP header to the backends' port, GUE's naming IPv4.
        l.set_tunnel(&[key(80)], svc(encap::GUE, 0), &[], &table_of(0)).unwrap();
        let (_, out) = l.run_out(1_000_000_000, &input).unwrap();
        outer_v4(&out, 17, inner.len(), 12);
        let udp = &out[34..42];
        assert!(u16::from_be_bytes([udp[0], udp[1]]) >= 0xc000, "a source port of the dynamic range");
        assert_eq!(u16::from_be_bytes([udp[2], udp[3]]), 5555);
        assert_eq!(usize::from(u16::from_be_bytes([udp[4], udp[5]])), 12 + inner.len());
        assert_eq!(&out[42..46], &[0, 4, 0, 0]);
        assert_eq!(&out[46..], inner);
        // FOU: no GUE header.
        l.set_tunnel(&[key(80)], svc(encap::FOU, 0), &[], &table_of(0)).unwrap();
        let (_, out) = l.run_out(1_000_000_000, &input).unwrap();
        outer_v4(&out, 17, inner.len(), 8);
        assert_eq!(&out[42..], inner);
        // Another port: not the tunnel's, passed as it came.
        let other = Frame::eth(ETH_P_IP).ipv4(CLIENT, IPPROTO_TCP, 0, 0).tcp_ports(40_000, 81, 0x10).to_v4(VIP).bytes;
        assert_eq!(l.run_out(1_000_000_000, &other).unwrap(), (XDP_PASS, other.clone()));
    });
    // IPv6 in IPv6.
    let vip6: Ipv6Addr = VIP6.parse().unwrap();
    let client6: Ipv6Addr = "2001:2::10".parse().unwrap();
    let (src6, b6): (Ipv6Addr, Ipv6Addr) = ("2001:2:0:19::1".parse().unwrap(), "2001:2:0:19::2".parse().unwrap());
    let mut input = Frame::eth(ETH_P_IPV6).ipv6(client6, IPPROTO_TCP).tcp_ports(40_000, 443, 0x10).payload(64).to_v6(vip6).bytes;
    let plen = u16::try_from(input.len() - 54).unwrap();
    input[18..20].copy_from_slice(&plen.to_be_bytes());
    ns.run_in(|| {
        let k = ServiceKey { addr: vip6.octets(), port: 443, proto: IPPROTO_TCP, v6: 1 };
        let s = Service { index: 1, v6: 1, source: src6.octets(), ..svc(encap::IPIP, 0) };
        let b = Backend { addr: b6.octets(), state: state::UP, pad: [0; 3], service: 1 };
        l.set_tunnel(&[k], s, &[(5, b)], &table_of(5)).unwrap();
        let (action, out) = l.run_out(1_000_000_000, &input).unwrap();
        assert_eq!(action, XDP_REDIRECT);
        assert_eq!(out[..6], B_MAC[0]);
        assert_eq!(&out[12..14], &[0x86, 0xdd]);
        assert_eq!(out[14] >> 4, 6);
        assert_eq!(usize::from(u16::from_be_bytes([out[18], out[19]])), input.len() - 14, "payload: the inner packet");
        assert_eq!((out[20], out[21]), (41, TTL));
        assert_eq!(out[22..38], src6.octets());
        assert_eq!(out[38..54], b6.octets());
        assert_eq!(&out[54..], &input[14..]);
        assert!(l.tunnel_counts(5).0.packets >= 1, "counted for its backend");
    });
}

#[test]
fn a_flow_stays_on_its_backend_while_the_table_changes_until_that_backend_is_down() {
    kernel::require_root();
    let (ns, _) = routes();
    let mut l = loaded();
    let flow = |port: u16| seg(CLIENT, port, 10);
    let to = |l: &mut limiter::dataplane::DataPlane, port: u16| {
        let (action, out) = l.run_out(1_000_000_000, &flow(port)).unwrap();
        (action == XDP_REDIRECT).then(|| outer_v4(&out, 4, out.len() - 34, 0))
    };
    ns.run_in(|| {
        let both = [backend(0, state::UP), backend(1, state::UP)];
        l.set_tunnel(&[key(80)], svc(encap::IPIP, 0), &both, &table_of(0)).unwrap();
        assert_eq!(to(&mut l, 1000), Some(0));
        // The table now sends every flow to backend 1: a flow seen before
        // stays on 0, a new one goes to 1.
        l.set_tunnel(&[], svc(encap::IPIP, 0), &[], &table_of(1)).unwrap();
        assert_eq!(to(&mut l, 1000), Some(0), "the connection table holds the flow");
        assert_eq!(to(&mut l, 1001), Some(1));
        // Drained: out of the table, keeps its flows.
        l.set_tunnel(&[], svc(encap::IPIP, 0), &[backend(0, state::DRAINED)], &table_of(1)).unwrap();
        assert_eq!(to(&mut l, 1000), Some(0), "a drained backend keeps its flows");
        // Down: its flows pick again.
        l.set_tunnel(&[], svc(encap::IPIP, 0), &[backend(0, state::DOWN)], &table_of(1)).unwrap();
        assert_eq!(to(&mut l, 1000), Some(1), "a backend that is down loses its flows");
        // No backend at all: dropped and counted, or passed if asked.
        let before = l.tunnel_counts(0).1[outcome::NO_BACKEND as usize];
        l.set_tunnel(&[], svc(encap::IPIP, 0), &[], &table_of(NO_BACKEND)).unwrap();
        assert_eq!(l.run_out(1_000_000_000, &flow(2000)).unwrap().0, XDP_DROP);
        assert_eq!(l.tunnel_counts(0).1[outcome::NO_BACKEND as usize], before + 1);
        l.set_tunnel(&[key(80)], svc(encap::IPIP, service::EMPTY_PASS), &[], &table_of(NO_BACKEND)).unwrap();
        assert_eq!(l.run_out(1_000_000_000, &flow(2001)).unwrap().0, XDP_PASS);
    });
}

#[test]
fn a_packet_too_big_once_wrapped_is_answered_with_the_paths_mtu() {
    kernel::require_root();
    let (ns, _) = routes();
    let mut l = loaded();
    // 1,500 bytes of IP: 1,520 once wrapped, over k0's 1,500.
    let input = seg(CLIENT, 40_000, 1500 - 40);
    ns.run_in(|| {
        l.set_tunnel(&[key(80)], svc(encap::IPIP, 0), &[backend(0, state::UP)], &table_of(0)).unwrap();
        let (action, out) = l.run_out(1_000_000_000, &input).unwrap();
        assert_eq!(action, XDP_TX, "sent back out of the interface it came in on");
        assert_eq!(out.len(), 14 + 20 + 8 + 28);
        assert_eq!((&out[..6], &out[6..12]), (&input[6..12], &input[..6]), "the Ethernet addresses swapped");
        let ip = &out[14..34];
        assert_eq!(sum(ip, 0), 0xffff, "its IP checksum");
        assert_eq!((ip[9], &ip[12..16], &ip[16..20]), (1, &VIP.octets()[..], &CLIENT.octets()[..]));
        let icmp = &out[34..];
        assert_eq!((icmp[0], icmp[1]), (3, 4), "fragmentation needed");
        assert_eq!(u16::from_be_bytes([icmp[6], icmp[7]]), 1480, "the path's MTU less the outer header");
        assert_eq!(sum(icmp, 0), 0xffff, "its ICMP checksum");
        assert_eq!(&icmp[8..], &input[14..42], "the packet's header and 8 bytes quoted");
        assert!(l.tunnel_counts(0).1[outcome::TOO_BIG as usize] >= 1);
        // too_big = "drop".
        l.set_tunnel(&[key(80)], svc(encap::IPIP, service::TOO_BIG_DROP), &[], &table_of(0)).unwrap();
        assert_eq!(l.run_out(1_000_000_000, &input).unwrap().0, XDP_DROP);
    });
    let vip6: Ipv6Addr = VIP6.parse().unwrap();
    let client6: Ipv6Addr = "2001:2::10".parse().unwrap();
    let mut input = Frame::eth(ETH_P_IPV6).ipv6(client6, IPPROTO_TCP).tcp_ports(40_000, 443, 0x10).payload(1500 - 60).to_v6(vip6).bytes;
    let plen = u16::try_from(input.len() - 54).unwrap();
    input[18..20].copy_from_slice(&plen.to_be_bytes());
    ns.run_in(|| {
        let k = ServiceKey { addr: vip6.octets(), port: 443, proto: IPPROTO_TCP, v6: 1 };
        let src6: Ipv6Addr = "2001:2:0:19::1".parse().unwrap();
        let s = Service { index: 1, v6: 1, source: src6.octets(), ..svc(encap::IPIP, 0) };
        let b = Backend { addr: "2001:2:0:19::2".parse::<Ipv6Addr>().unwrap().octets(), state: state::UP, pad: [0; 3], service: 1 };
        l.set_tunnel(&[k], s, &[(5, b)], &table_of(5)).unwrap();
        let (action, out) = l.run_out(1_000_000_000, &input).unwrap();
        assert_eq!(action, XDP_TX);
        assert_eq!(out.len(), 14 + 40 + 8 + 48);
        assert_eq!((&out[22..38], &out[38..54]), (&vip6.octets()[..], &client6.octets()[..]));
        assert_eq!((out[20], usize::from(u16::from_be_bytes([out[18], out[19]]))), (58, 56));
        let icmp = &out[54..];
        assert_eq!((icmp[0], icmp[1]), (2, 0), "packet too big");
        assert_eq!(u32::from_be_bytes([icmp[4], icmp[5], icmp[6], icmp[7]]), 1460);
        // The pseudo-header: both addresses, the length, next header 58.
        let pseudo = u32::from(sum(&out[22..54], 56 + 58));
        assert_eq!(sum(icmp, pseudo), 0xffff, "its ICMPv6 checksum");
        assert_eq!(&icmp[8..], &input[14..62]);
    });
}

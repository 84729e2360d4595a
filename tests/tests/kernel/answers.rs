//! Answers to this host's own sockets through the real program (injected
//! clock): a reflection class's refusal passes as `own_answer` when the
//! packet answers a UDP socket this host connected to its source, and
//! only then, within that socket's own budget (the class's allowance
//! again, per socket: a local user's socket connected to a spoofed
//! source opens no uncharged hole). The program asks the sockets of the namespace the test
//! runs in (BPF_PROG_TEST_RUN's loopback), so the sockets are on it.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

use limiter::policy::{Class, CostUnit, Limit, Mode, Policy, Protocol, SynCookies};
use limiter_common::Reason;
use limiter_tests::{
    kernel,
    packet::{ETH_P_IP, ETH_P_IPV6, Frame, IPPROTO_UDP},
};

const T0: u64 = 5_000_000_000_000;

fn lim(rate: u64, burst: u64) -> Limit {
    Limit { rate, burst, cost: CostUnit::Packets, mode: Mode::Enforce, window: None }
}

/// The default class (burst 1) and a reflection class (burst 1) of the
/// given source ports.
fn policy(source_ports: &[u16]) -> Policy {
    Policy {
        default: lim(1, 1),
        classes: vec![Class {
            name: "reflection".into(),
            protocol: Protocol::Udp,
            ports: Vec::new(),
            source_ports: source_ports.iter().map(|&p| (p, p)).collect(),
            syn: false,
            limit: lim(1, 1),
            syn_cookies: SynCookies::Off,
            syn_rate: None,
            tcp_state: None,
            criticality: limiter::policy::Criticality::Default,
        }],
        ..Policy::default()
    }
}

fn bound(addr: &str) -> (UdpSocket, u16) {
    let s = UdpSocket::bind(addr).unwrap();
    let port = s.local_addr().unwrap().port();
    (s, port)
}

fn connected(local: &str, peer: SocketAddr) -> (UdpSocket, u16) {
    let (s, port) = bound(local);
    s.connect(peer).unwrap();
    (s, port)
}

fn udp4(src: Ipv4Addr, sport: u16, dport: u16) -> Vec<u8> {
    Frame::eth(ETH_P_IP).ipv4(src, IPPROTO_UDP, 0, 0).udp_ports(sport, dport).to_v4(Ipv4Addr::LOCALHOST).bytes
}

fn udp6(sport: u16, dport: u16) -> Vec<u8> {
    Frame::eth(ETH_P_IPV6).ipv6(Ipv6Addr::LOCALHOST, IPPROTO_UDP).udp_ports(sport, dport).to_v6(Ipv6Addr::LOCALHOST).bytes
}

#[test]
fn a_refused_answer_to_a_socket_this_host_connected_passes_and_nothing_else_does() {
    let _alone = limiter_tests::alone(module_path!());
    let peer = Ipv4Addr::new(127, 0, 0, 2);
    // The resolver's ports (held, so that no other socket takes them), a
    // port of no class, and this host's sockets.
    let (_r, resolver) = bound("127.0.0.2:0");
    let (_o, other) = bound("127.0.0.2:0");
    let (_d, plain) = bound("127.0.0.2:0");
    let (_c, client) = connected("127.0.0.1:0", SocketAddr::from((peer, resolver)));
    let (_p, plain_client) = connected("127.0.0.1:0", SocketAddr::from((peer, plain)));
    let (_s, server) = bound("127.0.0.1:0");
    let (_r6, resolver6) = bound("[::1]:0");
    let (_c6, client6) = connected("[::1]:0", SocketAddr::from((Ipv6Addr::LOCALHOST, resolver6)));
    let mut l = kernel::open(&policy(&[resolver, other, resolver6]).compile(1).unwrap());
    let seq = [
        ("the reflection class's burst", udp4(peer, resolver, server), Reason::Admitted),
        ("to a server's unconnected socket: no proof", udp4(peer, resolver, server), Reason::RateLimited),
        ("to the socket connected to it", udp4(peer, resolver, client), Reason::OwnAnswer),
        ("again at once: past its socket's budget (burst 1)", udp4(peer, resolver, client), Reason::RateLimited),
        ("from another port of the class", udp4(peer, other, client), Reason::RateLimited),
        ("from another address of the prefix", udp4(Ipv4Addr::new(127, 0, 0, 3), resolver, client), Reason::RateLimited),
        ("to a port no socket has", udp4(peer, resolver, 9), Reason::RateLimited),
        ("the default class's burst", udp4(peer, plain, plain_client), Reason::Admitted),
        ("the default class does not ask", udp4(peer, plain, plain_client), Reason::RateLimited),
        ("IPv6: the burst", udp6(resolver6, server), Reason::Admitted),
        ("IPv6: to the socket connected to it", udp6(resolver6, client6), Reason::OwnAnswer),
        ("IPv6: to another socket", udp6(resolver6, server), Reason::RateLimited),
    ];
    for (what, f, want) in seq {
        assert_eq!(kernel::reason_at(&mut l, T0, &f), want, "{what}");
    }
    let c = l.maps.class_totals().unwrap();
    // Passed own answers count as passed of their class; they took no
    // credit of the prefix's bucket (the class's next refusal is still a
    // refusal, not a deficit).
    assert_eq!((c[1].admitted.packets, c[1].dropped.packets), (4, 6), "the reflection class's counts");
    // A second later the class's bucket has one packet again: the answers
    // passed beside it spent none of it; and the socket's own budget has
    // one again.
    let later = T0 + 1_000_000_000;
    assert_eq!(kernel::reason_at(&mut l, later, &udp4(peer, resolver, server)), Reason::Admitted);
    assert_eq!(kernel::reason_at(&mut l, later, &udp4(peer, resolver, client)), Reason::OwnAnswer);
    assert_eq!(kernel::reason_at(&mut l, later, &udp4(peer, resolver, client)), Reason::RateLimited);
}

/// Each connected socket has a budget of its own: a flood of answers to
/// one socket (a local user's, connected to the spoofed source) passes
/// only that socket's allowance, and the host's resolver socket beside
/// it keeps its own (O1).
#[test]
fn own_answers_are_held_to_each_sockets_allowance() {
    let _alone = limiter_tests::alone(module_path!());
    let peer = Ipv4Addr::new(127, 0, 0, 2);
    let (_r, resolver) = bound("127.0.0.2:0");
    let (_u, user) = connected("127.0.0.1:0", SocketAddr::from((peer, resolver)));
    let (_h, host) = connected("127.0.0.1:0", SocketAddr::from((peer, resolver)));
    let (_r6, resolver6) = bound("[::1]:0");
    let (_u6, user6) = connected("[::1]:0", SocketAddr::from((Ipv6Addr::LOCALHOST, resolver6)));
    let mut policy = policy(&[resolver, resolver6]);
    policy.classes[0].limit = lim(10, 20);
    let mut l = kernel::open(&policy.compile(1).unwrap());
    let mut got = std::collections::BTreeMap::<&str, (u64, u64)>::new();
    // 1,000 answers at one instant to the user's socket, then 20 to the
    // host's: the class's burst (20) goes to the first, then each socket
    // passes its own burst of 20.
    let frames = [
        ("user", udp4(peer, resolver, user), 1000),
        ("host", udp4(peer, resolver, host), 20),
        ("user (IPv6)", udp6(resolver6, user6), 1000),
    ];
    for (to, frame, n) in frames {
        for _ in 0..n {
            let e = got.entry(to).or_default();
            match kernel::reason_at(&mut l, T0, &frame) {
                Reason::OwnAnswer | Reason::Admitted => e.0 += 1,
                _ => e.1 += 1,
            }
        }
    }
    println!("passed, dropped: {got:?}");
    assert_eq!(got["user"], (40, 960), "the class's burst and the socket's");
    assert_eq!(got["host"], (20, 0), "the resolver's socket keeps its own");
    assert_eq!(got["user (IPv6)"], (40, 960), "the same over IPv6");
}

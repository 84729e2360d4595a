//! Rule classes and shadow mode through the real program (injected clock).

use std::net::Ipv4Addr;

use limiter::{
    dataplane::DataPlane,
    policy::{Class, CostUnit, Limit, Mode, Policy, Protocol, SynCookies},
};
use limiter_common::Reason;
use limiter_tests::{
    kernel::{self, XDP_PASS},
    packet::{ETH_P_IP, Frame, IPPROTO_TCP, IPPROTO_UDP},
};

const T0: u64 = 5_000_000_000_000;
const SYN: u8 = 0x02;
const ACK: u8 = 0x10;

fn lim(rate: u64, burst: u64, mode: Mode) -> Limit {
    Limit { rate, burst, cost: CostUnit::Packets, mode, window: None }
}

fn policy(mode: Mode) -> Policy {
    Policy {
        default: lim(1, 3, mode),
        classes: vec![
            Class {
                name: "https-syn".into(),
                protocol: Protocol::Tcp,
                ports: vec![(443, 443)],
                source_ports: Vec::new(),
                syn: true,
                limit: lim(1, 1, mode),
                syn_cookies: SynCookies::Off,
                syn_rate: None,
                tcp_state: None,
                criticality: limiter::policy::Criticality::Default,
            },
            Class {
                name: "quic".into(),
                protocol: Protocol::Udp,
                ports: vec![(443, 443), (8443, 8443)],
                source_ports: Vec::new(),
                syn: false,
                limit: lim(1, 2, mode),
                syn_cookies: SynCookies::Off,
                syn_rate: None,
                tcp_state: None,
                criticality: limiter::policy::Criticality::Default,
            },
        ],
        ..Policy::default()
    }
}

fn tcp(dport: u16, flags: u8) -> Vec<u8> {
    Frame::eth(ETH_P_IP).ipv4(Ipv4Addr::new(198, 18, 20, 1), IPPROTO_TCP, 0, 0).tcp_to(dport, flags).bytes
}

fn udp(dport: u16) -> Vec<u8> {
    Frame::eth(ETH_P_IP).ipv4(Ipv4Addr::new(198, 18, 20, 1), IPPROTO_UDP, 0, 0).udp_to(dport).bytes
}

fn reason(l: &mut DataPlane, f: &[u8]) -> Reason {
    kernel::reason_at(l, T0, f)
}

#[test]
fn each_class_has_its_own_budget_per_prefix() {
    let _alone = limiter_tests::alone(module_path!());
    let mut l = kernel::open(&policy(Mode::Enforce).compile(1).unwrap());
    let seq: [(&str, Vec<u8>, Reason); 10] = [
        ("syn 443", tcp(443, SYN), Reason::Admitted),
        ("syn 443 again: https-syn burst 1", tcp(443, SYN), Reason::RateLimited),
        ("ack 443 is not a new connection: default", tcp(443, ACK), Reason::Admitted),
        ("syn+ack 443: default", tcp(443, SYN | ACK), Reason::Admitted),
        ("syn 80: default", tcp(80, SYN), Reason::Admitted),
        ("default burst 3 is spent", tcp(22, ACK), Reason::RateLimited),
        ("udp 443: quic", udp(443), Reason::Admitted),
        ("udp 8443: quic", udp(8443), Reason::Admitted),
        ("quic burst 2 is spent", udp(443), Reason::RateLimited),
        ("udp 53: default, still spent", udp(53), Reason::RateLimited),
    ];
    for (what, f, want) in seq {
        assert_eq!(reason(&mut l, &f), want, "{what}");
    }
    // A frame cut short is counted under its reason, in no class.
    let mut cut = tcp(443, SYN);
    cut.truncate(40);
    assert_eq!(reason(&mut l, &cut), Reason::L4Truncated);
    let c = l.maps.class_totals().unwrap();
    let got: Vec<(u64, u64)> = c[..3].iter().map(|x| (x.admitted.packets, x.dropped.packets)).collect();
    assert_eq!(got, vec![(3, 2), (1, 1), (2, 1)], "per-class admitted/dropped");
    assert!(c[3..].iter().all(|x| *x == limiter_common::ClassCounters::default()), "{c:?}");
    // Every class's packets are in the reasons' totals, and the cut one too.
    let t = l.maps.totals().unwrap();
    assert_eq!((t.get(Reason::Admitted).packets, t.get(Reason::RateLimited).packets), (6, 4));
    assert_eq!(t.get(Reason::L4Truncated).packets, 1);
    // Three classes, one prefix: three buckets.
    assert_eq!(l.tracked(), 3);
}

#[test]
fn a_fragment_without_ports_goes_to_the_default_class() {
    let _alone = limiter_tests::alone(module_path!());
    let mut l = kernel::open(&policy(Mode::Enforce).compile(1).unwrap());
    let frag = Frame::eth(ETH_P_IP).ipv4(Ipv4Addr::new(198, 18, 21, 1), IPPROTO_UDP, 0, 0x0010).payload(20).bytes;
    for _ in 0..3 {
        assert_eq!(reason(&mut l, &frag), Reason::Admitted);
    }
    assert_eq!(reason(&mut l, &frag), Reason::RateLimited);
    assert_eq!(l.maps.class_totals().unwrap()[0].admitted.packets, 3);
}

#[test]
fn a_reflection_class_holds_answers_from_its_source_ports_to_their_own_budget() {
    let _alone = limiter_tests::alone(module_path!());
    let mut p = policy(Mode::Enforce);
    p.classes.push(Class {
        name: "reflection".into(),
        protocol: Protocol::Udp,
        ports: Vec::new(),
        source_ports: vec![(53, 53), (123, 123)],
        syn: false,
        limit: lim(1, 2, Mode::Enforce),
        syn_cookies: SynCookies::Off,
        syn_rate: None,
        tcp_state: None,
        criticality: limiter::policy::Criticality::Default,
    });
    let mut l = kernel::open(&p.compile(1).unwrap());
    let from = |sport, dport| {
        Frame::eth(ETH_P_IP).ipv4(Ipv4Addr::new(198, 18, 22, 1), IPPROTO_UDP, 0, 0).udp_ports(sport, dport).bytes
    };
    let seq = [
        ("an NTP answer to a high port: reflection", from(123, 40_000), Reason::Admitted),
        ("a DNS answer to another port: reflection", from(53, 51_000), Reason::Admitted),
        ("reflection burst 2 is spent", from(123, 33_000), Reason::RateLimited),
        ("a query to this host's DNS (to 53): default", from(40_000, 53), Reason::Admitted),
        ("udp from 5353 is no reflection port: default", from(5353, 40_000), Reason::Admitted),
        ("reflection still spent", from(53, 40_000), Reason::RateLimited),
    ];
    for (what, f, want) in seq {
        assert_eq!(reason(&mut l, &f), want, "{what}");
    }
    let c = l.maps.class_totals().unwrap();
    assert_eq!((c[3].admitted.packets, c[3].dropped.packets), (2, 2), "the reflection class's counts");
    assert_eq!((c[0].admitted.packets, c[0].dropped.packets), (2, 0), "the default class's counts");
    // One prefix, two classes: two buckets.
    assert_eq!(l.tracked(), 2);
}

/// A deterministic mix of classes, sources and gaps (xorshift).
fn traffic() -> Vec<(u64, Vec<u8>)> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut t = T0;
    (0..3000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            t += x % 40_000_000; // up to 40 ms apart
            let src = Ipv4Addr::new(198, 18, 30 + u8::try_from((x >> 20) % 4).unwrap(), 9);
            let ip = |proto| Frame::eth(ETH_P_IP).ipv4(src, proto, 0, 0);
            let f = match (x >> 8) % 3 {
                0 => ip(IPPROTO_TCP).tcp_to(443, SYN),
                1 => ip(IPPROTO_UDP).udp_to(443),
                _ => ip(IPPROTO_UDP).udp_to(53),
            };
            (t, f.bytes)
        })
        .collect()
}

#[test]
fn shadow_counts_equal_the_drops_enforce_makes_on_the_same_traffic() {
    let _alone = limiter_tests::alone(module_path!());
    let p = |m| {
        let mut p = policy(m);
        p.default = lim(20, 10, m);
        p.classes[0].limit = lim(5, 3, m);
        p.classes[1].limit = lim(10, 5, m);
        p
    };
    let mut enforce = kernel::open(&p(Mode::Enforce).compile(1).unwrap());
    let mut shadow = kernel::open(&p(Mode::Shadow).compile(1).unwrap());
    let mut dropped = 0;
    for (i, (t, f)) in traffic().iter().enumerate() {
        let (e, _) = kernel::run_at(&mut enforce, *t, f);
        let (s, delta) = kernel::run_at(&mut shadow, *t, f);
        assert_eq!(s, XDP_PASS, "shadow mode dropped packet {i}");
        // Packet by packet: shadow flags exactly what enforce drops.
        let flagged = delta.get(Reason::ShadowDropped).packets == 1;
        assert_eq!(e != XDP_PASS, flagged, "packet {i}");
        dropped += u64::from(flagged);
    }
    let (et, st) = (enforce.maps.totals().unwrap(), shadow.maps.totals().unwrap());
    assert!(dropped > 100, "the traffic should exceed the limits: {dropped}");
    assert_eq!(et.get(Reason::RateLimited).packets, dropped);
    assert_eq!(st.get(Reason::ShadowDropped).packets, dropped);
    assert_eq!(st.get(Reason::RateLimited).packets, 0);
    assert_eq!(et.get(Reason::Admitted).packets, st.get(Reason::Admitted).packets);
    // And class by class.
    let (ec, sc) = (enforce.maps.class_totals().unwrap(), shadow.maps.class_totals().unwrap());
    for k in 0..3 {
        assert_eq!(ec[k].dropped.packets, sc[k].shadow.packets, "class {k}");
        assert_eq!(ec[k].admitted.packets, sc[k].admitted.packets, "class {k}");
    }
}

//! The deny set through the real program (injected clock): networks of
//! any length, IPv4 and IPv6, finer than the bucket prefix or coarser;
//! below an operator's `allow`; a bucket's cached answer moving with each
//! change; a denied network's packets charging nothing; drops counted by
//! origin; and a bucket with finer denied networks never leased.

use std::{
    collections::HashSet,
    net::{Ipv4Addr, Ipv6Addr},
};

use ipnet::IpNet;
use limiter::{
    dataplane::{
        DataPlane,
        deny::{DenySet, OriginId},
    },
    policy::{CostUnit, Limit, Mode, Override, OverrideAction, Policy},
};
use limiter_common::Reason;
use limiter_tests::{
    kernel,
    packet::{ETH_P_IP, ETH_P_IPV6, Frame, IPPROTO_UDP},
};

const T0: u64 = 9_000_000_000_000;

fn udp4(a: [u8; 4]) -> Vec<u8> {
    Frame::eth(ETH_P_IP).ipv4(Ipv4Addr::from(a), IPPROTO_UDP, 0, 0).udp().bytes
}

fn udp6(a: &str) -> Vec<u8> {
    Frame::eth(ETH_P_IPV6).ipv6(a.parse::<Ipv6Addr>().unwrap(), IPPROTO_UDP).udp().bytes
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

/// 3 packets per second, burst 3, per /24 and /64 buckets; `overrides` on top.
fn open(overrides: Vec<Override>) -> DataPlane {
    let p = Policy {
        default: Limit { rate: 3, burst: 3, cost: CostUnit::Packets, mode: Mode::Enforce, window: None },
        v6_prefix: 64,
        overrides,
        ..Policy::default()
    };
    let c = p.compile(1).unwrap();
    let mut l = kernel::open(&c);
    l.maps.apply(&c).unwrap();
    l
}

struct Set {
    s: DenySet,
    o: OriginId,
}

impl Set {
    fn new() -> Self {
        let mut s = DenySet::new(1 << 20, 24, 64);
        let o = s.origin("feed:test").unwrap();
        Self { s, o }
    }

    fn replace(&mut self, l: &mut DataPlane, nets: &[&str]) {
        let nets: HashSet<IpNet> = nets.iter().map(|n| net(n)).collect();
        self.s.replace(self.o, &nets).unwrap();
        l.maps.tables().write_deny(&self.s.finish()).unwrap();
    }
}

fn reasons(l: &mut DataPlane, f: &[u8], n: usize) -> Vec<Reason> {
    (0..n).map(|_| kernel::reason_at(l, T0, f)).collect()
}

#[test]
fn a_denied_address_is_dropped_and_its_neighbours_keep_their_allowance() {
    let _alone = limiter_tests::alone(module_path!());
    kernel::require_root();
    let mut l = open(vec![]);
    let mut set = Set::new();
    // The /24's bucket exists (and has cached "nothing denied") before
    // the /32 inside it is denied.
    assert_eq!(reasons(&mut l, &udp4([198, 18, 5, 1]), 1), vec![Reason::Admitted]);
    set.replace(&mut l, &["198.18.5.7/32", "2001:2:0:1::7/128"]);
    assert_eq!(reasons(&mut l, &udp4([198, 18, 5, 7]), 50), vec![Reason::Denied; 50]);
    // 50 denied packets charged nothing: the /24 has 2 of its 3 left.
    assert_eq!(
        reasons(&mut l, &udp4([198, 18, 5, 2]), 3),
        vec![Reason::Admitted, Reason::Admitted, Reason::RateLimited]
    );
    assert_eq!(reasons(&mut l, &udp6("2001:2:0:1::7"), 5), vec![Reason::Denied; 5]);
    assert_eq!(reasons(&mut l, &udp6("2001:2:0:1::8"), 1), vec![Reason::Admitted]);
    // Lifted: the address is a neighbour like the others again.
    set.replace(&mut l, &[]);
    assert_eq!(reasons(&mut l, &udp6("2001:2:0:1::7"), 1), vec![Reason::Admitted]);
    let hits = l.maps.counters.deny_hits().unwrap();
    assert_eq!(hits[usize::from(set.o.0)], 55, "every drop counted under its origin");
}

#[test]
fn coarse_networks_deny_through_the_cached_resolution_and_lift_with_the_next_change() {
    let _alone = limiter_tests::alone(module_path!());
    kernel::require_root();
    let mut l = open(vec![]);
    let mut set = Set::new();
    assert_eq!(reasons(&mut l, &udp4([198, 18, 9, 1]), 1), vec![Reason::Admitted]);
    assert_eq!(reasons(&mut l, &udp6("2001:2:0:9::1"), 1), vec![Reason::Admitted]);
    set.replace(&mut l, &["198.18.0.0/16", "2001:2::/48"]);
    assert_eq!(reasons(&mut l, &udp4([198, 18, 9, 1]), 3), vec![Reason::Denied; 3], "a bucket made before");
    assert_eq!(reasons(&mut l, &udp4([198, 18, 200, 1]), 3), vec![Reason::Denied; 3], "a new one");
    assert_eq!(reasons(&mut l, &udp6("2001:2:0:9::1"), 3), vec![Reason::Denied; 3]);
    assert_eq!(reasons(&mut l, &udp4([198, 19, 0, 1]), 1), vec![Reason::Admitted], "outside");
    set.replace(&mut l, &["2001:2::/48"]);
    assert_eq!(reasons(&mut l, &udp4([198, 18, 9, 1]), 1), vec![Reason::Admitted]);
    assert_eq!(reasons(&mut l, &udp4([198, 18, 200, 1]), 1), vec![Reason::Admitted]);
    assert_eq!(reasons(&mut l, &udp6("2001:2:0:9::1"), 1), vec![Reason::Denied]);
}

#[test]
fn an_operators_allow_outranks_the_deny_set() {
    let _alone = limiter_tests::alone(module_path!());
    kernel::require_root();
    let allow = Override { net: net("198.18.5.0/24"), action: OverrideAction::Allow, criticality: None };
    let mut l = open(vec![allow]);
    let mut set = Set::new();
    set.replace(&mut l, &["198.18.5.7/32", "198.18.0.0/16"]);
    assert_eq!(reasons(&mut l, &udp4([198, 18, 5, 7]), 3), vec![Reason::Allowed; 3]);
    assert_eq!(reasons(&mut l, &udp4([198, 18, 6, 7]), 1), vec![Reason::Denied]);
}

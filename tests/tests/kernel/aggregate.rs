//! The aggregate tier through the real program (injected clock): a coarser
//! prefix charged together with the fine one, fine first, refunded when
//! the aggregate refuses.

use std::net::Ipv4Addr;

use limiter::policy::{Aggregate, CostUnit, Limit, Mode, Policy};
use limiter_common::{Reason, gcra};
use limiter_tests::{
    kernel,
    packet::{ETH_P_IP, Frame, IPPROTO_UDP},
};

const T0: u64 = 3_000_000_000_000;

fn udp4(a: [u8; 4]) -> Vec<u8> {
    Frame::eth(ETH_P_IP).ipv4(Ipv4Addr::from(a), IPPROTO_UDP, 0, 0).udp().bytes
}

fn open() -> limiter::dataplane::DataPlane {
    let p = Policy {
        default: Limit { rate: 1, burst: 5, cost: CostUnit::Packets, mode: Mode::Enforce, window: None },
        aggregate: Some(Aggregate { rate: 1, burst: 8, v4_prefix: 16, v6_prefix: 40 }),
        ..Policy::default()
    };
    kernel::open(&p.compile(1).unwrap())
}

fn reasons(l: &mut limiter::dataplane::DataPlane, a: [u8; 4], n: usize) -> Vec<Reason> {
    (0..n).map(|_| kernel::reason_at(l, T0, &udp4(a))).collect()
}

fn count(v: &[Reason], r: Reason) -> usize {
    v.iter().filter(|x| **x == r).count()
}

#[test]
fn a_refused_flood_does_not_drain_its_aggregate_and_refused_aggregates_refund() {
    let _alone = limiter_tests::alone(module_path!());
    let mut l = open();
    // One /24 floods: its own bucket (burst 5) refuses the rest before the
    // aggregate is ever charged, so only 5 of the /16's 8 are used.
    let a = reasons(&mut l, [198, 18, 30, 1], 100);
    assert_eq!((count(&a, Reason::Admitted), count(&a, Reason::RateLimited)), (5, 95), "{a:?}");
    // Its neighbour in the same /16 still finds the 3 left.
    assert_eq!(reasons(&mut l, [198, 18, 31, 1], 3), vec![Reason::Admitted; 3]);
    // Now the /16 is spent: the next /24 is refused by the aggregate...
    assert_eq!(reasons(&mut l, [198, 18, 32, 1], 1), vec![Reason::AggregateLimited]);
    // ...and its own bucket got the charge back: still full.
    let key = kernel::v4_key([198, 18, 32, 0], 24);
    assert_eq!(l.bucket(&key).unwrap().unwrap().tat, gcra::to_fixed(T0), "fine charge not refunded");
    // Another /16 is not affected.
    assert_eq!(reasons(&mut l, [198, 19, 0, 1], 5), vec![Reason::Admitted; 5]);
}

#[test]
fn rotating_across_24s_inside_one_16_gets_the_16s_allowance_once() {
    let _alone = limiter_tests::alone(module_path!());
    let mut l = open();
    let got: Vec<Reason> = (0..20u8).flat_map(|i| reasons(&mut l, [198, 18, 40 + i, 7], 1)).collect();
    assert_eq!(count(&got, Reason::Admitted), 8, "{got:?}");
    assert_eq!(count(&got, Reason::AggregateLimited), 12, "{got:?}");
}

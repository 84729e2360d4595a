//! Country and ASN groups through the real program (injected clock): a
//! rate group's budget shared by every prefix of the group, on top of
//! each prefix's own; an `allow` group passing uncharged; a `deny` group
//! dropping, below an operator's `allow`; a shadow group passing what it
//! would drop; the group of a prefix moving when the tries change; and
//! every packet of a group counted once under it.

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use limiter::dataplane::{DataPlane, groups::GroupWrites};
use limiter_common::Reason;
use limiter_tests::{
    kernel,
    packet::{ETH_P_IP, ETH_P_IPV6, Frame, IPPROTO_UDP},
};

const T0: u64 = 9_000_000_000_000;
const MS: u64 = 1_000_000;

fn udp4(a: [u8; 4]) -> Vec<u8> {
    Frame::eth(ETH_P_IP).ipv4(Ipv4Addr::from(a), IPPROTO_UDP, 0, 0).udp().bytes
}

/// Groups 0 (`flooded`, a rate group of 100/s, burst 10), 1 (`allowed`),
/// 2 (`denied`), 3 (`watched`, a shadow rate group of 1/s) and 4
/// (`watched_deny`, a shadow deny group), each prefix 1,000/s (burst
/// 1,000); an operator's `allow` on 198.18.33.0/24; `extra` on top.
fn open(extra: &str) -> DataPlane {
    let group = |name: &str, rest: &str| format!("[[group]]\nname = \"{name}\"\npath = \"/g\"\nasns = [1]\n{rest}\n");
    let text = [
        "rate = 1000\nburst = 1000\nv6_prefix = 64\n[[override]]\ncidr = \"198.18.33.0/24\"\naction = \"allow\"\n"
            .to_owned(),
        group("flooded", "rate = 100\nburst = 10"),
        group("allowed", "action = \"allow\""),
        group("denied", "action = \"deny\""),
        group("watched", "rate = 1\nburst = 1\nshadow = true"),
        group("watched_deny", "action = \"deny\"\nshadow = true"),
        extra.to_owned(),
    ]
    .concat();
    let c = limiter::policy::file::parse("groups.toml", text).unwrap().check().unwrap();
    let mut l = kernel::open(&c);
    l.maps.apply(&c).unwrap();
    write(&mut l, &[("198.19.0.0/16", 0), ("2001:2:10::/48", 0), ("198.18.20.0/24", 1), ("198.18.32.0/23", 2)]);
    write(&mut l, &[("198.18.40.0/24", 3), ("198.18.41.0/24", 4)]);
    l
}

fn write(l: &mut DataPlane, nets: &[(&str, u32)]) {
    let upserts = nets.iter().map(|(n, i)| (n.parse::<IpNet>().unwrap(), *i)).collect();
    l.maps.tables().write_groups(&GroupWrites { upserts, deletes: Vec::new() }).unwrap();
}

fn hits(l: &DataPlane, index: usize) -> (u64, u64) {
    let h = l.maps.counters.group_hits(index + 1).unwrap()[index];
    (h.passed, h.dropped)
}

#[test]
fn a_rate_group_holds_a_flood_spread_over_its_prefixes_to_one_budget() {
    let _alone = limiter_tests::alone(module_path!());
    kernel::require_root();
    let mut l = open("");
    // 1,000 packets in 1 s over 200 /24s of the group (5 each, far inside
    // each prefix's 1,000/s), and IPv6 /64s of it too: ten times its rate.
    let mut admitted = 0;
    for i in 0..1000u64 {
        let now = T0 + i * MS;
        let r = if i % 5 == 4 {
            let a: Ipv6Addr = format!("2001:2:10:{:x}::1", i % 200).parse().unwrap();
            kernel::reason_at(&mut l, now, &Frame::eth(ETH_P_IPV6).ipv6(a, IPPROTO_UDP).udp().bytes)
        } else {
            kernel::reason_at(&mut l, now, &udp4([198, 19, u8::try_from(i % 200).unwrap(), 7]))
        };
        match r {
            Reason::Admitted => admitted += 1,
            Reason::GroupLimited => {}
            r => panic!("packet {i}: {r:?}"),
        }
        // A prefix of no group, in the same second, is never held.
        assert_eq!(kernel::reason_at(&mut l, now, &udp4([198, 18, 6, u8::try_from(i % 250).unwrap()])), Reason::Admitted);
    }
    // Its burst and 0.999 s at its rate: 10 + 99.9.
    assert!((109..=110).contains(&admitted), "{admitted} admitted");
    assert_eq!(hits(&l, 0), (admitted, 1000 - admitted), "every packet counted once under the group");
}

#[test]
fn allow_and_deny_groups_decide_below_the_operator_and_a_shadow_group_only_counts() {
    let _alone = limiter_tests::alone(module_path!());
    kernel::require_root();
    let mut l = open("");
    for i in 0..20u64 {
        let now = T0 + i;
        assert_eq!(kernel::reason_at(&mut l, now, &udp4([198, 18, 20, 1])), Reason::Allowed);
        assert_eq!(kernel::reason_at(&mut l, now, &udp4([198, 18, 32, 1])), Reason::Denied);
        // The operator's `allow` inside the denied group outranks it.
        assert_eq!(kernel::reason_at(&mut l, now, &udp4([198, 18, 33, 1])), Reason::Allowed);
        // The shadow group (1/s, burst 1): its first packet admitted, the
        // rest passed as would-be drops.
        let want = if i == 0 { Reason::Admitted } else { Reason::ShadowDropped };
        assert_eq!(kernel::reason_at(&mut l, now, &udp4([198, 18, 40, 1])), want, "packet {i}");
    }
    assert_eq!(hits(&l, 1), (20, 0));
    assert_eq!(hits(&l, 2), (0, 20));
    assert_eq!(hits(&l, 3), (1, 19));
    // A shadow deny group passes what it would drop, and its prefix's
    // bucket is charged as any: its burst of 1,000, then refused.
    let watched = udp4([198, 18, 41, 1]);
    for i in 0..1000 {
        assert_eq!(kernel::reason_at(&mut l, T0, &watched), Reason::ShadowDropped, "packet {i}");
    }
    assert_eq!(kernel::reason_at(&mut l, T0, &watched), Reason::RateLimited);
    assert_eq!(hits(&l, 4), (0, 1000));
}

#[test]
fn a_prefix_moves_with_the_tries_and_a_group_the_policy_drops_holds_nothing() {
    let _alone = limiter_tests::alone(module_path!());
    kernel::require_root();
    let mut l = open("");
    let a = udp4([198, 18, 20, 1]);
    assert_eq!(kernel::reason_at(&mut l, T0, &a), Reason::Allowed);
    // Its /24 moves to the denied group: the bucket resolves again.
    write(&mut l, &[("198.18.20.0/24", 2)]);
    assert_eq!(kernel::reason_at(&mut l, T0 + 1, &a), Reason::Denied);
    let gone = "198.18.20.0/24".parse().unwrap();
    l.maps.tables().write_groups(&GroupWrites { upserts: Vec::new(), deletes: vec![gone] }).unwrap();
    assert_eq!(kernel::reason_at(&mut l, T0 + 2, &a), Reason::Admitted);
    // A policy whose group 0 is gone: its networks still in the tries
    // (until the daemon takes them out) name no group of this policy.
    let c = limiter::policy::file::parse("p.toml", "rate = 1000\nburst = 1000\n".into()).unwrap().check().unwrap();
    l.maps.apply(&c).unwrap();
    for i in 0..50 {
        assert_eq!(kernel::reason_at(&mut l, T0 + 3 + i, &udp4([198, 19, 1, 1])), Reason::Admitted);
    }
}

/// A group large enough to lease (800/s, burst 500: a lease of 16 ms,
/// 12.8 packets): each CPU takes its lease of the group's budget as a
/// bucket's lease is taken, so a packet admitted from its bucket's lease
/// is charged to the group without touching it; the group still admits
/// no more than its burst at one instant, all CPUs together, and within a
/// lease per CPU of its rate over a second; every packet counted once.
#[test]
fn a_large_group_leases_its_budget_to_each_cpu_and_keeps_its_bound() {
    let _alone = limiter_tests::alone(module_path!());
    kernel::require_root();
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    assert!(cpus >= 2, "this test needs two CPUs; this machine has {cpus}");
    let mut l = open("[[group]]\nname = \"large\"\npath = \"/g\"\nasns = [1]\nrate = 800\nburst = 500\n");
    write(&mut l, &[("198.18.50.0/23", 5)]);
    let (from_50, from_51) = (udp4([198, 18, 50, 1]), udp4([198, 18, 51, 1]));
    let until_refused = |l: &mut DataPlane, f: &[u8]| {
        let mut got = 0u64;
        while kernel::reason_at(l, T0, f) == Reason::Admitted {
            got += 1;
            assert!(got <= 1000, "never refused");
        }
        got
    };
    kernel::pin_to_cpu(0);
    for i in 0..5 {
        assert_eq!(kernel::reason_at(&mut l, T0, &from_50), Reason::Admitted, "packet {i}");
    }
    // CPU 1, at the same instant: the group's burst but what CPU 0 took,
    // and what CPU 0 holds of its lease (at least two packets' worth).
    kernel::pin_to_cpu(1);
    let cpu1_got = until_refused(&mut l, &from_51);
    assert!(cpu1_got <= 500 - 5 - 2, "CPU 1 got {cpu1_got}: CPU 0 held no lease of the group");
    // CPU 0 spends what it holds: no more than the burst in all, and at
    // most a lease's worth short of it.
    kernel::pin_to_cpu(0);
    let cpu0_got = 5 + until_refused(&mut l, &from_50);
    let total = cpu0_got + cpu1_got;
    assert!((500 - 13..=500).contains(&total), "{cpu0_got} + {cpu1_got} admitted at one instant, burst 500");
    let refused = 2;
    assert_eq!(hits(&l, 5), (total, refused), "every packet counted once under the group");
    // A second at 4,000/s, the CPUs taking turns of 50 packets over both
    // prefixes: the group's rate, within a lease per CPU.
    let mut admitted = 0u64;
    for i in 1..=4_000u64 {
        if i % 50 == 1 {
            kernel::pin_to_cpu(usize::try_from(i / 50 % 2).unwrap());
        }
        let f = if i % 3 == 0 { &from_50 } else { &from_51 };
        admitted += u64::from(kernel::reason_at(&mut l, T0 + i * 250_000, f) == Reason::Admitted);
    }
    println!("at one instant: CPU 0 {cpu0_got}, CPU 1 {cpu1_got} of burst 500; then {admitted} in a second at 800/s");
    assert!((800 - 2 * 13..=800 + 2 * 13).contains(&admitted), "{admitted} admitted in a second at 800/s");
    assert_eq!(hits(&l, 5), (total + admitted, refused + 4_000 - admitted));
}

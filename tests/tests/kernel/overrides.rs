//! Per-prefix overrides through the real program (injected clock): LPM
//! tries, most specific prefix wins, allow and deny (a denied prefix's bucket
//! under its own budget), a resolution cached in
//! the bucket and revalidated when the policy version changes, and an apply
//! of 100,000 overrides.

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    time::Instant,
};

use limiter::{
    dataplane::DataPlane,
    policy::{Class, CostUnit, Limit, Mode, Override, OverrideAction, Policy, Protocol, SynCookies},
};
use limiter_common::Reason;
use limiter_tests::{
    kernel,
    packet::{ETH_P_IP, ETH_P_IPV6, Frame, IPPROTO_TCP, IPPROTO_UDP},
};

const T0: u64 = 9_000_000_000_000;

fn lim(rate: u64, burst: u64) -> Limit {
    Limit { rate, burst, cost: CostUnit::Packets, mode: Mode::Enforce, window: None }
}

fn ovr(cidr: &str, action: OverrideAction) -> Override {
    Override { net: cidr.parse().unwrap(), action, criticality: None }
}

fn udp4(a: [u8; 4]) -> Vec<u8> {
    Frame::eth(ETH_P_IP).ipv4(Ipv4Addr::from(a), IPPROTO_UDP, 0, 0).udp().bytes
}

fn syn4(a: [u8; 4]) -> Vec<u8> {
    Frame::eth(ETH_P_IP).ipv4(Ipv4Addr::from(a), IPPROTO_TCP, 0, 0).tcp_to(443, 0x02).bytes
}

fn udp6(a: &str) -> Vec<u8> {
    Frame::eth(ETH_P_IPV6).ipv6(a.parse::<Ipv6Addr>().unwrap(), IPPROTO_UDP).udp().bytes
}

fn open(p: &Policy, version: u64) -> DataPlane {
    let mut l = kernel::open(&p.compile(version).unwrap());
    l.maps.apply(&p.compile(version).unwrap()).unwrap();
    l
}

fn reasons(l: &mut DataPlane, f: &[u8], n: usize) -> Vec<Reason> {
    reasons_at(l, T0, f, n)
}

fn reasons_at(l: &mut DataPlane, now: u64, f: &[u8], n: usize) -> Vec<Reason> {
    (0..n).map(|_| kernel::reason_at(l, now, f)).collect()
}

fn policy() -> Policy {
    Policy {
        default: lim(1, 1),
        classes: vec![Class {
            name: "syn".into(),
            protocol: Protocol::Tcp,
            ports: vec![(443, 443)],
            source_ports: Vec::new(),
            syn: true,
            limit: lim(1, 2),
            syn_cookies: SynCookies::Off,
            syn_rate: None,
            tcp_state: None,
            criticality: limiter::policy::Criticality::Default,
        }],
        overrides: vec![
            ovr("198.18.0.0/16", OverrideAction::Limit(lim(1, 3))),
            ovr("198.18.5.0/24", OverrideAction::Allow),
            ovr("198.18.6.0/24", OverrideAction::Deny),
            ovr("2001:2::/48", OverrideAction::Limit(lim(1, 2))),
            ovr("2001:2:0:300::/56", OverrideAction::Deny),
        ],
        ..Policy::default()
    }
}

#[test]
fn most_specific_override_wins() {
    let _alone = limiter_tests::alone(module_path!());
    use Reason::{Admitted as A, Allowed, Denied, RateLimited as X};
    let mut l = open(&policy(), 1);
    let cases: [(&str, Vec<u8>, Vec<Reason>); 8] = [
        ("198.18.7.1: /16 limit, burst 3", udp4([198, 18, 7, 1]), vec![A, A, A, X]),
        ("198.18.5.1: /24 allow beats /16", udp4([198, 18, 5, 1]), vec![Allowed; 6]),
        ("198.18.6.1: /24 deny beats /16", udp4([198, 18, 6, 1]), vec![Denied; 3]),
        ("198.19.0.1: no override, default burst 1", udp4([198, 19, 0, 1]), vec![A, X]),
        ("198.18.7.9 syn: class limits, not the /16's", syn4([198, 18, 7, 9]), vec![A, A, X]),
        ("198.18.6.9 syn: deny covers every class", syn4([198, 18, 6, 9]), vec![Denied; 2]),
        ("2001:2:0:100::1: /48 limit, burst 2", udp6("2001:2:0:100::1"), vec![A, A, X]),
        ("2001:2:0:3ff::1: /56 deny beats /48", udp6("2001:2:0:3ff::1"), vec![Denied; 2]),
    ];
    for (what, f, want) in cases {
        assert_eq!(reasons(&mut l, &f, want.len()), want, "{what}");
    }
    let c = l.maps.class_totals().unwrap();
    assert_eq!((c[1].admitted.packets, c[1].dropped.packets), (2, 3), "syn class: 2 admitted, 1 limited + 2 denied");
}

#[test]
fn a_cached_resolution_is_revalidated_when_the_version_changes() {
    let _alone = limiter_tests::alone(module_path!());
    // Version 1 without the /24 deny: the prefix falls under the /16.
    let mut p = policy();
    p.overrides.retain(|o| o.net.to_string() != "198.18.6.0/24");
    let mut l = open(&p, 1);
    let f = udp4([198, 18, 6, 1]);
    assert_eq!(reasons(&mut l, &f, 4), vec![Reason::Admitted, Reason::Admitted, Reason::Admitted, Reason::RateLimited]);
    // The bucket caches version 1's answer.
    let key = kernel::v4_key([198, 18, 6, 0], 24);
    let cached = l.bucket(&key).unwrap().expect("a bucket caches the resolution").resolved;
    assert_eq!(cached >> 32, 1);
    assert_ne!(u32::try_from(cached & 0xffff_ffff).unwrap(), limiter_common::resolution::DENY);
    // Version 2 adds the deny: the same bucket now resolves to it.
    let p2 = policy();
    l.maps.apply(&p2.compile(2).unwrap()).unwrap();
    assert_eq!(reasons(&mut l, &f, 2), vec![Reason::Denied, Reason::Denied]);
    let cached = l.bucket(&key).unwrap().unwrap().resolved;
    assert_eq!(cached >> 32, 2);
    assert_eq!(u32::try_from(cached & 0xffff_ffff).unwrap(), limiter_common::resolution::DENY);
    // Version 3 drops it again, reusing the slot version 1 used; the bucket
    // kept its charge (exhausted above), so the next packet is refused.
    l.maps.apply(&p.compile(3).unwrap()).unwrap();
    assert_eq!(reasons(&mut l, &f, 1), vec![Reason::RateLimited]);
    assert_eq!(l.bucket(&key).unwrap().unwrap().resolved >> 32, 3);
}

/// A spoofed flood across a denied range leaves at most its own
/// budget's worth of buckets (the new-source budget's rate, its own
/// state), so it can neither evict the buckets of real senders faster
/// than that nor spend the new-source budget real senders need.
#[test]
fn denied_ranges_create_buckets_only_within_their_own_budget() {
    let _alone = limiter_tests::alone(module_path!());
    // Buckets per address (/32) and per /64, so a denied /16 or /56 holds
    // many of them.
    let p = Policy {
        default: lim(1, 1),
        overrides: vec![
            ovr("198.19.0.0/16", OverrideAction::Deny),
            ovr("2001:2:0:300::/56", OverrideAction::Deny),
            ovr("198.18.5.0/24", OverrideAction::Allow),
        ],
        new_sources: Some((10, 5)),
        v4_prefix: 32,
        v6_prefix: 64,
        ..Policy::default()
    };
    let mut l = open(&p, 1);
    for i in 0..200u8 {
        assert_eq!(reasons(&mut l, &udp4([198, 19, i, 1]), 1), vec![Reason::Denied]);
        assert_eq!(reasons(&mut l, &udp6(&format!("2001:2:0:3{i:02x}::1")), 1), vec![Reason::Denied]);
    }
    assert_eq!(l.tracked(), 5, "denied prefixes' buckets beyond the deny budget's burst");
    // The new-source budget is whole: five new senders get their bucket.
    for i in 0..5u8 {
        assert_eq!(reasons(&mut l, &udp4([198, 18, 7, i]), 1), vec![Reason::Admitted], "sender {i}");
    }
    assert_eq!(reasons(&mut l, &udp4([198, 18, 7, 9]), 1), vec![Reason::NewSourceLimited]);
    assert_eq!(l.tracked(), 10);
    // A denied prefix with a bucket is dropped through it: same answer.
    assert_eq!(reasons(&mut l, &udp4([198, 19, 0, 1]), 3), vec![Reason::Denied; 3]);
}

/// Spoofed sources inside an allowed range all pass, but get buckets only
/// as fast as the new-source budget allows.
#[test]
fn allowed_ranges_create_buckets_within_the_new_source_budget() {
    let _alone = limiter_tests::alone(module_path!());
    let p = Policy {
        default: lim(1, 1),
        overrides: vec![ovr("198.19.0.0/16", OverrideAction::Allow)],
        new_sources: Some((10, 5)),
        v4_prefix: 32,
        ..Policy::default()
    };
    let mut l = open(&p, 1);
    for i in 0..200u8 {
        assert_eq!(reasons(&mut l, &udp4([198, 19, i, 1]), 1), vec![Reason::Allowed]);
    }
    assert_eq!(l.tracked(), 5, "buckets beyond the budget's burst");
    // A source that got a bucket keeps passing through it.
    assert_eq!(reasons(&mut l, &udp4([198, 19, 0, 1]), 3), vec![Reason::Allowed; 3]);
}

#[test]
fn one_hundred_thousand_overrides_apply_whole() {
    let _alone = limiter_tests::alone(module_path!());
    // Data only: these prefixes live in trie entries, no packet is sent.
    let count = 100_000u32;
    let make = |burst: u64| -> Policy {
        let overrides = (0..count)
            .map(|i| {
                let [_, a, b, c] = (i + (10 << 16)).to_be_bytes();
                ovr(&format!("{a}.{b}.{c}.0/24"), OverrideAction::Limit(lim(1, burst)))
            })
            .collect();
        Policy { overrides, default: lim(1, 1), ..Policy::default() }
    };
    let mut lim_map = kernel::open(&make(2).compile(1).unwrap());
    for (version, burst) in [(1u64, 2u64), (2, 3), (3, 4)] {
        let p = make(burst);
        let compiled = p.compile(version).unwrap();
        let start = Instant::now();
        lim_map.maps.apply(&compiled).unwrap();
        println!("applied {count} overrides as v{version} in {:.3} s", start.elapsed().as_secs_f64());
        // Spot checks across the range: each /24 has its own override burst.
        for i in [0, 1, 4_999, 65_535, 65_536, count - 1] {
            let [_, a, b, c] = (i + (10 << 16)).to_be_bytes();
            let src = [a, b, c, 7];
            // An hour later per version: every bucket has refilled.
            let now = T0 + version * 3_600_000_000_000;
            let got = reasons_at(&mut lim_map, now, &udp4(src), usize::try_from(burst).unwrap() + 1);
            let admitted = got.iter().filter(|r| **r == Reason::Admitted).count();
            assert_eq!(admitted, usize::try_from(burst).unwrap(), "v{version} {src:?}: {got:?}");
        }
    }
}

/// The daemon counts tracked prefixes in batches of 4,096 map entries:
/// over several batches, and again after the LRU evicted some, the count
/// is the number of prefixes that got a bucket and what a walk of the
/// map's keys finds.
#[test]
fn tracked_prefixes_are_counted_across_batches() {
    let _alone = limiter_tests::alone(module_path!());
    const CAPACITY: u32 = 16_384;
    let p =
        Policy { default: lim(1000, 1000), new_sources: None, v4_prefix: 32, capacity: CAPACITY, ..Policy::default() };
    let mut l = kernel::open_with_capacity(&p.compile(1).unwrap(), CAPACITY);
    assert_eq!(l.tracked(), 0);
    let mut sent = 0u32;
    for n in [1u32, 4_095, 4_097, 10_001] {
        while sent < n {
            let [_, _, c, d] = sent.to_be_bytes();
            assert_eq!(reasons(&mut l, &udp4([198, 19, c, d]), 1), vec![Reason::Admitted]);
            sent += 1;
        }
        assert_eq!((l.tracked(), l.tracked_by_walk()), (n as usize, n as usize), "after {n} sources");
    }
    // Past capacity the LRU evicts: whatever it kept, both counts agree.
    for i in 0..CAPACITY {
        let [_, _, c, d] = i.to_be_bytes();
        let _ = reasons(&mut l, &udp4([198, 20, c, d]), 1);
    }
    let (batched, walked) = (l.tracked(), l.tracked_by_walk());
    assert_eq!(batched, walked);
    assert!(batched > 10_001 && batched <= CAPACITY as usize, "{batched}");
}

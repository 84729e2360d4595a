use limiter_common::mode;

use super::*;
use crate::policy::{Class, Protocol, tests::https_syn};

fn ovr(cidr: &str, action: OverrideAction) -> Policy {
    Policy { overrides: vec![Override { net: cidr.parse().unwrap(), action, criticality: None }], ..Policy::default() }
}

#[test]
fn overrides_compile_to_trie_entries_and_limits() {
    let lim = Limit { rate: 10, burst: 20, cost: CostUnit::Packets, mode: Mode::Enforce, window: None };
    let p = Policy {
        overrides: vec![
            Override { net: "198.18.0.0/16".parse().unwrap(), action: OverrideAction::Limit(lim), criticality: None },
            Override { net: "198.18.5.0/24".parse().unwrap(), action: OverrideAction::Allow, criticality: None },
            Override { net: "2001:2::/48".parse().unwrap(), action: OverrideAction::Deny, criticality: None },
        ],
        ..Policy::default()
    };
    let c = p.compile(1).unwrap().overrides;
    assert_eq!(
        c.v4,
        vec![(16, u32::from_ne_bytes([198, 18, 0, 0]), 1), (24, u32::from_ne_bytes([198, 18, 5, 0]), u32::MAX)]
    );
    assert_eq!(c.v6.len(), 1);
    assert_eq!(c.v6[0].2, u32::MAX - 1);
    assert_eq!(c.limits, vec![lim.to_kernel("").unwrap()]);
    let dup = Policy { overrides: vec![p.overrides[1], p.overrides[1]], ..Policy::default() };
    assert!(dup.compile(1).unwrap_err().problem.contains("twice"));
}

#[test]
fn default_policy_is_valid() {
    let c = Policy::default().compile(1).unwrap().config;
    // 1 ms per packet and 2 s of burst, in 1/16 ns.
    assert_eq!(c.classes[0].unit, 16_000_000);
    assert_eq!(c.classes[0].tau, 32_000_000_000);
    // The default class judges out-of-state TCP (`auto`).
    let state = limiter_common::tcp_state::bits(0, limiter_common::tcp_state::mode::AUTO);
    assert_eq!((c.version, c.n_matchers, c.flags), (1, 0, flags::CONFIGURED | state));
}

#[test]
fn classes_compile_to_one_matcher_per_port_range() {
    let p = Policy { classes: vec![https_syn()], ..Policy::default() };
    let c = p.compile(7).unwrap().config;
    assert_eq!(c.n_matchers, 2);
    assert_eq!((c.matchers[0].port_lo, c.matchers[1].port_lo), (443, 8443));
    assert!(c.matchers[..2].iter().all(|m| m.class == 1 && m.syn == 1 && m.proto == 6));
    assert_eq!(c.classes[1].mode, mode::SHADOW);
    assert_eq!(p.class_names(), ["default", "https-syn"]);
}

#[test]
fn each_bad_field_is_named() {
    let d = Policy::default();
    let lim = d.default;
    let with_class = |f: fn(&mut Class)| {
        let mut c = https_syn();
        f(&mut c);
        Policy { classes: vec![c], ..d.clone() }
    };
    let cases = [
        (Policy { default: Limit { rate: 0, ..lim }, ..d.clone() }, "rate"),
        (Policy { default: Limit { burst: 0, ..lim }, ..d.clone() }, "burst"),
        (Policy { default: Limit { cost: CostUnit::Bytes, burst: 1000, ..lim }, ..d.clone() }, "burst"),
        (Policy { default: Limit { burst: u64::MAX / 2, ..lim }, ..d.clone() }, "burst"),
        (Policy { v4_prefix: 33, ..d.clone() }, "v4_prefix"),
        (Policy { v6_prefix: 65, ..d.clone() }, "v6_prefix"),
        (Policy { capacity: 0, ..d.clone() }, "capacity"),
        (Policy { capacity: u32::MAX, ..d.clone() }, "capacity"),
        (with_class(|c| c.limit.rate = 0), "class[0].rate"),
        (with_class(|c| c.protocol = Protocol::Udp), "class[0].syn"),
        (with_class(|c| c.name.clear()), "class[0].name"),
        (with_class(|c| c.ports = vec![(9, 3)]), "class[0].ports"),
        (with_class(|c| c.ports = (1..=17).map(|p| (p, p)).collect()), "class[0].ports"),
        (Policy { classes: vec![https_syn(); 8], ..d.clone() }, "class"),
        (Policy { classes: vec![https_syn(), https_syn()], ..d }, "class[1].name"),
        (ovr("198.18.5.1/24", OverrideAction::Allow), "override[0].cidr"),
        (ovr("198.18.5.0/25", OverrideAction::Allow), "override[0].cidr"),
        (ovr("2001:2::/64", OverrideAction::Deny), "override[0].cidr"),
        (ovr("198.18.0.0/16", OverrideAction::Limit(Limit { rate: 0, ..lim })), "override[0].rate"),
    ];
    for (p, field) in cases {
        assert_eq!(p.compile(1).unwrap_err().field, field, "{p:?}");
    }
}

#[test]
fn a_reflection_class_compiles_to_source_port_matchers() {
    let reflection = Class {
        name: "reflection".into(),
        protocol: Protocol::Udp,
        ports: Vec::new(),
        source_ports: vec![(53, 53), (123, 123)],
        syn: false,
        ..https_syn()
    };
    let p = Policy { classes: vec![https_syn(), reflection], ..Policy::default() };
    let c = p.compile(1).unwrap().config;
    assert_eq!(c.n_matchers, 4);
    let sides: Vec<_> = c.matchers[..4].iter().map(|m| (m.class, m.side, m.port_lo)).collect();
    assert_eq!(
        sides,
        [
            (1, port_side::DESTINATION, 443),
            (1, port_side::DESTINATION, 8443),
            (2, port_side::SOURCE, 53),
            (2, port_side::SOURCE, 123)
        ]
    );
    assert!(c.matchers[2..4].iter().all(|m| m.proto == 17 && m.syn == 0));
    // Class 2 (UDP, source ports) asks the host's sockets; class 1 not.
    assert_eq!(c.flags >> flags::ANSWERS_SHIFT & 0xff, 1 << 2);
    let with = |f: fn(&mut Class)| {
        let mut c = Class {
            protocol: Protocol::Udp,
            syn: false,
            ports: Vec::new(),
            source_ports: vec![(53, 53)],
            ..https_syn()
        };
        f(&mut c);
        Policy { classes: vec![c], ..Policy::default() }
    };
    for (p, field, says) in [
        (with(|c| c.ports = vec![(443, 443)]), "class[0].source_ports", "not both"),
        (with(|c| c.protocol = Protocol::Any), "class[0].source_ports", "protocol"),
        (with(|c| c.source_ports = vec![(9, 3)]), "class[0].source_ports", "empty"),
        (with(|c| c.source_ports = (1..=17).map(|p| (p, p)).collect()), "class[0].source_ports", "more than"),
    ] {
        let e = p.compile(1).unwrap_err();
        assert_eq!(e.field, field, "{p:?}");
        assert!(e.problem.contains(says), "{}", e.problem);
    }
}

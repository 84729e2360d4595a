//! parse(render(p)) = p over generated policies: every field the model
//! holds is written and read back, whatever its value.

use std::{net::SocketAddr, time::Duration};

use proptest::{collection::vec, option, prelude::*};

use super::render;
use crate::policy::{
    Aggregate, Class, CostUnit, Criticality, Limit, Mode, Override, OverrideAction, Policy, Protocol, Scope,
    StoreFailure, SynCookies, Window,
    feedback::{Escalate, Feedback},
    file::parse,
    fleet::Fleet,
    forward::{Balance, Copy, Forward, ProxyProtocol},
};

fn mode() -> impl Strategy<Value = Mode> {
    prop_oneof![Just(Mode::Enforce), Just(Mode::Shadow)]
}

fn cost() -> impl Strategy<Value = CostUnit> {
    prop_oneof![Just(CostUnit::Packets), Just(CostUnit::Bytes)]
}

/// Durations as the file spells them: whole milliseconds.
fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        (0u64..100_000).prop_map(Duration::from_millis),
        (1u64..10_000).prop_map(Duration::from_secs),
        (1u64..100).prop_map(|h| Duration::from_secs(h * 3600)),
    ]
}

fn window() -> impl Strategy<Value = Window> {
    let scope = prop_oneof![Just(Scope::Local), Just(Scope::Fleet)];
    let failure = prop_oneof![Just(StoreFailure::Split), Just(StoreFailure::Open)];
    (1u64..1 << 40, duration(), 2u32..64, scope, failure).prop_map(|(limit, length, slices, scope, f)| Window {
        limit,
        length,
        slices,
        scope,
        // Given only for a fleet's window; otherwise the default is read.
        on_store_failure: if scope == Scope::Fleet { f } else { StoreFailure::default() },
    })
}

/// A bucket's or a window quota's limits (a window has no rate or burst).
fn limit(cost: impl Strategy<Value = CostUnit>) -> impl Strategy<Value = Limit> {
    (1u64..1 << 40, 1u64..1 << 40, cost, mode(), option::of(window())).prop_map(|(rate, burst, cost, mode, window)| {
        let (rate, burst) = if window.is_some() { (0, 0) } else { (rate, burst) };
        Limit { rate, burst, cost, mode, window }
    })
}

fn class() -> impl Strategy<Value = Class> {
    let protocol = prop_oneof![
        Just(Protocol::Any),
        Just(Protocol::Tcp),
        Just(Protocol::Udp),
        Just(Protocol::Icmp),
        Just(Protocol::Icmpv6)
    ];
    let ports = vec((1u16..=u16::MAX, 0u16..100), 0..4)
        .prop_map(|v| v.into_iter().map(|(lo, n)| (lo, lo.saturating_add(n))).collect::<Vec<_>>());
    let cookies = prop_oneof![Just(SynCookies::Off), Just(SynCookies::Auto), Just(SynCookies::Always)];
    // Any printable name: quotes, backslashes and non-ASCII are escaped.
    let rest = (cookies, option::of(1u64..1 << 32), criticality(), any::<bool>(), option::of(tcp_state()));
    ("\\PC{1,16}", protocol, ports, any::<bool>(), limit(cost()), rest).prop_map(
        // The ranges are of the destination or (a reflection class) of
        // the source port.
        |(name, protocol, ports, syn, limit, (syn_cookies, syn_rate, criticality, source, tcp_state))| Class {
            name,
            protocol,
            ports: if source { Vec::new() } else { ports.clone() },
            source_ports: if source { ports } else { Vec::new() },
            syn,
            limit,
            syn_cookies,
            syn_rate,
            tcp_state,
            criticality,
        },
    )
}

fn tcp_state() -> impl Strategy<Value = crate::policy::TcpState> {
    use crate::policy::TcpState;
    prop_oneof![Just(TcpState::Off), Just(TcpState::Auto), Just(TcpState::Always)]
}

fn criticality() -> impl Strategy<Value = Criticality> {
    prop_oneof![Just(Criticality::Critical), Just(Criticality::Default), Just(Criticality::Sheddable)]
}

fn net() -> impl Strategy<Value = ipnet::IpNet> {
    prop_oneof![
        (any::<[u8; 4]>(), 0u8..=32).prop_map(|(a, l)| ipnet::Ipv4Net::new(a.into(), l).unwrap().trunc().into()),
        (any::<[u8; 16]>(), 0u8..=128).prop_map(|(a, l)| ipnet::Ipv6Net::new(a.into(), l).unwrap().trunc().into()),
    ]
}

/// An override's limits are in the default class's cost unit.
fn overrides(cost: CostUnit) -> impl Strategy<Value = Vec<Override>> {
    let action = prop_oneof![
        Just(OverrideAction::Allow),
        Just(OverrideAction::Deny),
        limit(Just(cost)).prop_map(OverrideAction::Limit)
    ];
    vec(
        (net(), action, option::of(criticality())).prop_map(|(net, action, criticality)| Override {
            net,
            action,
            criticality,
        }),
        0..6,
    )
}

fn addr() -> impl Strategy<Value = SocketAddr> {
    prop_oneof![
        (any::<[u8; 4]>(), 1u16..).prop_map(|(a, p)| SocketAddr::from((a, p))),
        (any::<[u16; 8]>(), 1u16..).prop_map(|(a, p)| SocketAddr::from((a, p))),
    ]
}

fn forward() -> impl Strategy<Value = Forward> {
    let modes = (
        prop_oneof![Just(Balance::RoundRobin), Just(Balance::LeastConnections)],
        prop_oneof![Just(ProxyProtocol::V1), Just(ProxyProtocol::V2), Just(ProxyProtocol::Off)],
        prop_oneof![Just(Copy::Splice), Just(Copy::Buffer)],
    );
    let caps = (1usize..100_000, 0usize..1000, duration(), duration(), duration());
    let adaptive = (prop_oneof![Just(0.0), Just(1.5), Just(2.0), Just(3.25)], duration());
    ("[a-z][a-z0-9-]{0,12}", vec(addr(), 1..3), vec(addr(), 1..3), modes, caps, adaptive).prop_map(
        |(
            name,
            listen,
            backends,
            (balance, proxy_protocol, copy),
            (max, per_prefix, connect, idle, drain),
            (k, window),
        )| Forward {
            name,
            listen,
            backends,
            balance,
            proxy_protocol,
            max_connections: max,
            max_connections_per_prefix: per_prefix,
            connect_timeout: connect,
            idle_timeout: idle,
            drain_timeout: drain,
            copy,
            adaptive_k: crate::policy::forward::Ratio(k),
            adaptive_window: window,
            critical_reserve: crate::policy::forward::Ratio(0.25),
            sheddable_share: crate::policy::forward::Ratio(0.5),
        },
    )
}

fn feedback() -> impl Strategy<Value = Feedback> {
    let escalate = (1u64..1 << 32, duration(), duration(), 1usize..10_000, 0u8..=32, 0u8..=128).prop_map(
        |(d, s, f, m, v4, v6)| Escalate {
            drops_per_sec: d,
            sustained: s,
            deny_for: f,
            max_denied: m,
            deny_v4_prefix: v4,
            deny_v6_prefix: v6,
        },
    );
    let limits = (1usize..100_000, 0u8..=32, 0u8..=128, duration(), any::<bool>(), any::<bool>());
    (addr(), "/[a-z/]{1,20}", limits, option::of(escalate)).prop_map(
        |(listen, token, (max_denied, v4, v6, max_ttl, shadow, may), escalate)| Feedback {
            listen,
            token_file: token.into(),
            max_denied,
            min_v4_prefix: v4,
            min_v6_prefix: v6,
            max_ttl,
            shadow,
            may_override_allow: may,
            escalate,
        },
    )
}

fn feed() -> impl Strategy<Value = crate::policy::feed::Feed> {
    use crate::policy::{Action, feed::Format};
    let format = prop_oneof![Just(Format::Plain), Just(Format::Ipsum), Just(Format::SpamhausJson)];
    let shrink = prop_oneof![Just(0.0), Just(0.25), Just(0.5), Just(1.0)];
    let limits = (1usize..2_000_000, 0u8..=32, 0u8..=128, any::<bool>(), any::<bool>());
    ("[a-z_]{1,12}", "/[a-z/]{1,20}", format, duration(), shrink, limits, option::of(1u32..10)).prop_map(
        |(name, path, format, refresh, max_shrink, (max_networks, v4, v6, bogons, shadow), min_count)| {
            crate::policy::feed::Feed {
                name,
                path: path.into(),
                min_count: min_count.filter(|_| format == Format::Ipsum),
                format,
                refresh,
                max_shrink,
                allow_bogons: bogons,
                action: Action::Deny,
                max_networks,
                min_v4_prefix: v4,
                min_v6_prefix: v6,
                shadow,
            }
        },
    )
}

fn tunnel() -> impl Strategy<Value = crate::tunnel::section::Tunnel> {
    use crate::tunnel::section::{BackendSpec, Encapsulation, Health, Otherwise, Ports, TooBig, Transport, Tunnel};
    (1u16..1000, 0u16..10, 1u32..=100, any::<bool>(), any::<bool>(), 1u8..=255, 1u32..=5).prop_map(
        |(port, more, weight, gue, drain, ttl, fall)| Tunnel {
            name: format!("t{port}"),
            address: "198.18.0.2".parse().expect("addr"),
            protocol: if gue { Transport::Udp } else { Transport::Tcp },
            ports: if more == 0 { Ports::One(port) } else { Ports::Text(format!("{port}-{}", port + more)) },
            encapsulation: if gue { Encapsulation::Gue } else { Encapsulation::Ipip },
            encapsulation_port: gue.then_some(5555),
            source: "198.18.1.1".parse().expect("addr"),
            ttl,
            too_big: if drain { TooBig::Pass } else { TooBig::Icmp },
            no_backend: Otherwise::Drop,
            backends: vec![BackendSpec { address: "198.18.2.2".parse().expect("addr"), weight, drain }],
            health: Health { fall, ..Health::default() },
        },
    )
}

fn group() -> impl Strategy<Value = crate::groups::section::Group> {
    use crate::policy::Action;
    let action = prop_oneof![Just(Action::Rate), Just(Action::Allow), Just(Action::Deny)];
    let members = (vec("[A-Z]{2}", 0..3), vec(any::<u32>(), 0..3));
    let flags = (any::<bool>(), any::<bool>(), option::of(1u64..1 << 32), option::of(1u64..1 << 32));
    let guards = (0u8..=32, 0u8..=128, 0u32..=100, 0u32..=400, 0u32..=100);
    ("[a-z_]{1,12}", "/[a-z/]{1,20}", members, action, duration(), flags, guards).prop_map(
        |(name, path, (countries, asns), action, refresh, (allow_bogons, shadow, rate, burst), (v4, v6, c, g, s))| {
            crate::groups::section::Group {
                min_v4_prefix: v4,
                min_v6_prefix: v6,
                max_coverage: f64::from(c) / 100.0,
                max_growth: f64::from(g) / 100.0,
                max_shrink: f64::from(s) / 100.0,
                name,
                path: path.into(),
                countries,
                asns,
                action,
                rate,
                burst,
                refresh,
                allow_bogons,
                shadow,
            }
        },
    )
}

/// Store addresses without a password: `render` hides one (tested apart).
fn fleet() -> impl Strategy<Value = Fleet> {
    let store = vec("redis://[a-z0-9.]{1,12}:[0-9]{1,5}", 1..4);
    (store, "\\PC{1,16}", 1u32..64, duration(), duration(), option::of("/[a-z/]{1,20}")).prop_map(
        |(store, node, nodes, sync_interval, timeout, pw)| Fleet {
            store,
            node,
            nodes,
            sync_interval,
            timeout,
            password_file: pw.map(Into::into),
        },
    )
}

fn policy() -> impl Strategy<Value = Policy> {
    let default = (1u64..1 << 40, 1u64..1 << 40, cost(), mode()).prop_map(|(rate, burst, cost, mode)| Limit {
        rate,
        burst,
        cost,
        mode,
        window: None,
    });
    let tiers = (
        option::of((1u64..1 << 32, 1u64..1 << 32)),
        option::of((1u64..1 << 32, 1u64..1 << 32, 0u32..=32, 0u32..=128)),
        (0u32..=32, 0u32..=128, 1u32..1 << 24, any::<bool>(), any::<bool>(), tcp_state()),
    );
    let services = (
        vec(forward(), 0..3),
        option::of(feedback()),
        option::of(fleet()),
        option::of(feed()),
        vec(group(), 0..3),
        vec(tunnel(), 0..2),
    );
    (default, vec(class(), 0..7), tiers, services)
        .prop_flat_map(|(default, classes, tiers, services)| {
            overrides(default.cost)
                .prop_map(move |overrides| (default, classes.clone(), overrides, tiers, services.clone()))
        })
        .prop_map(
            |(
                default,
                classes,
                overrides,
                (new_sources, aggregate, prefixes),
                (forwards, feedback, fleet, feed, groups, tunnels),
            )| {
                let (v4_prefix, v6_prefix, capacity, allow_shrink, run_without, tcp_state) = prefixes;
                Policy {
                    default,
                    classes,
                    overrides,
                    new_sources,
                    aggregate: aggregate.map(|(rate, burst, v4_prefix, v6_prefix)| Aggregate {
                        rate,
                        burst,
                        v4_prefix,
                        v6_prefix,
                    }),
                    v4_prefix,
                    v6_prefix,
                    capacity,
                    forwards,
                    tunnels,
                    feedback,
                    feeds: feed.into_iter().collect(),
                    groups,
                    sources: Vec::new(),
                    crowdsec: None,
                    fleet,
                    upstream: None,
                    attacks: crate::policy::attacks::Attacks::default(),
                    allow_shrink,
                    missing_kernel_feature: if run_without {
                        crate::policy::kernel::MissingFeature::RunWithout
                    } else {
                        crate::policy::kernel::MissingFeature::Refuse
                    },
                    tcp_state,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_rendered_policy_reads_back_the_same(p in policy()) {
        let text = render(&p);
        let again = parse("rendered", text.clone()).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?.policy;
        prop_assert_eq!(again, p, "{}", text);
    }
}

#[test]
fn a_store_password_is_hidden() {
    let p = Policy {
        fleet: Some(Fleet {
            store: vec!["redis://edge:s3cret@198.18.0.9:6379".into()],
            node: "n".into(),
            nodes: 2,
            sync_interval: Duration::from_millis(200),
            timeout: Duration::from_millis(100),
            password_file: None,
        }),
        ..Policy::default()
    };
    let text = render(&p);
    assert!(!text.contains("s3cret") && text.contains("redis://edge:***@198.18.0.9:6379"), "{text}");
}

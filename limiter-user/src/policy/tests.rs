use super::*;

/// serde (the file) and clap (the command line) derive their names from
/// the same variants; they must agree, and codes must round-trip.
#[test]
fn each_enum_has_one_spelling_and_round_trips_through_its_code() {
    fn check<T: ValueEnum + Serialize + std::fmt::Debug>() {
        for v in T::value_variants() {
            let serde = serde_json::to_value(v).unwrap();
            assert_eq!(serde.as_str(), Some(name_of(v).as_str()), "{v:?}");
        }
    }
    check::<CostUnit>();
    check::<Mode>();
    check::<Protocol>();
    for c in CostUnit::value_variants() {
        assert_eq!(CostUnit::try_from(u32::from(*c)), Ok(*c));
    }
    for m in Mode::value_variants() {
        assert_eq!(Mode::try_from(u32::from(*m)), Ok(*m));
    }
    assert_eq!(Mode::try_from(7), Err(7));
    assert_eq!(Protocol::Icmpv6.to_string(), "icmpv6");
    assert_eq!(u8::from(Protocol::Udp), 17);
}

#[test]
fn the_summary_names_every_part() {
    let p =
        Policy { aggregate: Some(Aggregate { rate: 4, burst: 8, v4_prefix: 16, v6_prefix: 40 }), ..Policy::default() };
    let s = p.summary(3).to_string();
    assert!(s.starts_with("policy v3: rate 1000 packets/s burst 2000 per IPv4 /24 and IPv6 /56 (enforce)"), "{s}");
    assert!(s.contains("; new sources 5000/s burst 10000; aggregate /16 and /40: rate 4 burst 8"), "{s}");
    assert_eq!(p.summary(3).body(), s.trim_start_matches("policy v3: "));
}

/// A shadow-mode class of TCP SYNs to 443 and 8443 (also used by the
/// SYN cookie compilation's tests).
pub(crate) fn https_syn() -> Class {
    Class {
        name: "https-syn".into(),
        protocol: Protocol::Tcp,
        ports: vec![(443, 443), (8443, 8443)],
        source_ports: Vec::new(),
        syn: true,
        limit: Limit { rate: 20, burst: 40, cost: CostUnit::Packets, mode: Mode::Shadow, window: None },
        syn_cookies: SynCookies::Off,
        syn_rate: None,
        tcp_state: None,
        criticality: crate::policy::Criticality::Default,
    }
}

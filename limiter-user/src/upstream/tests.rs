use super::*;

fn spec(toml_text: &str) -> Upstream {
    let text = format!("[upstream]\nspeaker = \"/run/exabgp/t\"\n{toml_text}");
    let p = crate::policy::file::parse("t.toml", text).unwrap();
    *p.policy.upstream.unwrap()
}

fn op(net: &str, expires: u64) -> Rule {
    Rule { key: Key::flow(net.parse().unwrap()), action: Action::Discard, by: Origin::Operator, since: 0, expires }
}

/// Nothing touching a protected network (either way round), nothing
/// wider than the widths, nothing past the cap; a blackhole only when
/// allowed and only by the operator.
#[test]
fn the_policy_bounds_what_is_announced() {
    let mut b = Book::new(
        spec("max_rules = 2\nnever = [\"198.18.10.0/24\"]\nmin_v4_prefix = 24\n"),
        vec!["198.18.20.5/32".parse().unwrap()],
    );
    assert!(matches!(b.add(op("198.18.10.0/25", 9)), Err(Refusal::Protected { .. })));
    assert!(matches!(b.add(op("198.18.20.0/24", 9)), Err(Refusal::Protected { .. })));
    assert!(matches!(b.add(op("198.18.0.0/16", 9)), Err(Refusal::TooWide { min: 24, .. })));
    assert_eq!(b.add(op("198.18.30.0/24", 9)), Ok(true));
    assert_eq!(b.add(op("198.18.31.0/24", 9)), Ok(true));
    // At the cap, the refusal says what holds it.
    let e = b.add(op("198.18.32.0/24", 9)).unwrap_err();
    assert_eq!(e, Refusal::Cap { wanted: 2, operator: 2, escalation: 0, pressure: 0, announced: 0, pending: 0 });
    assert!(e.to_string().contains("2 the operator's, 0 escalation's, 0 link pressure's"), "{e}");
    let mut bh = op("198.18.90.1/32", 9);
    bh.key = Key::blackhole("198.18.90.1/32".parse().unwrap());
    assert!(matches!(b.add(bh.clone()), Err(Refusal::NotAllowed(..))));
    let mut b = Book::new(spec("rtbh = true\nnever = [\"198.18.90.0/24\"]\n"), Vec::new());
    assert_eq!(b.add(bh.clone()), Ok(true), "the host's own network may be blackholed by the operator");
    bh.by = Origin::Escalation;
    bh.key.net = "198.18.90.2/32".parse().unwrap();
    assert!(matches!(b.add(bh), Err(Refusal::NotAllowed(..))));
    assert_eq!(b.refused.values().sum::<u64>(), 1);
}

/// `admits` says what `add` would do, every time, and changes nothing
/// (`prefix deny --upstream` asks it before the deny is applied).
#[test]
fn admits_says_what_add_would_do() {
    let mut b = Book::new(
        spec("max_rules = 3\nnever = [\"198.18.10.0/24\"]\nmin_v4_prefix = 24\nlink_capacity = 1000\n"),
        Vec::new(),
    );
    let by = |net: &str, by: Origin| Rule { by, ..op(net, 9) };
    let asks = [
        by("198.18.10.0/24", Origin::Operator),
        by("198.18.0.0/16", Origin::Operator),
        by("198.18.30.0/24", Origin::Pressure),
        by("198.18.31.0/24", Origin::Pressure),
        by("198.18.30.0/24", Origin::Escalation),
        by("198.18.32.0/24", Origin::Escalation),
        by("198.18.30.0/24", Origin::Pressure),
        by("198.18.33.0/24", Origin::Operator),
        by("198.18.34.0/24", Origin::Operator),
        by("198.18.35.0/24", Origin::Operator),
        by("198.18.36.0/24", Origin::Operator),
        by("198.18.36.0/24", Origin::Operator),
    ];
    let (mut taken, mut refused) = (0, 0);
    for r in asks {
        let before: Vec<Rule> = b.rules().cloned().collect();
        let said = b.admits(&r);
        assert_eq!(b.rules().cloned().collect::<Vec<_>>(), before, "admits changed the book");
        let done = b.add(r.clone());
        assert_eq!(said.is_ok(), done.is_ok(), "{r:?}: admits {said:?}, add {done:?}");
        if let (Err(a), Err(d)) = (&said, &done) {
            assert_eq!(a.label(), d.label(), "{r:?}");
        }
        if done.is_ok() { taken += 1 } else { refused += 1 }
    }
    assert!(taken >= 5 && refused >= 4, "taken {taken}, refused {refused}");
}

/// Automation never replaces the operator's rule; the operator's replaces
/// automation's; the same rule asked again lives on, never shorter.
#[test]
fn the_operator_outranks_automation() {
    let mut b = Book::new(spec(""), Vec::new());
    let mut auto = op("198.18.30.0/24", 50);
    auto.by = Origin::Pressure;
    auto.action = Action::RateLimit { bytes_per_sec: 100 };
    assert_eq!(b.add(auto.clone()), Ok(true));
    assert_eq!(b.add(op("198.18.30.0/24", 40)), Ok(true));
    assert!(matches!(b.add(auto), Err(Refusal::Outranked { .. })));
    assert_eq!(b.rules().next().unwrap().by, Origin::Operator);
    assert_eq!(b.add(op("198.18.30.0/24", 30)), Ok(false));
    assert_eq!(b.rules().next().unwrap().expires, 40);
    assert!(!b.expire(39));
    assert!(b.expire(40));
    assert_eq!(b.rules().count(), 0);
}

/// Pressure rules come only after pressure held for `pressure_sustained`,
/// rate-limited to what is admitted, the top N, and go `hold_down` after
/// the pressure ends.
#[test]
fn link_pressure_announces_the_top_droppers_and_lets_them_go() {
    let mut b = Book::new(
        spec(
            "link_capacity = 1000000\npressure_percent = 50\npressure_sustained = \"3s\"\nhold_down = \"5s\"\npressure_prefixes = 2\n",
        ),
        vec!["198.18.3.0/24".parse().unwrap()],
    );
    let dropping: Vec<(Key, u64)> = ["198.18.3.0/24", "198.18.1.0/24", "198.18.2.0/24", "198.18.4.0/24"]
        .iter()
        .map(|n| (Key::flow(n.parse().unwrap()), 1500))
        .collect();
    assert!(!b.second(100, 499_999, &dropping));
    for t in 101..104 {
        assert!(!b.second(t, 600_000, &dropping), "not sustained at {t}");
    }
    assert!(b.second(104, 600_000, &dropping));
    let nets: Vec<String> = b.rules().map(|r| r.key.net.to_string()).collect();
    // The protected /24 is left out; the next two of the top are taken.
    assert_eq!(nets, ["198.18.1.0/24"], "top 2 of the list are .3 (protected) and .1");
    assert!(b.rules().all(|r| r.action == Action::RateLimit { bytes_per_sec: 1500 } && r.by == Origin::Pressure));
    assert!(!b.second(105, 100, &dropping));
    assert!(!b.expire(108));
    assert!(b.expire(109));
}

fn pressure(net: &str, expires: u64) -> Rule {
    Rule {
        key: Key::flow(net.parse().unwrap()),
        action: Action::RateLimit { bytes_per_sec: 1500 },
        by: Origin::Pressure,
        since: 0,
        expires,
    }
}

/// Link pressure never crowds the operator out (U1): it holds at most
/// its share of the cap, and at the cap the operator's rule lets the
/// lowest automation rule go (escalation's a pressure one's); the cap
/// refuses the operator only when the operator's own rules fill it.
#[test]
fn the_operator_always_has_room_under_automation() {
    let mut b = Book::new(spec("max_rules = 8\n"), Vec::new());
    assert_eq!(pressure_cap(8), 6);
    for i in 0..6 {
        assert_eq!(b.add(pressure(&format!("198.18.{i}.0/24"), 100 + i)), Ok(true));
    }
    assert_eq!(b.add(pressure("198.18.6.0/24", 99)), Err(Refusal::PressureCap(6)));
    let mut esc = op("198.18.20.0/24", 50);
    esc.by = Origin::Escalation;
    assert_eq!(b.add(esc.clone()), Ok(true));
    esc.key = Key::flow("198.18.21.0/24".parse().unwrap());
    assert_eq!(b.add(esc.clone()), Ok(true));
    assert_eq!(b.rules().count(), 8);
    // At the cap: the operator's rule takes the place of the pressure
    // rule that ends first.
    assert_eq!(b.add(op("198.18.30.0/24", 9)), Ok(true));
    assert!(b.rules().all(|r| r.key.net.to_string() != "198.18.0.0/24"), "the first to end is let go");
    assert_eq!(b.by_trigger(), [(Origin::Operator, 1), (Origin::Escalation, 2), (Origin::Pressure, 5)]);
    // A new escalation takes a pressure rule's place; pressure takes none.
    esc.key = Key::flow("198.18.22.0/24".parse().unwrap());
    assert_eq!(b.add(esc), Ok(true));
    assert!(matches!(b.add(pressure("198.18.7.0/24", 500)), Err(Refusal::Cap { .. })));
    for i in 31..38 {
        assert_eq!(b.add(op(&format!("198.18.{i}.0/24"), 9)), Ok(true), "198.18.{i}.0/24");
    }
    assert_eq!(b.by_trigger(), [(Origin::Operator, 8), (Origin::Escalation, 0), (Origin::Pressure, 0)]);
    b.sent = (5, 3);
    let e = b.add(op("198.18.40.0/24", 9)).unwrap_err();
    assert!(e.to_string().contains("8 the operator's") && e.to_string().contains("5 announced, 3 pending"), "{e}");
    // A smaller cap keeps the operator's rules first.
    let mut b = Book::new(spec("max_rules = 4\n"), Vec::new());
    for i in 0..3 {
        assert_eq!(b.add(pressure(&format!("198.18.{i}.0/24"), 100)), Ok(true));
    }
    assert_eq!(b.add(op("198.18.30.0/24", 9)), Ok(true));
    b.set(spec("max_rules = 2\n"), Vec::new());
    assert_eq!(b.by_trigger(), [(Origin::Operator, 1), (Origin::Escalation, 0), (Origin::Pressure, 1)]);
}

/// A destination of the other family (U7) and a rate past what ExaBGP
/// sends (L3) are refused, never listed as announced.
#[test]
fn a_rule_the_speaker_would_change_is_refused() {
    let mut b = Book::new(spec(""), Vec::new());
    let mut r = op("198.51.100.0/24", 9);
    r.key.dest = Some("2001:db8::1/128".parse().unwrap());
    assert!(matches!(b.add(r.clone()), Err(Refusal::Family { .. })));
    r.key.dest = Some("192.0.2.1/32".parse().unwrap());
    r.action = Action::RateLimit { bytes_per_sec: u64::MAX };
    assert_eq!(b.add(r.clone()), Err(Refusal::Rate(u64::MAX)));
    r.action = Action::RateLimit { bytes_per_sec: MAX_RATE };
    assert_eq!(b.add(r), Ok(true));
}

/// A rule asked for at any fraction of a second ends no sooner than its
/// TTL when its end is checked against whole seconds (L5).
#[test]
fn a_ttl_is_never_cut_short_by_whole_seconds() {
    let before = crate::clock::since_epoch();
    let end = expiry_from_now(5);
    // Withdrawn at the first whole second `s` with `s >= end`.
    assert!(std::time::Duration::from_secs(end) >= before + std::time::Duration::from_secs(5));
    assert!(end <= before.as_secs() + 6);
}

/// Automation may use three quarters of the change budget, at least one.
#[test]
fn automation_leaves_the_operator_part_of_the_change_budget() {
    use super::speaker::automation_budget;
    assert_eq!([1, 3, 4, 30, 600].map(automation_budget), [1, 2, 3, 22, 450]);
}

use super::*;

fn spec(toml_text: &str) -> Upstream {
    let text = format!("[upstream]\nspeaker = \"/run/exabgp/t\"\n{toml_text}");
    let p = crate::policy::file::parse("t.toml", text).unwrap();
    *p.policy.upstream.unwrap()
}

fn op(net: &str, expires: u64) -> Rule {
    Rule { key: Key::flow(net.parse().unwrap()), action: Action::Discard, by: Trigger::Operator, since: 0, expires }
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
    assert_eq!(b.add(op("198.18.32.0/24", 9)), Err(Refusal::Cap(2)));
    let mut bh = op("198.18.90.1/32", 9);
    bh.key = Key::blackhole("198.18.90.1/32".parse().unwrap());
    assert!(matches!(b.add(bh.clone()), Err(Refusal::NotAllowed(..))));
    let mut b = Book::new(spec("rtbh = true\nnever = [\"198.18.90.0/24\"]\n"), Vec::new());
    assert_eq!(b.add(bh.clone()), Ok(true), "the host's own network may be blackholed by the operator");
    bh.by = Trigger::Escalation;
    bh.key.net = "198.18.90.2/32".parse().unwrap();
    assert!(matches!(b.add(bh), Err(Refusal::NotAllowed(..))));
    assert_eq!(b.refused.values().sum::<u64>(), 1);
}

/// Automation never replaces the operator's rule; the operator's replaces
/// automation's; the same rule asked again lives on, never shorter.
#[test]
fn the_operator_outranks_automation() {
    let mut b = Book::new(spec(""), Vec::new());
    let mut auto = op("198.18.30.0/24", 50);
    auto.by = Trigger::Pressure;
    auto.action = Action::RateLimit { bytes_per_sec: 100 };
    assert_eq!(b.add(auto.clone()), Ok(true));
    assert_eq!(b.add(op("198.18.30.0/24", 40)), Ok(true));
    assert!(matches!(b.add(auto), Err(Refusal::Outranked { .. })));
    assert_eq!(b.rules().next().unwrap().by, Trigger::Operator);
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
    let dropping: Vec<(IpNet, u64)> = ["198.18.3.0/24", "198.18.1.0/24", "198.18.2.0/24", "198.18.4.0/24"]
        .iter()
        .map(|n| (n.parse().unwrap(), 1500))
        .collect();
    assert!(!b.second(100, 499_999, &dropping));
    for t in 101..104 {
        assert!(!b.second(t, 600_000, &dropping), "not sustained at {t}");
    }
    assert!(b.second(104, 600_000, &dropping));
    let nets: Vec<String> = b.rules().map(|r| r.key.net.to_string()).collect();
    // The protected /24 is left out; the next two of the top are taken.
    assert_eq!(nets, ["198.18.1.0/24"], "top 2 of the list are .3 (protected) and .1");
    assert!(b.rules().all(|r| r.action == Action::RateLimit { bytes_per_sec: 1500 } && r.by == Trigger::Pressure));
    assert!(!b.second(105, 100, &dropping));
    assert!(!b.expire(108));
    assert!(b.expire(109));
}

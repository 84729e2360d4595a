use std::time::Duration;

use super::*;
use crate::{crowdsec::Pull, dataplane::FakeMaps, engine::Enforcer};

fn spec(extra: &str) -> Crowdsec {
    let cap = if extra.contains("allow_bogons") { 1000 } else { 3 };
    let text =
        format!("[crowdsec]\nlapi_url = \"http://127.0.0.1:1\"\napi_key_file = \"/k\"\nmax_decisions = {cap}\n{extra}");
    let text = if extra.contains("allow_bogons") { text } else { text + "allow_bogons = true\n" };
    crate::policy::file::parse("t", text).unwrap().policy.crowdsec.unwrap()
}

fn d(id: i64, origin: &str, net: &str, ttl: u64) -> Decision {
    Decision::new(id, origin, "crowdsecurity/ssh-bf", "ban", net.parse().unwrap(), Duration::from_secs(ttl))
}

/// `d` of another scenario.
fn of_scenario(scenario: &str, d: &Decision) -> Decision {
    Decision::new(d.id, d.origin(), scenario, d.kind(), d.net, d.ttl)
}

fn pulled(startup: bool, new: Vec<Decision>, deleted: Vec<Decision>) -> Pulled {
    Pulled { startup, pull: Pull { new, deleted, ..Pull::default() }, ..Pulled::default() }
}

/// M1 of the third hardening round: a decision banning the LAPI's
/// own address cut the daemon off its LAPI (and so off the deletion
/// that would lift it). Decisions covering it are left out.
#[test]
fn the_lapis_own_address_is_never_denied() {
    let (mut e, mut m, s) = (Enforcer::new(0, 1024), FakeMaps::default(), spec(""));
    let new = vec![
        d(1, "cscli", "127.0.0.1/32", 3600),
        d(2, "lists", "127.0.0.0/8", 3600),
        d(3, "cscli", "198.51.100.7/32", 3600),
    ];
    e.deny_mut().pull(&mut m, &s, pulled(true, new, vec![])).unwrap();
    assert_eq!(e.deny_layer().crowdsec().len(), 1, "only the decision not covering the LAPI");
    assert_eq!(e.deny_layer().crowdsec().left_out, 2);
    assert_eq!(lapi_address("http://[2001:db8::5]:8080"), Some("2001:db8::5".parse().unwrap()));
    assert_eq!(lapi_address("http://lapi.example:8080"), None);
}

#[test]
fn a_deleted_decision_lifts_only_what_it_applied() {
    let (mut e, mut m, s) = (Enforcer::new(0, 1024), FakeMaps::default(), spec(""));
    let a = vec![d(1, "cscli", "198.51.100.7/32", 3600), d(2, "crowdsec", "198.51.100.7/32", 3600)];
    e.deny_mut().pull(&mut m, &s, pulled(true, a, vec![])).unwrap();
    assert_eq!(e.deny_layer().crowdsec().len(), 2, "two origins deny the address");
    e.deny_mut().pull(&mut m, &s, pulled(false, vec![], vec![d(1, "cscli", "198.51.100.7/32", 0)])).unwrap();
    let key = crate::dataplane::deny::key_of(&"198.51.100.7/32".parse().unwrap());
    assert!(m.deny.get(&key).is_some_and(|v| v & limiter_common::deny::DENIED != 0), "crowdsec's still stands");
    e.deny_mut().pull(&mut m, &s, pulled(false, vec![], vec![d(2, "crowdsec", "198.51.100.7/32", 0)])).unwrap();
    assert!(!m.deny.contains_key(&key));
}

#[test]
fn decisions_end_with_their_duration_and_startup_replaces_the_picture() {
    let (mut e, mut m, s) = (Enforcer::new(0, 1024), FakeMaps::default(), spec(""));
    e.deny_mut().pull(&mut m, &s, pulled(true, vec![d(1, "cscli", "198.51.100.7/32", 5)], vec![])).unwrap();
    let end = e.deny_layer().crowdsec().next_end().unwrap();
    assert!(e.deny_mut().expire(&mut m, end - 1).is_none());
    assert!(e.deny_mut().expire(&mut m, end).unwrap().unwrap().contains("1 network(s) lifted"));
    assert!(m.deny.is_empty());
    e.deny_mut().pull(&mut m, &s, pulled(true, vec![d(2, "cscli", "203.0.113.0/24", 60)], vec![])).unwrap();
    e.deny_mut().pull(&mut m, &s, pulled(true, vec![d(3, "lists", "192.0.2.9/32", 60)], vec![])).unwrap();
    assert_eq!(e.deny_layer().crowdsec().len(), 1, "a startup pull is the whole picture");
    assert!(m.deny_origins.iter().any(|n| n.starts_with("crowdsec:lists:")));
}

#[test]
fn a_restarted_daemon_lifts_what_was_deleted_while_it_was_down() {
    let (mut e, mut m, s) = (Enforcer::new(0, 1024), FakeMaps::default(), spec(""));
    let two = vec![d(1, "cscli", "198.51.100.7/32", 3600), d(2, "cscli", "203.0.113.0/24", 3600)];
    e.deny_mut().pull(&mut m, &s, pulled(true, two, vec![])).unwrap();
    // A new daemon: the set read back from the pins, no decisions known.
    let mut e = Enforcer::new(0, 1024);
    e.restore(&mut m).unwrap();
    let line =
        e.deny_mut().pull(&mut m, &s, pulled(true, vec![d(2, "cscli", "203.0.113.0/24", 3000)], vec![])).unwrap();
    assert!(line.contains("0 networks denied, 1 lifted"), "{line}");
    let key = |n: &str| crate::dataplane::deny::key_of(&n.parse().unwrap());
    assert!(!m.deny.contains_key(&key("198.51.100.7/32")), "deleted while down, still denied");
    assert!(m.deny.contains_key(&key("203.0.113.0/24")));
}

#[test]
fn the_cap_width_filters_and_shadow_hold() {
    let (mut e, mut m) = (Enforcer::new(0, 1024), FakeMaps::default());
    let s = spec("origins = [\"cscli\"]\n");
    let new = vec![
        d(1, "cscli", "198.51.100.1/32", 60),
        d(2, "cscli", "10.0.0.0/7", 60),
        d(3, "CAPI", "198.51.100.3/32", 60),
        d(4, "cscli", "198.51.100.4/32", 60),
        d(5, "cscli", "198.51.100.5/32", 60),
        d(6, "cscli", "198.51.100.6/32", 60),
    ];
    let line = e.deny_mut().pull(&mut m, &s, pulled(true, new, vec![])).unwrap();
    assert!(line.contains("3 networks denied") && line.contains("3 left out"), "{line}");
    assert_eq!(e.deny_layer().crowdsec().left_out, 3, "too wide, another origin, past the cap");
    let (mut e, mut m) = (Enforcer::new(0, 1024), FakeMaps::default());
    let line = e
        .deny_mut()
        .pull(&mut m, &spec("shadow = true\n"), pulled(true, vec![d(1, "cscli", "198.51.100.1/32", 60)], vec![]))
        .unwrap();
    assert!(line.contains("shadow: 1 counted"), "{line}");
    assert!(m.deny.is_empty());
}

/// A LAPI's 256 /8s would deny all of IPv4 (10/8, 127.0.0.1, 0.0.0.0
/// and 255.255.255.255 with them). Special-purpose space is left out, and the IPv4 space CrowdSec's
/// networks cover together is capped.
#[test]
fn special_purpose_space_is_left_out_and_the_covered_space_capped() {
    let (mut e, mut m) = (Enforcer::new(0, 1024), FakeMaps::default());
    let s = spec("allow_bogons = false\n");
    let eights: Vec<Decision> = (0..=255u8).map(|i| d(i64::from(i), "lists", &format!("{i}.0.0.0/8"), 3600)).collect();
    let line = e.deny_mut().pull(&mut m, &s, pulled(true, eights, vec![])).unwrap();
    println!("{line}");
    let covered = e.deny_layer().crowdsec().v4_addresses;
    assert!(covered <= s.max_v4_addresses, "{covered} addresses covered");
    assert!(e.deny_layer().crowdsec().len() <= 1, "{line}");
    let denied = |e: &Enforcer, a: &str| {
        let a: std::net::IpAddr = a.parse().unwrap();
        e.deny_layer().crowdsec().by_net.keys().any(|(n, _)| n.contains(&a))
    };
    for a in ["10.1.2.3", "127.0.0.1", "0.0.0.0", "255.255.255.255", "192.168.1.1", "100.64.0.1"] {
        assert!(!denied(&e, a), "{a} is denied");
    }
    // Public /32s are taken as ever.
    let line = e
        .deny_mut()
        .pull(
            &mut m,
            &s,
            pulled(true, vec![d(900, "cscli", "8.8.4.4/32", 60), d(901, "cscli", "10.0.0.1/32", 60)], vec![]),
        )
        .unwrap();
    assert!(line.contains("1 networks denied") || e.deny_layer().crowdsec().len() == 1, "{line}");
    assert!(denied(&e, "8.8.4.4") && !denied(&e, "10.0.0.1"));
}

/// Decisions of 80 list scenarios take at most
/// `CROWDSEC_ORIGINS` indexes (the rest share one), a deletion takes
/// none, and a feed still gets its own.
#[test]
fn crowdsec_sources_share_bounded_origins_and_leave_feeds_room() {
    let (mut e, mut m, s) = (Enforcer::new(0, 1024), FakeMaps::default(), spec("allow_bogons = true\n"));
    let lists: Vec<Decision> = (0..80u8)
        .map(|i| of_scenario(&format!("list-{i}"), &d(i64::from(i), "lists", &format!("198.51.100.{i}/32"), 600)))
        .collect();
    e.deny_mut().pull(&mut m, &s, pulled(true, lists.clone(), vec![])).unwrap();
    let names = e.deny.set.names().iter().filter(|n| n.starts_with("crowdsec:")).count();
    assert_eq!(names, CROWDSEC_ORIGINS);
    assert_eq!(e.deny_layer().crowdsec().len(), 80, "every decision is in force");
    // Deleting a decision of a shared source lifts it, naming nothing.
    let gone = vec![lists[70].clone(), of_scenario("never-seen", &d(999, "lists", "198.51.100.200/32", 0))];
    e.deny_mut().pull(&mut m, &s, pulled(false, vec![], gone)).unwrap();
    assert_eq!(e.deny_layer().crowdsec().len(), 79);
    assert!(e.deny.set.named("crowdsec:lists:never-seen").is_none());
    let feed: crate::policy::feed::Feed =
        crate::policy::file::parse("p", "[[feed]]\nname = \"ops\"\npath = \"/f\"\nallow_bogons = true\n".into())
            .unwrap()
            .policy
            .feeds[0]
            .clone();
    let nets = std::iter::once("203.0.113.9/32".parse().unwrap()).collect();
    e.deny_mut().feed(&mut m, &feed, &nets).unwrap();
    assert!(e.deny.set.named("feed:ops").is_some());
}

/// Decisions of 60 IPv6 prefix lengths would take all 40 of the set's,
/// and the operator's feed with a /64 and a /48 would then be refused.
/// CrowdSec brings at most `CROWDSEC_V6_LENS` into use (the
/// rest are left out and counted; lengths in use still fit), and a feed
/// of 16 new lengths is taken.
#[test]
fn crowdsec_keeps_within_its_ipv6_length_budget_and_feeds_keep_room() {
    let (mut e, mut m, s) = (Enforcer::new(0, 1024), FakeMaps::default(), spec("allow_bogons = true\n"));
    let ranges: Vec<Decision> = (0..60i64).map(|i| d(i, "cscli", &format!("2001:db8::/{}", 65 + i), 600)).collect();
    e.deny_mut().pull(&mut m, &s, pulled(true, ranges, vec![])).unwrap();
    assert_eq!(e.deny_layer().crowdsec().len(), CROWDSEC_V6_LENS);
    assert_eq!(e.deny_layer().crowdsec().left_out, 60 - CROWDSEC_V6_LENS as u64);
    // A decision of a length in use still fits.
    e.deny_mut().pull(&mut m, &s, pulled(false, vec![d(100, "cscli", "2001:db8:1::/65", 600)], vec![])).unwrap();
    assert_eq!(e.deny_layer().crowdsec().len(), CROWDSEC_V6_LENS + 1);
    let feed: crate::policy::feed::Feed = crate::policy::file::parse(
        "p",
        "[[feed]]\nname = \"ops\"\npath = \"/f\"\nallow_bogons = true\nmin_v6_prefix = 16\n".into(),
    )
    .unwrap()
    .policy
    .feeds[0]
        .clone();
    // A /64, a /48 and 14 lengths more: 16 lengths none of CrowdSec's used.
    let lens = [64u8, 48].into_iter().chain(34..48);
    let nets = lens.map(|l| format!("2001:db8:2::/{l}").parse::<IpNet>().unwrap().trunc()).collect();
    let line = e.deny_mut().feed(&mut m, &feed, &nets).unwrap();
    assert!(line.contains("16 networks"), "{line}");
}

/// A pull is applied in parts (an operator's change waits
/// for one part at most). A startup pull in parts keeps every network
/// denied until its last part (no gap), then lifts what it no longer
/// names; its line comes with the last part, with the whole pull's counts.
#[test]
fn a_startup_pull_in_parts_leaves_no_gap_and_lifts_at_its_end() {
    let (mut e, mut m, s) = (Enforcer::new(0, 1024), FakeMaps::default(), spec("allow_bogons = true\n"));
    let one = || d(1, "cscli", "198.51.100.1/32", 600);
    let two = || d(2, "cscli", "198.51.100.2/32", 600);
    let three = || d(3, "cscli", "198.51.100.3/32", 600);
    e.deny_mut().pull(&mut m, &s, pulled(true, vec![one(), two()], vec![])).unwrap();
    let key = |n: &str| crate::dataplane::deny::key_of(&n.parse().unwrap());
    let parts =
        Pulled { startup: true, pull: Pull { new: vec![three(), one()], ..Pull::default() }, ..Pulled::default() }
            .parts(1);
    let mut lines = Vec::new();
    for (i, p) in parts.into_iter().enumerate() {
        lines.push(e.deny_mut().pull(&mut m, &s, p).unwrap());
        if i == 0 {
            for n in ["198.51.100.1/32", "198.51.100.2/32", "198.51.100.3/32"] {
                assert!(m.deny.contains_key(&key(n)), "{n} not denied between the parts");
            }
        }
    }
    assert_eq!(lines[0], "", "a part says nothing");
    assert!(
        lines[1].contains("startup pull: 2 new") && lines[1].contains("1 networks denied, 1 lifted"),
        "{}",
        lines[1]
    );
    assert!(!m.deny.contains_key(&key("198.51.100.2/32")), "what the startup pull no longer names is lifted");
    assert_eq!(e.deny_layer().crowdsec().len(), 2);
}

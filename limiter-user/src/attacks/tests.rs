use std::time::Duration;

use limiter_common::{BucketKey, Counter, Reason, family};

use super::*;

fn settings() -> Settings {
    Settings {
        drops_per_sec: 1_000,
        bits_per_sec: 1_000_000_000,
        sustain: Duration::from_secs(3),
        quiet: Duration::from_secs(5),
        ..Settings::default()
    }
}

/// A second with `dropped` rate-limited packets of 100 bytes and 10
/// admitted ones.
fn second(dropped: u64) -> Totals {
    let mut t = Totals::default();
    t.add(Reason::RateLimited, family::IPV4, Counter { packets: dropped, bytes: dropped * 100 });
    t.add(Reason::Admitted, family::IPV4, Counter { packets: 10, bytes: 1_000 });
    t
}

fn names() -> Vec<String> {
    vec!["default".into(), "web".into()]
}

fn key(third: u8, class: u8) -> BucketKey {
    BucketKey {
        family: family::IPV4,
        prefix_len: 24,
        class,
        pad: 0,
        addr: [u32::from_ne_bytes([198, 18, third, 0]), 0],
    }
}

#[test]
fn a_run_shorter_than_sustain_is_no_attack_and_one_that_lasts_starts_one() {
    let mut d = Detector::new(settings(), 7);
    assert_eq!(d.second(100, &second(5_000), &names()), None);
    assert_eq!(d.second(101, &second(5_000), &names()), None);
    assert_eq!(d.second(102, &second(10), &names()), None, "broken before sustain");
    assert!(d.active(&names()).is_none());
    assert_eq!(d.second(103, &second(5_000), &names()), None);
    assert_eq!(d.second(104, &second(6_000), &names()), None);
    let Some(Event::Started(a)) = d.second(105, &second(5_000), &names()) else { panic!("no start") };
    assert_eq!((a.id, a.started, a.trigger.as_str(), a.peak_pps), (7, 103, "drops_per_sec", 6_000));
    assert_eq!(a.refused, Amount { packets: 16_000, bytes: 1_600_000 }, "counted from its first second");
    assert_eq!(a.passed.packets, 30);
    assert_eq!(a.reasons[0].name, "rate_limited");
    assert!(d.active(&names()).is_some());
}

#[test]
fn it_tells_when_it_doubles_and_ends_after_the_quiet_time() {
    let mut d = Detector::new(settings(), 1);
    for at in 0..3 {
        d.second(at, &second(2_000), &names());
    }
    assert_eq!(d.second(3, &second(3_000), &names()), None, "not twice the told peak");
    let Some(Event::Grew(a)) = d.second(4, &second(4_000), &names()) else { panic!("no growth told") };
    assert_eq!(a.peak_pps, 4_000);
    for at in 5..9 {
        assert_eq!(d.second(at, &second(10), &names()), None, "quiet for {} s", at - 4);
    }
    let Some(Event::Ended(a)) = d.second(9, &second(10), &names()) else { panic!("no end") };
    assert_eq!((a.started, a.ended, a.duration_secs), (0, Some(4), 5));
    assert!(d.active(&names()).is_none());
    // The next attack has the next id.
    for at in 20..22 {
        d.second(at, &second(2_000), &names());
    }
    let Some(Event::Started(a)) = d.second(22, &second(2_000), &names()) else { panic!("no second start") };
    assert_eq!(a.id, 2);
}

#[test]
fn bits_alone_can_start_one() {
    let mut d = Detector::new(Settings { bits_per_sec: 800_000, ..settings() }, 1);
    // 500 packets of 1,000 bytes: under 1,000 packets, 4 Mbit/s.
    let mut t = Totals::default();
    t.add(Reason::Denied, family::IPV4, Counter { packets: 500, bytes: 500_000 });
    let mut last = None;
    for at in 0..3 {
        last = d.second(at, &t, &names());
    }
    let Some(Event::Started(a)) = last else { panic!("no start") };
    assert_eq!((a.trigger.as_str(), a.peak_bps), ("bits_per_sec", 4_000_000));
}

#[test]
fn sources_classes_and_ports_are_ranked_by_their_samples_and_actions_are_bounded() {
    let mut d = Detector::new(settings(), 1);
    d.second(0, &second(2_000), &names());
    for _ in 0..30 {
        d.sampled(&key(1, 0), Reason::RateLimited as u32, Some((17, 7001)));
    }
    for _ in 0..5 {
        d.sampled(&key(2, 1), Reason::RateLimited as u32, Some((6, 443)));
        d.sampled(&key(2, 0), Reason::Denied as u32, None);
    }
    d.sampled(&key(3, 1), Reason::SynCookieVerified as u32, Some((6, 443)));
    for i in 0..(MAX_ACTIONS + 5) {
        d.action(AttackAction { at: 1, by: "escalation".into(), what: format!("deny {i}"), ok: true });
    }
    d.second(1, &second(2_000), &names());
    let Some(Event::Started(a)) = d.second(2, &second(2_000), &names()) else { panic!("no start") };
    assert_eq!(a.samples, 40, "a proof of source is no drop");
    assert_eq!(a.sources[0].name, "198.18.1.0/24");
    assert!((a.sources[0].share - 0.75).abs() < 1e-9);
    assert_eq!(a.sources.len(), 2, "a prefix is one source whatever its classes");
    assert_eq!(a.sources[1].packets, 10 * SAMPLE);
    assert_eq!((a.classes[0].name.as_str(), a.classes[1].name.as_str()), ("default", "web"));
    assert_eq!(a.classes[1].packets, 5 * SAMPLE);
    assert_eq!((a.actions.len(), a.actions_left_out), (MAX_ACTIONS, 5));
    let ports: Vec<(&str, u64)> = a.ports.iter().map(|p| (p.name.as_str(), p.packets)).collect();
    assert_eq!(ports, [("udp/7001", 30 * SAMPLE), ("tcp/443", 5 * SAMPLE)], "a drop without a port counts in none");
    assert!((a.ports[0].share - 0.75).abs() < 1e-9);
}

#[test]
fn an_attacks_pcap_keeps_its_first_frames_then_a_sample_and_forgets_a_rise_that_did_not_last() {
    use super::pcap::{FIRST, PER_SECOND, Recorder};
    use crate::capture::{Frame, Want};
    let dir = std::env::temp_dir().join(format!("limiter-pcap-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("attacks.jsonl");
    let names = vec!["default".to_owned()];
    let f = Frame { t_ns: 1, len: 60, data: vec![0; 60], reason: Reason::RateLimited, class: 0, one_in: 1 };
    let mut r = Recorder::new(Some(&file));
    r.begin();
    assert_eq!(r.want(), Some(Want::Every));
    r.frames(&vec![f.clone(); 10], &names);
    r.abandon();
    assert!(!r.recording() && r.want().is_none(), "a rise that did not last is forgotten");
    r.begin();
    r.frames(&vec![f.clone(); usize::try_from(FIRST).unwrap() + 50], &names);
    assert_eq!(r.want(), None, "held frames stop at FIRST until it is an attack");
    let pcap = r.started(7, &names).unwrap();
    assert_eq!(pcap.frames, FIRST);
    assert!(pcap.path.ends_with("attacks.jsonl.pcap/7.pcapng"), "{}", pcap.path);
    r.second(PER_SECOND * 1_000);
    assert_eq!(r.want(), Some(Want::OneIn(1_024)));
    r.frames(&[f.clone(), Frame { reason: Reason::Admitted, ..f.clone() }], &names);
    let end = r.end().unwrap();
    assert_eq!(end.frames, FIRST + 1, "a passed frame is not an attack's");
    let meta = std::fs::metadata(&end.path).unwrap();
    assert_eq!(meta.len(), end.bytes);
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
        0o640,
        "packets are not for every local user"
    );
    assert!(r.want().is_none());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_sources_never_refused_get_their_share_of_the_passed_packets() {
    let mut d = Detector::new(settings(), 1);
    assert!(!d.wants_passes());
    d.second(0, &second(5_000), &names());
    assert!(d.wants_passes(), "passes are drawn from the first second above a threshold");
    // 198.18.41/24 is refused (a sampled drop) and 198.18.42/24 (a copied
    // drop); 198.18.50/24 and .51 only pass. Drawn passes: 41 three times
    // one in 4 (12 packets), 42 once one in 8, 50 twice one in 4, 51 once
    // one in 4: 32 packets drawn for, 12 of them never refused.
    d.sampled(&key(41, 1), Reason::RateLimited as u32, None);
    d.frame(&key(42, 0), false, 1);
    for (third, one_in) in [(41, 4), (41, 4), (41, 4), (42, 8), (50, 4), (50, 4), (51, 4)] {
        d.frame(&key(third, 0), true, one_in);
    }
    d.second(1, &second(5_000), &names());
    let Some(Event::Started(a)) = d.second(2, &second(5_000), &names()) else { panic!("no start") };
    let c = a.conforming.expect("passes were drawn");
    assert_eq!((c.prefixes, c.samples), (2, 7));
    assert!((c.share - 12.0 / 32.0).abs() < 1e-9, "{c:?}");
    assert_eq!(c.packets, 11, "12/32 of the 30 passed in three seconds, 11.25");
    // A prefix refused later is no longer conforming, its passes before
    // included.
    d.frame(&key(50, 0), false, 1);
    let c = d.active(&names()).unwrap().conforming.unwrap();
    assert_eq!(c.prefixes, 1);
    assert!((c.share - 4.0 / 32.0).abs() < 1e-9, "{c:?}");
}

#[test]
fn no_conforming_figure_is_told_without_a_drawn_pass_or_past_the_refused_bound() {
    let mut d = Detector::new(settings(), 1);
    for at in 0..3 {
        d.second(at, &second(5_000), &names());
    }
    assert_eq!(d.active(&names()).unwrap().conforming, None, "no pass drawn");
    d.frame(&key(50, 0), true, 1);
    assert!(d.active(&names()).unwrap().conforming.is_some());
    for i in 0..=u32::try_from(MAX_REFUSED).unwrap() {
        let addr = [u32::from_ne_bytes((0x0a00_0000 + (i << 8)).to_be_bytes()), 0];
        d.frame(&BucketKey { addr, ..key(0, 0) }, false, 1);
    }
    assert_eq!(d.active(&names()).unwrap().conforming, None, "too many refused to tell the conforming apart");
}

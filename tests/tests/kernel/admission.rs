//! Admission through the real compiled program with injected time
//! (`limiter_test_clock`): prefix keys, byte cost, clock handling, and the
//! three arrival patterns of the accuracy case study (docs/design.md,
//! "The accuracy reference").

use std::net::Ipv4Addr;

use limiter_common::{BucketKey, Reason, gcra};
use limiter_tests::{
    fleet,
    kernel::{self, XDP_DROP, XDP_PASS},
    packet::*,
    study,
};

const T0: u64 = 1_000_000_000_000; // 1000 s on the injected clock

fn udp4(src: Ipv4Addr, payload: usize) -> Vec<u8> {
    Frame::eth(ETH_P_IP).ipv4(src, IPPROTO_UDP, 0, 0).udp().payload(payload).bytes
}

fn udp6(src: &str) -> Vec<u8> {
    Frame::eth(ETH_P_IPV6).ipv6(src.parse().unwrap(), IPPROTO_UDP).udp().bytes
}

fn reason_of(l: &mut limiter::dataplane::DataPlane, now: u64, frame: &[u8]) -> Reason {
    let (action, delta) = kernel::run_at(l, now, frame);
    let r = Reason::ALL.into_iter().find(|r| delta.get(*r).packets == 1).expect("one reason counted");
    assert_eq!(action, if r == Reason::Admitted { XDP_PASS } else { XDP_DROP }, "{r:?}");
    r
}

fn key4(a: Ipv4Addr, len: u8) -> BucketKey {
    kernel::v4_key(a.octets(), len)
}

fn key6(a: &str, len: u8) -> BucketKey {
    kernel::v6_key(a, len)
}

#[test]
fn sources_share_a_bucket_exactly_when_they_share_a_prefix() {
    let _alone = limiter_tests::alone(module_path!());
    // One packet per prefix, no refill: the second packet of a prefix drops.
    let mut l = kernel::open(&kernel::config(1, 1, false, 24, 56));
    let cases: [(&str, Vec<u8>, Reason); 8] = [
        ("198.18.5.1", udp4(Ipv4Addr::new(198, 18, 5, 1), 0), Reason::Admitted),
        ("198.18.5.200 (same /24)", udp4(Ipv4Addr::new(198, 18, 5, 200), 0), Reason::RateLimited),
        ("198.18.6.1 (next /24)", udp4(Ipv4Addr::new(198, 18, 6, 1), 0), Reason::Admitted),
        ("198.19.5.1 (other /16)", udp4(Ipv4Addr::new(198, 19, 5, 1), 0), Reason::Admitted),
        ("2001:2:0:100::1", udp6("2001:2:0:100::1"), Reason::Admitted),
        ("2001:2:0:1ff:ffff::9 (same /56)", udp6("2001:2:0:1ff:ffff::9"), Reason::RateLimited),
        ("2001:2:0:200::1 (next /56)", udp6("2001:2:0:200::1"), Reason::Admitted),
        // An IPv4-mapped address is an IPv6 source, never the IPv4 bucket.
        ("::ffff:198.18.5.1", udp6("::ffff:198.18.5.1"), Reason::Admitted),
    ];
    for (name, frame, want) in cases {
        assert_eq!(reason_of(&mut l, T0, &frame), want, "{name}");
    }
    // The map holds exactly the masked prefixes.
    assert_eq!(l.tracked(), 6);
    for k in [
        key4(Ipv4Addr::new(198, 18, 5, 0), 24),
        key4(Ipv4Addr::new(198, 18, 6, 0), 24),
        key4(Ipv4Addr::new(198, 19, 5, 0), 24),
        key6("2001:2:0:100::", 56),
        key6("2001:2:0:200::", 56),
        key6("::", 56),
    ] {
        assert!(l.bucket(&k).unwrap().is_some(), "missing bucket {k:?}");
    }
}

#[test]
fn prefix_lengths_are_configurable() {
    let _alone = limiter_tests::alone(module_path!());
    let mut l = kernel::open(&kernel::config(1, 1, false, 16, 64));
    assert_eq!(reason_of(&mut l, T0, &udp4(Ipv4Addr::new(198, 18, 5, 1), 0)), Reason::Admitted);
    assert_eq!(reason_of(&mut l, T0, &udp4(Ipv4Addr::new(198, 18, 200, 1), 0)), Reason::RateLimited);
    assert_eq!(reason_of(&mut l, T0, &udp6("2001:2:0:100::1")), Reason::Admitted);
    // Same /56 but another /64: its own bucket now.
    assert_eq!(reason_of(&mut l, T0, &udp6("2001:2:0:101::1")), Reason::Admitted);
    assert_eq!(reason_of(&mut l, T0, &udp6("2001:2:0:101::2")), Reason::RateLimited);
}

#[test]
fn refill_follows_the_injected_clock_and_never_runs_backwards() {
    let _alone = limiter_tests::alone(module_path!());
    // 10 packets/s, burst 2: one packet every 100 ms after the burst.
    let mut l = kernel::open(&kernel::config(10, 2, false, 24, 56));
    let f = udp4(Ipv4Addr::new(198, 18, 7, 1), 0);
    let ms = 1_000_000;
    assert_eq!(reason_of(&mut l, T0, &f), Reason::Admitted);
    assert_eq!(reason_of(&mut l, T0, &f), Reason::Admitted);
    assert_eq!(reason_of(&mut l, T0, &f), Reason::RateLimited);
    assert_eq!(reason_of(&mut l, T0 + 99 * ms, &f), Reason::RateLimited);
    assert_eq!(reason_of(&mut l, T0 + 100 * ms, &f), Reason::Admitted);
    // The clock steps back a whole minute: no credit appears.
    assert_eq!(reason_of(&mut l, T0 - 60_000 * ms, &f), Reason::RateLimited);
    assert_eq!(reason_of(&mut l, T0 + 150 * ms, &f), Reason::RateLimited);
    assert_eq!(reason_of(&mut l, T0 + 200 * ms, &f), Reason::Admitted);
    // A long idle refills to the burst and no further.
    let later = T0 + 3_600_000 * ms;
    assert_eq!(reason_of(&mut l, later, &f), Reason::Admitted);
    assert_eq!(reason_of(&mut l, later, &f), Reason::Admitted);
    assert_eq!(reason_of(&mut l, later, &f), Reason::RateLimited);
}

#[test]
fn byte_cost_charges_the_frame_length() {
    let _alone = limiter_tests::alone(module_path!());
    // 1000 bytes/s, burst 2000 bytes.
    let mut l = kernel::open(&kernel::config(1000, 2000, true, 24, 56));
    let src = Ipv4Addr::new(198, 18, 8, 1);
    let big = udp4(src, 958); // 14 + 20 + 8 + 958 = 1000 bytes on the wire
    let small = udp4(src, 0); // 42 bytes
    assert_eq!(big.len(), 1000);
    assert_eq!(reason_of(&mut l, T0, &big), Reason::Admitted);
    assert_eq!(reason_of(&mut l, T0, &big), Reason::Admitted);
    assert_eq!(reason_of(&mut l, T0, &small), Reason::RateLimited);
    // 42 ms later exactly 42 bytes of credit exist: not enough for a big
    // frame, whose refusal must not hold back the small one.
    assert_eq!(reason_of(&mut l, T0 + 41_000_000, &small), Reason::RateLimited);
    assert_eq!(reason_of(&mut l, T0 + 42_000_000, &big), Reason::RateLimited);
    assert_eq!(reason_of(&mut l, T0 + 42_000_000, &small), Reason::Admitted);
}

#[test]
fn no_config_passes_and_is_counted() {
    let _alone = limiter_tests::alone(module_path!());
    kernel::require_root();
    let mut l = limiter::dataplane::DataPlane::open(16).unwrap();
    let f = udp4(Ipv4Addr::new(198, 18, 9, 1), 0);
    let (action, delta) = kernel::run_at(&mut l, T0, &f);
    assert_eq!(action, XDP_PASS);
    kernel::assert_counted_once(&delta, Reason::NoConfig, f.len(), "unconfigured");
}

// ---- Case study replay -------------------------------------------------

const LIMIT: u64 = 600;
const WINDOW_MS: u64 = 60_000;
const SLICE_MS: u64 = 5_000;
const RATE: u64 = 10; // 600 per 60 s
const BUCKET: u64 = 60; // HS8

/// The case study's three patterns (`limiter_tests::study`), in ms.
fn uniform_2x() -> Vec<u64> {
    let [(_, t, _), _, _] = study::patterns();
    t
}

fn piled_at_boundary() -> Vec<u64> {
    let [_, (_, t, _), _] = study::patterns();
    t
}

fn spaced_at_the_limit() -> Vec<u64> {
    let [_, _, (_, t, _)] = study::patterns();
    t
}

/// Replay arrival times (ms) through the kernel; return the admitted ones.
fn replay(rate: u64, burst: u64, times_ms: &[u64]) -> Vec<u64> {
    replay_compiled(&kernel::config(rate, burst, false, 24, 56), times_ms)
}

/// Replay arrival times (ms) of one UDP source under `c`.
fn replay_compiled(c: &limiter::policy::Compiled, times_ms: &[u64]) -> Vec<u64> {
    let mut l = kernel::open(c);
    let f = udp4(Ipv4Addr::new(198, 18, 10, 1), 0);
    let mut admitted = Vec::new();
    for &t in times_ms {
        l.set_test_clock(T0 + t * 1_000_000).unwrap();
        let (action, _) = l.test_run(limiter_common::programs::LIMITER_TEST_CLOCK, &f, 1).unwrap();
        if action == XDP_PASS {
            admitted.push(t);
        }
    }
    admitted
}

/// Most admissions in any window `[t, t + w)`, as the case study measures.
fn busiest(admitted: &[u64], w: u64) -> u64 {
    fleet::busiest(admitted, w) as u64
}

/// Exact token-bucket conformance in integer arithmetic (tokens scaled by
/// 1000 so a refill of `rate`/s over whole ms is integral).
fn conforms(rate: u64, burst: u64, times_ms: &[u64]) -> bool {
    let (cap, mut tokens, mut last) = (burst * 1000, burst * 1000, times_ms[0]);
    for &t in times_ms {
        tokens = (tokens + (t - last) * rate).min(cap);
        last = t;
        if tokens < 1000 {
            return false;
        }
        tokens -= 1000;
    }
    true
}

#[test]
fn case_study_patterns_stay_within_the_declared_bound() {
    let _alone = limiter_tests::alone(module_path!());
    // The case study's own token-bucket column (rate 10/s, 60 tokens) is an
    // independent reference: accepted 1859 / 318 / 327, busiest 60 s
    // 659 / 159 / 109. The kernel must reproduce it exactly.
    let cases = [
        ("uniform 2x", uniform_2x(), 1859, 659),
        ("piled at boundary", piled_at_boundary(), 318, 159),
        ("spaced at the limit", spaced_at_the_limit(), 327, 109),
    ];
    for (name, times, accepted, peak) in cases {
        let adm = replay(RATE, BUCKET, &times);
        let got_peak = busiest(&adm, WINDOW_MS);
        assert_eq!((adm.len() as u64, got_peak), (accepted, peak), "{name}");
        // Declared bound: burst + rate x T for T = 60 s.
        assert!(got_peak <= BUCKET + RATE * WINDOW_MS / 1000, "{name}: {got_peak}");
        // And over every shorter window too, T from 1 ms to 60 s.
        for w in [1, 50, 999, 1000, 5_000, 30_000] {
            let bound = BUCKET + (RATE * w).div_ceil(1000);
            assert!(busiest(&adm, w) <= bound, "{name}: window {w} ms");
        }
    }
}

/// The case study's sliding window counter (600 per 60 s in 12 slices of
/// 5 s) as an independent reference, in a few lines: the kernel's window
/// quota must admit exactly the same requests.
fn sliding_window_model(times_ms: &[u64]) -> Vec<u64> {
    let mut counts = std::collections::BTreeMap::<u64, u64>::new();
    let slices = WINDOW_MS / SLICE_MS;
    times_ms
        .iter()
        .copied()
        .filter(|t| {
            let slice = t / SLICE_MS;
            counts.retain(|k, _| *k + slices > slice);
            if counts.values().sum::<u64>() >= LIMIT {
                return false;
            }
            *counts.entry(slice).or_default() += 1;
            true
        })
        .collect()
}

#[test]
fn a_window_quota_reproduces_the_case_studys_sliding_window_row() {
    let _alone = limiter_tests::alone(module_path!());
    // The case study's sliding-window column: accepted 1800 / 1200 / 1800,
    // busiest 60 s 600 on each, and nothing refused of "spaced at the
    // limit" (which its token bucket refused 1473 of).
    let c = kernel::window_config(LIMIT, WINDOW_MS, 12, limiter::policy::Scope::Local);
    let cases = [
        ("uniform 2x", uniform_2x(), 1800),
        ("piled at boundary", piled_at_boundary(), 1200),
        ("spaced at the limit", spaced_at_the_limit(), 1800),
    ];
    for (name, times, accepted) in cases {
        let adm = replay_compiled(&c, &times);
        println!(
            "window quota, {name}: accepted {} of {}, busiest 60 s {}",
            adm.len(),
            times.len(),
            busiest(&adm, WINDOW_MS)
        );
        assert_eq!(adm, sliding_window_model(&times), "{name}: differs from the reference model");
        assert_eq!((adm.len() as u64, busiest(&adm, WINDOW_MS)), (accepted, LIMIT), "{name}");
    }
    let spaced = spaced_at_the_limit();
    assert_eq!(replay_compiled(&c, &spaced).len(), spaced.len(), "a client at its limit was refused");
}

#[test]
fn conforming_patterns_lose_nothing() {
    let _alone = limiter_tests::alone(module_path!());
    // "Spaced at the limit" conforms to (10/s, burst 600): 600 in 5 s, then
    // 55 s of refill. Uniform at exactly the rate conforms with burst 1.
    let at_rate: Vec<u64> = (0..1800).map(|i| i * 100).collect();
    for (name, rate, burst, times) in [
        ("spaced at the limit, burst 600", RATE, LIMIT, spaced_at_the_limit()),
        ("uniform at the rate, burst 1", RATE, 1, at_rate),
    ] {
        assert!(conforms(rate, burst, &times), "{name} is not conforming: test is wrong");
        let adm = replay(rate, burst, &times);
        assert_eq!(adm.len(), times.len(), "{name}: conforming packets dropped");
    }
    // The GCRA unit for this rate is exact.
    assert_eq!(gcra::unit_interval(RATE) * RATE, gcra::to_fixed(1_000_000_000));
}

/// A fleet-scope window between two syncs: once this node has refused the
/// prefix, the budget freed since the sync is shared with the other nodes
/// as the sync estimated them (here: three admissions elsewhere per one
/// here); a prefix never refused is judged on the counts alone, so a
/// compliant client never loses to the estimate.
#[test]
fn between_syncs_a_refused_fleet_prefix_spends_its_share_of_what_is_freed() {
    let _alone = limiter_tests::alone(module_path!());
    use limiter_common::window::{self, WindowState};
    const LIMIT: u64 = 100;
    const SLICE_NS: u64 = 5_000_000_000;
    let c = kernel::window_config(LIMIT, 60_000, 12, limiter::policy::Scope::Fleet);
    let mut l = kernel::open(&c);
    let t = T0 - T0 % SLICE_NS + SLICE_NS / 2;
    let cur = t / SLICE_NS;
    // A sync: the others hold `theirs` in the current slice and admit three
    // for each one admitted here.
    let sync = |l: &mut limiter::dataplane::DataPlane, key: &BucketKey, theirs: u64| {
        let mut v = WindowState::default();
        v.slots[window::slot_of(cur, 12)] = window::slot(cur, 0, theirs);
        v.share = window::share(3 << window::SHARE_SHIFT, 0, false);
        l.set_fleet(&BucketKey { class: 1, ..*key }, v).unwrap();
    };
    let admitted = |l: &mut limiter::dataplane::DataPlane, src: Ipv4Addr, n: u64| {
        (0..n).filter(|i| kernel::reason_at(l, t + i * 1_000, &udp4(src, 0)) == Reason::Admitted).count() as u64
    };
    let (quiet, flooded) = (Ipv4Addr::new(198, 18, 40, 1), Ipv4Addr::new(198, 18, 41, 1));
    let (qk, fk) = (key4(Ipv4Addr::new(198, 18, 40, 0), 24), key4(Ipv4Addr::new(198, 18, 41, 0), 24));

    // Never refused: the others' 40 and its own up to the limit.
    sync(&mut l, &qk, 40);
    assert_eq!(admitted(&mut l, quiet, 60), 60, "a prefix never refused lost to the estimate");
    assert_eq!(admitted(&mut l, quiet, 1), 0, "the limit");

    // Refused (the others' 60 and its own 40), then a sync in which the
    // others' count fell to 40: 20 were freed, a quarter of them here.
    sync(&mut l, &fk, 60);
    assert_eq!(admitted(&mut l, flooded, 41), 40);
    let local = l.window(&BucketKey { class: 1, ..fk }).unwrap().unwrap();
    assert!(window::refused_within(local.share, cur, 12), "the refusal is marked");
    sync(&mut l, &fk, 40);
    assert_eq!(admitted(&mut l, flooded, 20), 5, "40 + 40 + n + 3n <= 100");
}

//! `bench deny`: the deny path with 1, 10,000, 100,000 and 1,000,000
//! denied networks loaded, beside xdp-filter's drop and pass in the same
//! rounds (issue: a million denied prefixes at a hash lookup's cost).

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::{Duration, Instant},
};

use ipnet::IpNet;
use limiter::{
    dataplane::DataPlane,
    policy::{Limit, Override, OverrideAction, Policy},
};
use limiter_common::programs;
use limiter_tests::{
    kernel,
    packet::{ETH_P_IP, Frame, IPPROTO_UDP},
};

use super::{REPEAT, hit::peer_run, jitlines::JitLines, measure, profile, xdp_filter::XdpFilter};

const ROUNDS: usize = 7;
const SIZES: [usize; 4] = [1, 10_000, 100_000, 1_000_000];

/// `n` denied networks, none overlapping another: the frame's /24 first,
/// then IPv4 /24s and /16s and IPv6 /56s and /48s (9 : 1 within each
/// family, half of each family).
fn denied(n: usize) -> Vec<Override> {
    let deny = |net: IpNet| Override { net, action: OverrideAction::Deny };
    let v4 = |a: u32, len: u8| IpNet::new(IpAddr::V4(Ipv4Addr::from(a)), len).expect("valid");
    let v6 = |hi: u64, len: u8| IpNet::new(IpAddr::V6(Ipv6Addr::from(u128::from(hi) << 64)), len).expect("valid");
    let mut out = vec![deny(v4(u32::from(Ipv4Addr::new(198, 18, 5, 0)), 24))];
    let idx = |i: usize| u64::try_from(i).expect("fits");
    for i in 0..n.saturating_sub(1) {
        let k = idx(i / 20);
        #[expect(clippy::cast_possible_truncation, reason = "k < 65,536 for a million entries")]
        let net = match i % 20 {
            0..9 => v4((10 << 24) | ((k as u32 * 9 + idx(i % 20) as u32) << 8), 24),
            9 => v4((64 << 24) + ((k as u32) << 16), 16),
            10..19 => v6(0x2400_0000_0000_0000 | ((k * 9 + idx(i % 20 - 10)) << 8), 56),
            _ => v6(0x2600_0000_0000_0000 | (k << 16), 48),
        };
        out.push(deny(net));
    }
    out
}

pub fn deny() {
    let denied_frame =
        Frame::eth(ETH_P_IP).ipv4(Ipv4Addr::new(198, 18, 5, 1), IPPROTO_UDP, 0, 0).udp().payload(22).bytes;
    let other = Frame::eth(ETH_P_IP).ipv4(Ipv4Addr::new(198, 18, 6, 1), IPPROTO_UDP, 0, 0).udp().payload(22).bytes;
    let Some(peer) = XdpFilter::deny(Ipv4Addr::new(198, 18, 5, 1)) else { return };
    println!("deny path, {ROUNDS} interleaved rounds of {REPEAT} runs, 64-byte UDP/IPv4 frame, beside xdp-filter");
    println!(
        "{:>10} {:>8} {:>10} {:>10} {:>10} {:>10} {:>12} {:>12}",
        "denied", "load s", "deny ns", "admit ns", "xf drop", "xf pass", "deny/xf drop", "admit/xf pass"
    );
    let mut goals = Vec::new();
    let mut first = None;
    for n in SIZES {
        let policy = Policy {
            default: Limit { rate: limiter_common::gcra::MAX_RATE, burst: 1 << 40, ..Policy::default().default },
            overrides: denied(n),
            capacity: 1024,
            ..Policy::default()
        };
        // The data plane first: its object's load and verification are not
        // the denied networks' load.
        let mut l = kernel::open_bench(&Policy::default().compile(1).expect("default"), 1024);
        let start = Instant::now();
        let compiled = match policy.compile(2) {
            Ok(c) => c,
            Err(e) => {
                println!("{n:>10} not loaded: {e}");
                goals.push(format!("{n}: NOT met (not loaded)"));
                continue;
            }
        };
        l.maps.apply(&compiled).expect("apply the denied networks");
        let load = start.elapsed().as_secs_f64();
        l.load_program(programs::LIMITER).expect("load");
        let mut rows: [Vec<f64>; 4] = Default::default();
        for _ in 0..ROUNDS {
            rows[0].push(measure(&mut l, programs::LIMITER, &denied_frame, kernel::XDP_DROP));
            rows[1].push(measure(&mut l, programs::LIMITER, &other, kernel::XDP_PASS));
            rows[2].push(peer_run(&peer, &denied_frame, kernel::XDP_DROP));
            rows[3].push(peer_run(&peer, &other, kernel::XDP_PASS));
        }
        let [deny, admit, xf_drop, xf_pass] = rows.map(|mut v| {
            v.sort_by(f64::total_cmp);
            v[0]
        });
        println!(
            "{n:>10} {load:>8.2} {deny:>10.1} {admit:>10.1} {xf_drop:>10.1} {xf_pass:>10.1} {:>12.2} {:>12.2}",
            deny / xf_drop,
            admit / xf_pass
        );
        let met = |ok: bool| if ok { "met" } else { "NOT met" };
        if first.is_none() {
            first = Some(l);
        }
        goals.push(format!(
            "{n}: deny at most 1.1x xdp-filter's drop {}, admitted at most 1.1x its pass {}, loaded within 5 s {}",
            met(deny <= 1.1 * xf_drop),
            met(admit <= 1.1 * xf_pass),
            met(load <= 5.0)
        ));
    }
    for g in goals {
        println!("goal: {g}");
    }
    if let Some(l) = first.as_mut().filter(|_| profile::wanted()) {
        profile_deny(l, &denied_frame);
    }
}

/// `LIMITER_BENCH_PROFILE=1`: where a denied packet's time goes, by
/// kernel symbol (the limiter's global functions apart), beside a bare
/// `XDP_DROP`'s, each spun alone on CPU 0 for 3 s under `perf`.
fn profile_deny(l: &mut DataPlane, frame: &[u8]) {
    l.load_program(programs::BASELINE_DROP).expect("load");
    kernel::pin_to_cpu(0);
    let lines = JitLines::of(programs::LIMITER);
    let mut spin = |prog: &'static str| {
        let rec = profile::Recording::start(0);
        let (start, mut calls) = (Instant::now(), 0u64);
        while start.elapsed() < Duration::from_secs(3) {
            measure(l, prog, frame, kernel::XDP_DROP);
            calls += 1;
        }
        rec.stop(calls * u64::from(REPEAT), lines.as_ref())
    };
    let bare = spin(programs::BASELINE_DROP);
    let deny = spin(programs::LIMITER);
    profile::print("a denied source's packet, 1 network denied", &bare, &deny);
}

//! `cargo xtask bench`: the XDP program's cost side by side with a bare
//! `XDP_DROP`, through BPF_PROG_TEST_RUN in one run, plus the verifier's
//! processed-instruction count of each entry point. Ratios, not absolutes.

use std::{net::Ipv4Addr, time::Duration};

use limiter::loader::Limiter;
use limiter_common::programs;
use limiter_tests::{
    kernel,
    packet::{ETH_P_IP, Frame, IPPROTO_UDP},
};

const REPEAT: u32 = 2_000_000;
const ROUNDS: usize = 7;

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort_unstable();
    v[v.len() / 2].as_secs_f64() * 1e9
}

fn measure(l: &mut Limiter, prog: &'static str, frame: &[u8], want: u32) -> f64 {
    let runs = (0..ROUNDS)
        .map(|_| {
            let (action, d) = l.test_run(prog, frame, REPEAT).expect("BPF_PROG_TEST_RUN");
            assert_eq!(action, want, "{prog}: unexpected action");
            d
        })
        .collect();
    median(runs)
}

fn main() {
    kernel::require_root();
    let frame = Frame::eth(ETH_P_IP).ipv4(Ipv4Addr::new(198, 18, 5, 1), IPPROTO_UDP, 0, 0).udp().payload(22).bytes;
    // Admit path: a rate so high the bucket never empties.
    let mut admit = kernel::open(&kernel::config(limiter_common::gcra::MAX_RATE, 1 << 40, false, 24, 56));
    // Drop path: one packet of allowance, then everything is refused.
    let mut refuse = kernel::open(&kernel::config(1, 1, false, 24, 56));
    for l in [&mut admit, &mut refuse] {
        l.load_program(programs::LIMITER).unwrap();
        l.load_program(programs::BASELINE_DROP).unwrap();
        // Create the bucket first so every measured run is a hit.
        l.test_run(programs::LIMITER, &frame, 1).unwrap();
    }

    let mut bare = Vec::new();
    let mut hit = Vec::new();
    let mut drop = Vec::new();
    // Interleave rounds so drift on a noisy VM hits every row alike.
    for _ in 0..3 {
        bare.push(measure(&mut admit, programs::BASELINE_DROP, &frame, kernel::XDP_DROP));
        hit.push(measure(&mut admit, programs::LIMITER, &frame, kernel::XDP_PASS));
        drop.push(measure(&mut refuse, programs::LIMITER, &frame, kernel::XDP_DROP));
    }
    let pick = |v: Vec<f64>| {
        let mut v = v;
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (bare, hit, drop) = (pick(bare), pick(hit), pick(drop));

    println!("BPF_PROG_TEST_RUN, {REPEAT} runs x {ROUNDS} rounds x 3, median, 64-byte UDP/IPv4 frame");
    println!("{:<44} {:>10} {:>12}", "program", "ns/packet", "x bare drop");
    println!("{:<44} {:>10.1} {:>12.2}", "bare XDP_DROP", bare, 1.0);
    println!("{:<44} {:>10.1} {:>12.2}", "limiter hit path (bucket exists, admitted)", hit, hit / bare);
    println!("{:<44} {:>10.1} {:>12.2}", "limiter hit path (bucket exists, dropped)", drop, drop / bare);
    println!("goal: hit path at most 3x bare -> {}", if hit / bare <= 3.0 { "met" } else { "NOT met" });
    println!();
    overrides_apply();
    println!();
    println!("{:<44} {:>10}", "verifier, processed instructions", "insns");
    for p in [programs::BASELINE_DROP, programs::LIMITER, programs::LIMITER_TEST_CLOCK] {
        admit.load_program(p).unwrap();
        let n = admit.verified_instructions(p).unwrap().map_or("n/a".into(), |n| n.to_string());
        println!("{p:<44} {n:>10}");
    }
}

/// Time to apply 100,000 overrides (goal: at most 1 s), into an empty idle
/// slot and into one that still holds 100,000 older overrides.
fn overrides_apply() {
    use limiter::policy::{Limit, Override, OverrideAction, Policy};
    let make = |burst| {
        let overrides = (0..100_000u32)
            .map(|i| {
                let [_, a, b, c] = (i + (10 << 16)).to_be_bytes();
                let limit = Limit { burst, ..Policy::default().default };
                Override { net: format!("{a}.{b}.{c}.0/24").parse().unwrap(), action: OverrideAction::Limit(limit) }
            })
            .collect();
        Policy { overrides, ..Policy::default() }
    };
    let mut l = kernel::open(&Policy::default().compile(1).unwrap());
    println!("{:<44} {:>10}", "policy apply, 100,000 overrides", "seconds");
    for (version, label) in [(2u64, "into an empty slot"), (3, "first flip back"), (4, "replacing 100,000 older ones")]
    {
        let p = make(version * 10);
        let (cfg, ovr) = (p.compile(version).unwrap(), p.compile_overrides().unwrap());
        let start = std::time::Instant::now();
        l.apply(&cfg, &ovr).unwrap();
        println!("{label:<44} {:>10.3}", start.elapsed().as_secs_f64());
    }
}

//! Window quotas in `bench accuracy`: the case study's three patterns
//! through the compiled program with injected time (its sliding-window
//! row), the two worst cases measured (the slice granularity, and CPUs
//! racing past the check at one moment), and kernel memory per tracked
//! prefix.

use std::net::Ipv4Addr;

use limiter::policy::Scope;
use limiter_common::{programs, window};
use limiter_tests::{
    kernel::{self, XDP_PASS},
    packet::{ETH_P_IP, Frame, IPPROTO_UDP},
};

const T0: u64 = 1_000_000_000_000;
const LIMIT: u64 = 600;
const WINDOW_MS: u64 = 60_000;

fn frame(src: Ipv4Addr) -> Vec<u8> {
    Frame::eth(ETH_P_IP).ipv4(src, IPPROTO_UDP, 0, 0).udp().bytes
}

/// Replay arrival times (ns after T0) of one source; the admitted ones.
fn replay(times_ns: &[u64]) -> Vec<u64> {
    let mut l = kernel::open(&kernel::window_config(LIMIT, WINDOW_MS, 12, Scope::Local));
    let f = frame(Ipv4Addr::new(198, 18, 10, 1));
    times_ns
        .iter()
        .copied()
        .filter(|t| {
            l.set_test_clock(T0 + t).unwrap();
            l.test_run(programs::LIMITER_TEST_CLOCK, &f, 1).unwrap().0 == XDP_PASS
        })
        .collect()
}

/// Most admissions in any `[t, t + 60 s)`.
fn busiest(adm: &[u64]) -> usize {
    let (mut best, mut j) = (0, 0);
    for i in 0..adm.len() {
        while adm[i] - adm[j] >= WINDOW_MS * 1_000_000 {
            j += 1;
        }
        best = best.max(i - j + 1);
    }
    best
}

pub fn accuracy(uniform: &[u64], piled: &[u64], spaced: &[u64]) {
    let ms = |v: &[u64]| v.iter().map(|t| t * 1_000_000).collect::<Vec<_>>();
    println!();
    println!("{:<44} {:>10} {:>12}", "window quota (600 per 60 s, 12 slices)", "admitted", "busiest 60 s");
    for (name, times, study) in [
        ("uniform at 2x the rate", uniform, "1800, 600"),
        ("piled at the boundary", piled, "1200, 600"),
        ("spaced at the limit", spaced, "1800, 600"),
    ] {
        let adm = replay(&ms(times));
        println!("{:<44} {:>10} {:>12}   (case study: {study})", name, adm.len(), busiest(&adm));
    }
    let adm = replay(&ms(spaced));
    println!("{:<44} {:>10}", "false drops: spaced at the limit", spaced.len() - adm.len());

    // Worst case 1, the slice granularity: the limit in the last
    // millisecond of one slice, and again in the first of the slice a
    // window later. The window of that slice no longer holds the first.
    let burst = |start_ns: u64| (0..LIMIT).map(move |i| start_ns + i * 1_000);
    let edge: Vec<u64> = burst(4_999_000_000).chain(burst(60_000_000_000)).collect();
    let adm = replay(&edge);
    let span = (adm.last().unwrap() - adm[0]) as f64 / 1e9;
    println!(
        "{:<44} {:>10} {:>12}   ({:.3}x the limit, within {span:.3} s)",
        "worst case: slice edges a window apart",
        adm.len(),
        busiest(&adm),
        busiest(&adm) as f64 / LIMIT as f64
    );
    races();
    memory();
}

/// Worst case 2: both CPUs run the program on one prefix at the same
/// moment (BPF_PROG_TEST_RUN from a thread pinned to each), 2,000 runs
/// each against a limit of 1,000, over 200 prefixes: how far past the
/// limit the racing check-then-count admits.
fn races() {
    const LIM: u32 = 1_000;
    const TRIALS: u8 = 200;
    let mut l = kernel::open(&kernel::window_config(u64::from(LIM), WINDOW_MS, 12, Scope::Local));
    l.set_test_clock(T0).unwrap();
    let (mut worst, mut over, mut sum) = (0, 0, 0);
    for i in 0..TRIALS {
        let src = Ipv4Addr::new(198, 18, i, 1);
        l.test_run_on_cpus(programs::LIMITER_TEST_CLOCK, &frame(src), 2 * LIM, &[0, 1]).unwrap();
        let key = limiter_common::BucketKey { class: 1, ..kernel::v4_key([198, 18, i, 0], 24) };
        let w = l.window(&key).unwrap().expect("counted");
        let cur = window::slice_of(T0, 5_000_000_000);
        let admitted = window::total(&w, cur, 12);
        let past = admitted.saturating_sub(u64::from(LIM));
        worst = worst.max(past);
        sum += past;
        over += u32::from(past > 0);
    }
    println!(
        "{:<44} {:>10} {:>12}   ({over} of {TRIALS} prefixes past the limit, {:.2} on average)",
        "worst case: 2 CPUs racing on one prefix",
        format!("+{worst}"),
        format!("{:.4}x", (u64::from(LIM) + worst) as f64 / f64::from(LIM)),
        sum as f64 / f64::from(TRIALS)
    );
}

/// Kernel memory per tracked prefix of a window quota, from the maps'
/// memlock: its slice counts, the bucket entry that caches its override
/// resolution, and for fleet scope the other nodes' counts.
fn memory() {
    let l = kernel::open_with_capacity(&kernel::window_config(LIMIT, WINDOW_MS, 12, Scope::Fleet), 1 << 18);
    let per_entry = |value_size: usize| {
        // Every map of ours this process holds, from /proc/self/fdinfo.
        let mut found = None;
        for e in std::fs::read_dir("/proc/self/fdinfo").unwrap().flatten() {
            let info = std::fs::read_to_string(e.path()).unwrap_or_default();
            let field = |k: &str| info.lines().find_map(|l| l.strip_prefix(k)).map(|v| v.trim().to_owned());
            if field("map_type:").as_deref() == Some("9")
                && field("value_size:").and_then(|v| v.parse().ok()) == Some(value_size)
            {
                let memlock: f64 = field("memlock:").unwrap().parse().unwrap();
                let entries: f64 = field("max_entries:").unwrap().parse().unwrap();
                found = Some(memlock / entries);
            }
        }
        found.expect("map found")
    };
    let windows = per_entry(size_of::<window::WindowState>());
    let bucket = per_entry(size_of::<limiter_common::BucketState>());
    let local = windows + bucket;
    let fleet = local + windows;
    println!("{:<44} {:>10.0} {:>12}", "memory per prefix, local / fleet scope (B)", local, format!("{fleet:.0}"));
    println!(
        "200,000 prefixes (case study HS1): {:.1} MB local, {:.1} MB fleet (case study: 115.2 MB at 12 x 48 B)",
        local * 200_000.0 / 1e6,
        fleet * 200_000.0 / 1e6
    );
    drop(l);
}

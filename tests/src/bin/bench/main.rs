//! `cargo xtask bench`: the XDP program's cost side by side with a bare
//! `XDP_DROP`, through BPF_PROG_TEST_RUN in one run, plus the verifier's
//! processed-instruction count of each entry point. Ratios, not absolutes.
#![allow(clippy::cast_precision_loss, reason = "measurements: tick counts far inside f64's exact range")]

mod deny;
mod fleet;
mod forward;
mod fronts;
mod groups;
mod hit;
mod jitlines;
mod profile;
mod rounds;
mod syn;
mod system;
mod tcp_flood;
mod tcp_state;
mod tunnel;
mod window;
mod xdp_filter;

use std::net::Ipv4Addr;

use limiter::dataplane::DataPlane;
use limiter_common::programs;
use limiter_tests::{
    kernel,
    packet::{ETH_P_IP, Frame, IPPROTO_UDP},
};

const REPEAT: u32 = 1_000_000;
const ROUNDS: usize = 15;
/// Interleaved rounds of the working-set rows (262,144 calls each).
const WS_ROUNDS: u32 = 9;

/// One BPF_PROG_TEST_RUN call of `REPEAT` runs; the kernel's mean ns per run.
fn measure(l: &mut DataPlane, prog: &'static str, frame: &[u8], want: u32) -> f64 {
    let (action, d) = l.test_run(prog, frame, REPEAT).expect("BPF_PROG_TEST_RUN");
    assert_eq!(action, want, "{prog}: unexpected action");
    d.as_secs_f64() * 1e9
}

/// Sections in the order they print; `bench [SECTION...]` runs only those.
const SECTIONS: [(&str, fn()); 17] = [
    ("hit", hit::hit_path),
    ("tcp-state", tcp_state::tcp_state),
    ("tunnel", tunnel::tunnel),
    ("deny", deny::deny),
    ("groups", groups::groups),
    ("system", system::system_flood),
    ("system-tcp-state", tcp_flood::tcp_flood),
    ("accuracy", accuracy),
    ("working-sets", working_sets),
    ("overrides", overrides_apply),
    ("metrics", scrape_at_one_million),
    ("verifier", verifier),
    ("forward", forward::forward),
    ("fleet", fleet::fleet),
    ("syn", syn::syn),
    ("spin-admitted", || hit::spin(true)),
    ("spin-dropped", || hit::spin(false)),
];

fn main() {
    kernel::require_root();
    let only: Vec<String> = std::env::args().skip(1).collect();
    if let Some(bad) = only.iter().find(|a| !SECTIONS.iter().any(|(n, _)| n == a)) {
        let names: Vec<&str> = SECTIONS.iter().map(|(n, _)| *n).collect();
        eprintln!("bench: unknown section '{bad}' (sections: {})", names.join(", "));
        std::process::exit(2);
    }
    let mut first = true;
    for (name, section) in SECTIONS {
        // The spin sections are for a profiler, run only when named.
        if (only.is_empty() && !name.starts_with("spin")) || only.iter().any(|a| a == name) {
            if !first {
                println!();
            }
            first = false;
            section();
        }
    }
}

/// Processed instructions of each entry point (goal: at most 500,000).
fn verifier() {
    let mut l = kernel::open_bench(&kernel::config(1, 1, false, 24, 56), 1024);
    println!("{:<44} {:>10}", "verifier, processed instructions", "insns");
    for p in [
        programs::BASELINE_DROP,
        programs::LIMITER,
        programs::LIMITER_TEST_CLOCK,
        programs::BENCH_FLOOR,
        programs::BENCH_TOUCH_DROP,
        programs::BENCH_TX_SPREAD,
    ] {
        l.load_program(p).unwrap();
        let n = l.verified_instructions(p).unwrap().map_or("n/a".into(), |n| n.to_string());
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
                Override {
                    net: format!("{a}.{b}.{c}.0/24").parse().unwrap(),
                    action: OverrideAction::Limit(limit),
                    criticality: None,
                }
            })
            .collect();
        Policy { overrides, ..Policy::default() }
    };
    let mut l = kernel::open(&Policy::default().compile(1).unwrap());
    println!("{:<44} {:>10}", "policy apply, 100,000 overrides", "seconds");
    for (version, label) in [(2u64, "into an empty slot"), (3, "first flip back"), (4, "replacing 100,000 older ones")]
    {
        let p = make(version * 10);
        let compiled = p.compile(version).unwrap();
        let start = std::time::Instant::now();
        l.maps.apply(&compiled).unwrap();
        println!("{label:<44} {:>10.3}", start.elapsed().as_secs_f64());
    }
}

/// Scrape latency and daemon CPU with 1,000,000 tracked prefixes. The
/// buckets are inserted through the pinned map (data only, no traffic).
fn scrape_at_one_million() {
    use std::{
        io::{Read as _, Write as _},
        time::{Duration, Instant},
    };

    use limiter_common::{BucketKey, BucketState, family, maps};
    use limiter_tests::{
        netns::{B_IF, VethPair},
        scenario,
    };

    let net = VethPair::new("bm");
    let pins = std::path::PathBuf::from(format!("/sys/fs/bpf/limiter-bench-{}", std::process::id()));
    let mut c = net.b.net_command(scenario::locate_bin("limiter").unwrap());
    c.args(["run", "--iface", B_IF, "--pin", "--capacity", "1100000", "--status-interval", "0", "--pin-dir"])
        .arg(&pins);
    c.arg("--socket").arg(scenario::unique_socket("bench"));
    let (daemon, rx) = scenario::spawn_lines(c).unwrap();
    scenario::wait_for(&rx, "metrics on", Duration::from_secs(20), &mut String::new()).unwrap();
    let pid = daemon.0.id();

    let md = aya::maps::MapData::from_pin(pins.join(maps::BUCKETS)).unwrap();
    let mut m: aya::maps::HashMap<_, BucketKey, BucketState> =
        aya::maps::HashMap::try_from(aya::maps::Map::LruHashMap(md)).unwrap();
    let fill = Instant::now();
    for i in 0..1_000_000u32 {
        let key = BucketKey { family: family::IPV6, prefix_len: 64, class: 0, pad: 0, addr: [0x0200_0120, i] };
        m.insert(key, BucketState::default(), 0).unwrap();
    }
    let fill = fill.elapsed();
    // One count of the million entries each way, interleaved, least
    // disturbed of three.
    let map = aya::maps::IterableMap::map(&m);
    let (mut batched, mut walked) = (Duration::MAX, Duration::MAX);
    for _ in 0..3 {
        let t = Instant::now();
        // The million, and the namespace's own IPv6 chatter.
        assert!((1_000_000..1_000_016).contains(&limiter::dataplane::tracked_prefixes(map)));
        batched = batched.min(t.elapsed());
        let t = Instant::now();
        assert!((1_000_000..1_000_016).contains(&limiter::dataplane::walk_keys(map)));
        walked = walked.min(t.elapsed());
    }

    // Scrape from a thread that joins the daemon's network namespace.
    let (tracked, lat, cpu_idle, cpu_scraped) = net.b.run_in(|| {
        let scrape = || -> (Duration, String) {
            let t = Instant::now();
            let mut c = std::net::TcpStream::connect("127.0.0.1:9464").unwrap();
            c.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
            let mut body = String::new();
            c.read_to_string(&mut body).unwrap();
            (t.elapsed(), body)
        };
        let tracked = |b: &str| {
            b.lines()
                .find_map(|l| l.strip_prefix("limiter_tracked_prefixes "))
                .map_or(0, |v| v.trim().parse::<u64>().unwrap_or(0))
        };
        let mut n = 0;
        for _ in 0..60 {
            n = tracked(&scrape().1);
            if n >= 1_000_000 {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        let cpu = || {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
            let f: Vec<u64> = stat
                .rsplit(')')
                .next()
                .unwrap()
                .split_whitespace()
                .skip(11)
                .take(2)
                .map(|x| x.parse().unwrap())
                .collect();
            f[0] + f[1]
        };
        let hz = u32::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(100);
        let window = Duration::from_secs(10);
        let (c0, t0) = (cpu(), Instant::now());
        std::thread::sleep(window);
        let idle = (cpu() - c0) as f64 / f64::from(hz) / t0.elapsed().as_secs_f64();
        let (c0, t0) = (cpu(), Instant::now());
        let mut lat = Vec::new();
        while t0.elapsed() < window {
            lat.push(scrape().0);
            std::thread::sleep(Duration::from_secs(1));
        }
        let scraped = (cpu() - c0) as f64 / f64::from(hz) / t0.elapsed().as_secs_f64();
        lat.sort();
        (n, lat, idle, scraped)
    });
    drop(daemon);
    let _ = limiter::dataplane::pin::unload(&pins, false);
    println!("{:<44} {:>10}", "metrics with 1,000,000 tracked prefixes", "");
    println!("{:<44} {:>10.2}", "  buckets inserted through the pin (s)", fill.as_secs_f64());
    println!("{:<44} {:>10}", "  limiter_tracked_prefixes reported", tracked);
    println!("{:<44} {:>10.1}", "  one count in batches, as the daemon (ms)", batched.as_secs_f64() * 1e3);
    println!("{:<44} {:>10.1}", "  one count by walking the keys (ms)", walked.as_secs_f64() * 1e3);
    println!("{:<44} {:>9.1}x", "  walk / batches", walked.as_secs_f64() / batched.as_secs_f64());
    println!("{:<44} {:>10.2}", "  scrape latency, median (ms)", lat[lat.len() / 2].as_secs_f64() * 1e3);
    println!("{:<44} {:>10.2}", "  scrape latency, max (ms)", lat[lat.len() - 1].as_secs_f64() * 1e3);
    println!("{:<44} {:>10.1}", "  daemon CPU, no scrapes (% of a core)", cpu_idle * 100.0);
    println!("{:<44} {:>10.1}", "  daemon CPU, one scrape a second (%)", cpu_scraped * 100.0);
}

/// Mean ns per packet with one BPF_PROG_TEST_RUN call per frame (repeat 1,
/// so each frame can carry another source), for bare XDP_DROP and for the
/// limiter: a working set of 262,144 prefixes (all hits), and churn (every
/// frame a new source into a full map). Per-call timer overhead is in both
/// rows alike, which pulls ratios toward 1.
fn working_sets() {
    use std::time::Duration;

    use limiter::policy::{Limit, Policy};

    const SET: u32 = 262_144;
    // Data only: these frames are run in the kernel, never transmitted.
    let frame = |i: u32| {
        let [a, b, c, d] = (0x0a00_0000 + i).to_be_bytes();
        Frame::eth(ETH_P_IP).ipv4(Ipv4Addr::new(a, b, c, d), IPPROTO_UDP, 0, 0).udp().payload(22).bytes
    };
    let open_with = |capacity: u32, new_sources: Option<(u64, u64)>| {
        let p = Policy {
            default: Limit { rate: limiter_common::gcra::MAX_RATE, burst: 1 << 40, ..Policy::default().default },
            v4_prefix: 32,
            capacity,
            new_sources,
            ..Policy::default()
        };
        let mut l = kernel::open_bench(&p.compile(1).unwrap(), capacity);
        for prog in [programs::LIMITER, programs::BASELINE_DROP] {
            l.load_program(prog).unwrap();
        }
        l
    };
    let open = |capacity: u32| open_with(capacity, None);
    let mean = |l: &mut limiter::dataplane::DataPlane, prog: &'static str, range: std::ops::Range<u32>| {
        let n = range.len();
        let total: Duration = range.map(|i| l.test_run(prog, &frame(i), 1).unwrap().1).sum();
        total.as_secs_f64() * 1e9 / n as f64
    };
    // Room to spare: an LRU map evicts before it is exactly full.
    let mut l = open(2 * SET);
    let _warm = mean(&mut l, programs::LIMITER, 0..SET);
    let tracked = l.tracked();
    assert!(tracked >= SET as usize, "working set not resident: {tracked}");
    // Churn: a full map of SET entries, every frame a new source.
    let mut full = open(SET);
    let _fill = mean(&mut full, programs::LIMITER, 0..SET);
    // The same churn with the new-source budget on and spent (1 new prefix
    // a second): new sources are dropped without touching the LRU.
    let mut budget = open_with(SET, Some((1, 1)));
    let started = std::time::Instant::now();
    // Interleaved rounds, as for the hit path: the per-call overhead of
    // BPF_PROG_TEST_RUN (in every row) drifts on this VM; each row's least
    // disturbed round is its figure. Churn rounds each use fresh sources.
    let mut rows = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    for r in 0..WS_ROUNDS {
        let fresh = |k: u32| (k * WS_ROUNDS + r + 1) * SET..(k * WS_ROUNDS + r + 2) * SET;
        rows[0].push(mean(&mut l, programs::BASELINE_DROP, 0..SET));
        rows[1].push(mean(&mut l, programs::LIMITER, 0..SET));
        rows[2].push(mean(&mut full, programs::LIMITER, fresh(0)));
        rows[3].push(mean(&mut budget, programs::LIMITER, fresh(1)));
    }
    let [bare, hits, churn, churn_budget] = rows.map(|v| v.into_iter().fold(f64::INFINITY, f64::min));
    // 1 a second, burst 1: at most 1 + elapsed seconds of new buckets.
    let allowed = 2 + usize::try_from(started.elapsed().as_secs()).unwrap_or(usize::MAX - 2);
    assert!(budget.tracked() <= allowed, "the spent budget still created buckets");
    println!("{:<44} {:>10} {:>12}", format!("one call per frame, {WS_ROUNDS} rounds"), "ns/packet", "x bare drop");
    println!("{:<44} {:>10.1} {:>12.2}", "bare XDP_DROP", bare, 1.0);
    println!("{:<44} {:>10.1} {:>12.2}", "limiter, 262,144 prefixes, all hits", hits, hits / bare);
    println!("{:<44} {:>10.1} {:>12.2}", "limiter, churn (new source each, map full)", churn, churn / bare);
    println!("{:<44} {:>10.1} {:>12.2}", "limiter, churn, new-source budget spent", churn_budget, churn_budget / bare);
    println!("goal: 262,144 prefixes at most 8x -> {}", if hits / bare <= 8.0 { "met" } else { "NOT met" });
    println!(
        "goal: churn at most 5x -> {} (budget off), {} (budget on)",
        if churn / bare <= 5.0 { "met" } else { "NOT met" },
        if churn_budget / bare <= 5.0 { "met" } else { "NOT met" }
    );

    // Kernel memory of the bucket map, from its memlock, per entry.
    let md = aya::maps::MapData::from_id(l.buckets_map_id()).unwrap();
    let fd = {
        use std::os::fd::{AsFd as _, AsRawFd as _};
        md.fd().as_fd().as_raw_fd()
    };
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap();
    let memlock: f64 = info.lines().find_map(|l| l.strip_prefix("memlock:")).unwrap().trim().parse().unwrap();
    let capacity = f64::from(l.capacity());
    println!("{:<44} {:>10.1}", "bucket map memlock per prefix of capacity (B)", memlock / capacity);
}

/// Accuracy after the case study (docs/design.md): admitted over declared
/// (burst + rate x 60 s, busiest 60 s window) for its three arrival
/// patterns through the injected clock, false drops of conforming
/// patterns, and one prefix flooded from both CPUs at once over a veth.
fn accuracy() {
    const T0: u64 = 1_000_000_000_000;
    let frame = Frame::eth(ETH_P_IP).ipv4(Ipv4Addr::new(198, 18, 10, 1), IPPROTO_UDP, 0, 0).udp().bytes;
    let replay = |rate: u64, burst: u64, times_ms: &[u64]| -> Vec<u64> {
        let mut l = kernel::open(&kernel::config(rate, burst, false, 24, 56));
        times_ms
            .iter()
            .copied()
            .filter(|t| {
                l.set_test_clock(T0 + t * 1_000_000).unwrap();
                l.test_run(programs::LIMITER_TEST_CLOCK, &frame, 1).unwrap().0 == kernel::XDP_PASS
            })
            .collect()
    };
    let [(_, uniform, _), (_, piled, _), (_, spaced, _)] = limiter_tests::study::patterns();
    let at_rate: Vec<u64> = (0..1800).map(|i| i * 100).collect();
    println!("{:<44} {:>10} {:>12}", "accuracy (rate 10/s, burst 60; case study)", "admitted", "x declared");
    for (name, times) in
        [("uniform at 2x the rate", &uniform), ("piled at the boundary", &piled), ("spaced at the limit", &spaced)]
    {
        let adm = replay(10, 60, times);
        println!("{:<44} {:>10} {:>12.3}", name, adm.len(), limiter_tests::fleet::busiest(&adm, 60_000) as f64 / 660.0);
    }
    for (name, burst, times) in [
        ("false drops: spaced at the limit, burst 600", 600, &spaced),
        ("false drops: uniform at the rate, burst 1", 1, &at_rate),
    ] {
        let adm = replay(10, burst, times);
        println!("{:<44} {:>10}", name, times.len() - adm.len());
    }
    window::accuracy(&uniform, &piled, &spaced);
    println!();
    two_cpu_flood();
}

/// One /24 flooded from both CPUs at once, and a conforming /24 sending
/// from both (`scenario::two_cpus`): admitted over burst + rate x T, and
/// the conforming /24's losses.
fn two_cpu_flood() {
    use limiter_tests::scenario;

    let (limiter, netload) = (scenario::locate_bin("limiter").unwrap(), scenario::locate_bin("netload").unwrap());
    let o = scenario::two_cpus(&limiter, &netload, 1000, 200, 3.0, 400).unwrap();
    let declared = 200.0 + 1000.0 * o.flood_secs;
    let x = o.flood_got as f64 / declared;
    println!("{:<44} {:>10} {:>12.3}", format!("one /24 from 2 CPUs ({} pkts sent)", o.flood_sent), o.flood_got, x);
    println!("{:<44} {:>10}", "false drops: conforming /24 at 400/s, 2 CPUs", o.conform_sent - o.conform_got);
    println!(
        "goal: one /24 from 2 CPUs admitted at most 1.05x the bound -> {}",
        if x <= 1.05 { "met" } else { "NOT met" }
    );
}

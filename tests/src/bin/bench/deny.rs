//! `bench deny`: the deny set with 1, 10,000, 100,000 and 1,000,000
//! networks loaded (a mix of IPv4 /32, /24, /16 and IPv6 /128, /64,
//! /48), beside xdp-filter's drop and pass in the same rounds: a denied
//! address inside a bucket that holds finer denied networks, a source in
//! a denied /16, and an admitted one; how long loading takes, how long
//! replacing the whole set takes and its longest single kernel call, and
//! the memory per network (issue: a million denied prefixes at a hash
//! lookup's cost).

use std::{
    collections::HashSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::{Duration, Instant},
};

use ipnet::IpNet;
use limiter::{
    dataplane::{DataPlane, deny::DenySet},
    policy::{Limit, Policy},
};
use limiter_common::programs;
use limiter_tests::{
    kernel,
    packet::{ETH_P_IP, Frame, IPPROTO_UDP},
};

use super::{REPEAT, hit::peer_run, jitlines::JitLines, measure, profile, xdp_filter::XdpFilter};

const ROUNDS: usize = 7;
const SIZES: [usize; 4] = [1, 10_000, 100_000, 1_000_000];

/// `n` denied networks, none overlapping another: the frame's /32 first,
/// then the frame's /16 (from 10 on), then IPv4 /32s, /24s and /16s and
/// IPv6 /128s, /64s and /48s in turn (`tag` makes another set of the
/// same shape, for a replacement).
fn denied(n: usize, tag: u32) -> HashSet<IpNet> {
    let v4 = |a: u32, len: u8| IpNet::new(IpAddr::V4(Ipv4Addr::from(a)), len).expect("valid");
    let v6 = |a: u128, len: u8| IpNet::new(IpAddr::V6(Ipv6Addr::from(a)), len).expect("valid");
    let mut out = HashSet::with_capacity(n);
    out.insert(v4(u32::from(Ipv4Addr::new(198, 18, 5, 1)), 32));
    if n >= 10 {
        out.insert(v4(u32::from(Ipv4Addr::new(198, 19, 0, 0)), 16));
    }
    let (tag4, tag6) = (tag << 27, u128::from(tag) << 100);
    for i in 0..u32::try_from(n).expect("fits") {
        if out.len() >= n {
            break;
        }
        let k = i / 6;
        let net = match i % 6 {
            0 => v4((10 << 24 | tag4) + k, 32),
            1 => v4((20 << 24 | tag4) + (k << 8), 24),
            // IPv4 holds 65,536 /16s: 8,192 of them, then more /32s.
            2 if k < 8192 => v4((64 << 24 | tag4) + (k << 16), 16),
            2 => v4((40 << 24 | tag4) + k, 32),
            3 => v6(0x2400_0000_0000_0000_0000_0000_0000_0000 | tag6 | u128::from(k), 128),
            4 => v6(0x2600_0000_0000_0000_0000_0000_0000_0000 | tag6 | u128::from(k) << 64, 64),
            _ => v6(0x2800_0000_0000_0000_0000_0000_0000_0000 | tag6 | u128::from(k) << 80, 48),
        };
        out.insert(net);
    }
    out
}

/// Load `nets` into a fresh set and the kernel; the seconds it took.
fn load(l: &mut DataPlane, set: &mut DenySet, nets: &HashSet<IpNet>) -> f64 {
    let start = Instant::now();
    let o = set.origin("bench").expect("origin");
    set.replace(o, nets).expect("fits");
    let ch = set.finish();
    l.maps.tables().write_deny(&ch).expect("write");
    start.elapsed().as_secs_f64()
}

/// This process's resident memory, bytes.
pub fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    statm.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()).unwrap_or(0) * 4096
}

pub fn deny() {
    let frame = |a: [u8; 4]| Frame::eth(ETH_P_IP).ipv4(Ipv4Addr::from(a), IPPROTO_UDP, 0, 0).udp().payload(22).bytes;
    let (finer, coarse, other) = (frame([198, 18, 5, 1]), frame([198, 19, 7, 1]), frame([198, 18, 6, 1]));
    let Some(peer) = XdpFilter::deny(Ipv4Addr::new(198, 18, 5, 1)) else { return };
    println!("deny set, {ROUNDS} interleaved rounds of {REPEAT} runs, 64-byte UDP/IPv4 frame, beside xdp-filter");
    println!(
        "{:>9} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9}",
        "networks", "load s", "/32 ns", "/16 ns", "admit ns", "xf drop", "xf pass", "/32/xfd", "/16/xfd", "admit/xfp"
    );
    let mut goals = Vec::new();
    let mut first = None;
    for n in SIZES {
        let policy = Policy {
            default: Limit { rate: limiter_common::gcra::MAX_RATE, burst: 1 << 40, ..Policy::default().default },
            capacity: 1024,
            v6_prefix: 64,
            ..Policy::default()
        };
        let compiled = policy.compile(1).expect("policy");
        let mut l = kernel::open_bench(&compiled, 1024);
        l.maps.apply(&compiled).expect("apply");
        let nets = denied(n, 0);
        let mut set = DenySet::new(2_000_000, 24, 64);
        let rss0 = rss();
        let load_s = load(&mut l, &mut set, &nets);
        let user_bytes = rss().saturating_sub(rss0);
        l.load_program(programs::LIMITER).expect("load");
        let mut rows: [Vec<f64>; 5] = Default::default();
        for _ in 0..ROUNDS {
            rows[0].push(measure(&mut l, programs::LIMITER, &finer, kernel::XDP_DROP));
            if n >= 10 {
                rows[1].push(measure(&mut l, programs::LIMITER, &coarse, kernel::XDP_DROP));
            }
            rows[2].push(measure(&mut l, programs::LIMITER, &other, kernel::XDP_PASS));
            rows[3].push(peer_run(&peer, &finer, kernel::XDP_DROP));
            rows[4].push(peer_run(&peer, &other, kernel::XDP_PASS));
        }
        let [fine, coarse_ns, admit, xf_drop, xf_pass] = rows.map(|mut v| {
            v.sort_by(f64::total_cmp);
            v.first().copied().unwrap_or(f64::NAN)
        });
        println!(
            "{n:>9} {load_s:>7.2} {fine:>8.1} {coarse_ns:>8.1} {admit:>8.1} {xf_drop:>8.1} {xf_pass:>8.1} {:>9.2} {:>9.2} {:>9.2}",
            fine / xf_drop,
            coarse_ns / xf_drop,
            admit / xf_pass
        );
        let met = |ok: bool| if ok { "met" } else { "NOT met" };
        let worst = if coarse_ns.is_nan() { fine } else { fine.max(coarse_ns) };
        goals.push(format!(
            "{n}: deny at most 1.1x xdp-filter's drop {}, admitted at most 1.1x its pass {}, loaded within 5 s {}",
            met(worst <= 1.1 * xf_drop),
            met(admit <= 1.1 * xf_pass),
            met(load_s <= 5.0)
        ));
        if first.is_none() {
            first = Some(l);
        } else if n == 1_000_000 {
            replace_whole(&mut l, set, n, user_bytes, &mut goals);
        }
    }
    for g in goals {
        println!("goal: {g}");
    }
    if let Some(l) = first.as_mut().filter(|_| profile::wanted()) {
        profile_deny(l, &finer);
    }
}

/// Replace a set of `n` networks by another of the same shape (adds
/// before removes, in changes of 4,096 networks) on CPU 0, while a
/// real-time (`SCHED_FIFO`) thread spins on CPU 1 reading the clock: the
/// longest gap between two reads is the longest time CPU 1 could not run
/// it, which only the kernel's own non-preemptible work takes (softirqs,
/// interrupts, sections with preemption off: where a packet would wait),
/// beside the longest in as long a quiet time after. (A packet run
/// would not do: each BPF_PROG_TEST_RUN of XDP waits for the kernel's
/// XDP dispatcher to be updated, tens of ms here.) And the memory per
/// network, kernel and daemon.
fn replace_whole(l: &mut DataPlane, set: DenySet, n: usize, user_bytes: u64, goals: &mut Vec<String>) {
    let kernel_bytes = l.maps.tables().deny_memory().unwrap_or(0);
    let mut tables = l.maps.take_tables().expect("the tables");
    let worker = std::thread::spawn(move || {
        kernel::pin_to_cpu(0);
        let mut set = set;
        let next = denied(n, 1);
        let o = set.origin("bench").expect("origin");
        let old: Vec<IpNet> = set.of(o).filter(|n| !next.contains(n)).collect();
        let start = Instant::now();
        let adds: Vec<&IpNet> = next.iter().collect();
        for chunk in adds.chunks(4096) {
            for n in chunk {
                set.add(o, n).expect("fits");
            }
            tables.write_deny(&set.finish()).expect("write");
        }
        for chunk in old.chunks(4096) {
            for n in chunk {
                set.remove(o, n);
            }
            tables.write_deny(&set.finish()).expect("write");
        }
        start.elapsed()
    });
    kernel::pin_to_cpu(1);
    let during = spin_until(&|| worker.is_finished());
    let took = worker.join().expect("the replacement");
    let quiet_until = Instant::now() + took;
    let before = spin_until(&|| Instant::now() >= quiet_until);
    #[expect(clippy::cast_precision_loss, reason = "a report")]
    let per = |b: u64| b as f64 / n as f64;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "replaced {n} networks by {n} others in {:.2} s (adds before removes); CPU 1 taken from a spinning \
         thread at most {:.2} ms meanwhile, {:.2} ms in as long a quiet time after; memory per network: \
         {:.0} B in the kernel (DENY's memlock, markers included), {:.0} B in the daemon",
        took.as_secs_f64(),
        ms(during),
        ms(before),
        per(kernel_bytes),
        per(user_bytes)
    );
    let met = if during <= Duration::from_millis(10) { "met" } else { "NOT met" };
    goals.push(format!("replacing {n}: no CPU stalled over 10 ms {met}"));
}

/// Spin on this thread (under `SCHED_FIFO`) reading the clock until
/// `until`, 800 ms of each second, resting 200 (uncounted: under the
/// kernel's real-time throttle, 950 ms a second, it is never the
/// throttle that takes the CPU); the longest gap between two reads.
pub fn spin_until(until: &dyn Fn() -> bool) -> Duration {
    let fifo = realtime();
    let mut worst = Duration::ZERO;
    while !until() {
        let (start, mut last) = (Instant::now(), Instant::now());
        while !until() && start.elapsed() < Duration::from_millis(800) {
            let now = Instant::now();
            worst = worst.max(now - last);
            last = now;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    normal(fifo);
    worst
}

/// This thread under `SCHED_FIFO` (priority 10); whether it is.
fn realtime() -> bool {
    let p = libc::sched_param { sched_priority: 10 };
    // SAFETY: this thread, a valid sched_param.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &raw const p) == 0 }
}

/// This thread back under the normal scheduler.
fn normal(was_fifo: bool) {
    if was_fifo {
        let p = libc::sched_param { sched_priority: 0 };
        // SAFETY: as above.
        unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &raw const p) };
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
    profile::print("a denied source's packet, 1 network denied", 0, &bare, &deny);
}

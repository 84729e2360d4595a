//! Bench b: a system flood over a veth pair, the XDP limiter side by side
//! with the same per-/24 limit done by nftables and by iptables.
//!
//! Generator: BPF_PROG_TEST_RUN in live-frames mode from the sender
//! namespace, on CPU 0 (see `limiter-ebpf/src/bench.rs`), so frames reach
//! the receiving veth as `xdp_frame`s, as from a NIC, rather than as socket
//! buffers the sender already paid for. A conforming sender (a UDP socket,
//! 50 packets/s from 198.18.2.10, also on CPU 0) runs through each flood.
//!
//! Every row gets a fresh namespace pair and its own filter, and the
//! receiver is placed in two ways, each its own table:
//!
//! - Same CPU: the receiving veth's softirq runs on CPU 0 with the
//!   generator. Cost is CPU 0's busy time (from /proc/stat) over the flood,
//!   the generator's included in every row alike; the `XDP_DROP` row
//!   calibrates the generator, and its cost per frame is subtracted in the
//!   "receiver only" column. Frames reach the receiver hot in cache.
//! - Own CPU: the receiving veth's NAPI runs threaded (`threaded` = 1), its
//!   threads pinned to CPU 1, so everything the receiver does (its XDP
//!   program; for the netfilter rows also the socket buffer and the hook)
//!   runs on CPU 1 and nothing else does. Cost is CPU 1's busy time. Every
//!   frame then comes from another core's cache, and its page goes back to
//!   the generator's page pool across cores under a lock both CPUs take:
//!   `perf record -C 1` during the limiter's row put a third of CPU 1 in
//!   that lock's slow path and under a tenth in the limiter itself. That
//!   is a cost of this generator, not of any filter (a NIC's pages belong
//!   to the receiving CPU's own pool), and it is in every row alike, so
//!   it compresses the ratios of this table.
//!
//! "Drops per CPU-second" is what each filter dropped divided by the cost.

mod receivers;
mod report;

use self::receivers::{dropped, iptables_rules, nft_rules, xdp_filter_on_vb};
pub(crate) use self::receivers::{nft_counter, nft_load, run, veth_stat};
use std::{
    process::{Command, Stdio},
    time::Duration,
};

use crate::{
    jitlines::JitLines,
    profile::{self, Profile},
};
use limiter::dataplane::{AttachMode, DataPlane};
use limiter_common::programs;
use limiter_tests::{
    kernel,
    netns::{A_IF, B_ADDR, B_IF, NetNs, VethPair},
    packet::{ETH_P_IP, Frame, IPPROTO_UDP},
    scenario,
};

const RATE: u64 = 100;
const BURST: u64 = 20;
const SECS: f64 = 3.0;
const CONFORM_PPS: u64 = 50;
const ENTRIES: u32 = 262_144;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Filter {
    /// Bare `XDP_DROP`: the generator's own cost.
    Drop,
    /// `XDP_DROP` after reading the source address.
    TouchDrop,
    Limiter,
    Nft,
    /// iptables through its default (nf_tables) backend.
    Iptables,
    IptablesLegacy,
    /// xdp-filter (xdp-tools) with the flood's source denied.
    XdpFilt,
    /// The limiter with the flood's source in its deny set.
    LimiterDeny,
}

impl Filter {
    fn label(self) -> &'static str {
        match self {
            Self::Drop => "bare XDP_DROP (generator cost)",
            Self::TouchDrop => "XDP_DROP after reading the header",
            Self::Limiter => "limiter (XDP)",
            Self::Nft => "nftables netdev ingress meter",
            Self::Iptables => "iptables raw hashlimit (nft backend)",
            Self::IptablesLegacy => "iptables-legacy raw hashlimit",
            Self::XdpFilt => "xdp-filter, the source denied",
            Self::LimiterDeny => "limiter, the source in its deny set",
        }
    }

    /// A receiver that drops everything, conforming packets included.
    fn drops_all(self) -> bool {
        matches!(self, Self::Drop | Self::TouchDrop)
    }

    fn netfilter(self) -> bool {
        matches!(self, Self::Nft | Self::Iptables | Self::IptablesLegacy)
    }
}

/// Where the receiving veth's packet processing runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Softirq on CPU 0, with the generator.
    SameCpu,
    /// Threaded NAPI pinned to CPU 1.
    OwnCpu,
}

#[derive(Clone, Copy)]
enum Shape {
    /// Every frame from 198.18.1.10.
    One,
    /// A random source in 198.19.0.0/16 per frame: 256 /24s.
    Spread,
}

struct Row {
    filter: Filter,
    /// Frames the generator sent.
    frames: u64,
    /// Frames that reached the receiver's XDP program (the rest overflowed
    /// the veth ring).
    received: u64,
    dropped: u64,
    /// Busy time of the CPU the receiver runs on (CPU 0, shared with the
    /// generator, or CPU 1 on its own) and of CPU 0 (the generator).
    cpu_secs: f64,
    gen_secs: f64,
    conform_sent: u64,
    conform_lost: u64,
    /// Where CPU 0's time went (`LIMITER_BENCH_PROFILE`, generator's CPU).
    profile: Profile,
}

/// The cells every table starts with: receiver, sent, received, dropped.
fn head(r: &Row) -> String {
    let m = |n: u64| n as f64 / 1e6;
    format!("{:<38} {:>7.2}M {:>7.2}M {:>7.2}M", r.filter.label(), m(r.frames), m(r.received), m(r.dropped))
}

/// Conforming packets lost of those sent ("-" where the receiver drops all).
fn conform(r: &Row) -> String {
    if r.filter.drops_all() { "-".into() } else { format!("{}/{}", r.conform_lost, r.conform_sent) }
}

/// Busy ticks of CPU 0 (the generator) and CPU 1 (the receiver).
pub(crate) fn busy_ticks() -> [u64; 2] {
    let stat = std::fs::read_to_string("/proc/stat").expect("read /proc/stat");
    [0, 1].map(|cpu| {
        let line = stat.lines().find(|l| l.starts_with(&format!("cpu{cpu} "))).expect("cpu in /proc/stat");
        let v: Vec<u64> = line.split_whitespace().skip(1).map(|x| x.parse().unwrap()).collect();
        // user nice system idle iowait irq softirq steal (guest is in user).
        v.iter().take(8).sum::<u64>() - v[3] - v[4]
    })
}

/// PIDs of the kernel's threaded-NAPI threads of every `B_IF`.
pub(crate) fn napi_threads() -> Vec<i32> {
    let prefix = format!("napi/{B_IF}-");
    std::fs::read_dir("/proc")
        .expect("read /proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.starts_with(&prefix)))
        .collect()
}

/// Run the receiving veth's NAPI in threads of its own, pinned to CPU 1.
pub(crate) fn receiver_on_cpu1(ns: &NetNs) {
    let before = napi_threads();
    run(ns.command("sh").args(["-c", &format!("echo 1 > /sys/class/net/{B_IF}/threaded")]));
    let ours: Vec<i32> = napi_threads().into_iter().filter(|p| !before.contains(p)).collect();
    assert!(!ours.is_empty(), "no NAPI thread appeared for {B_IF}");
    for pid in ours {
        pin_to_cpu(pid, 1);
    }
}

fn one_row(filter: Filter, shape: Shape, place: Place) -> Row {
    let net = VethPair::new("sf");
    net.a.ip(&format!("link set {A_IF} address 02:00:00:00:00:01"));
    net.b.ip(&format!("link set {B_IF} address 02:00:00:00:00:02"));
    net.add_source(scenario::CONFORM_SRC);

    // The receiver: an XDP program on vb (the limiter, a bare drop, or a
    // pass to the stack where netfilter waits).
    let mut xdp = kernel::open_bench(&kernel::config(RATE, BURST, false, 24, 56), ENTRIES);
    let prog = match filter {
        Filter::Drop => programs::BASELINE_DROP,
        Filter::TouchDrop => programs::BENCH_TOUCH_DROP,
        Filter::Limiter | Filter::LimiterDeny => programs::LIMITER,
        _ => programs::BENCH_PASS,
    };
    if filter == Filter::LimiterDeny {
        let mut set = limiter::dataplane::deny::DenySet::new(16, 24, 56);
        let o = set.origin("bench").expect("origin");
        set.add(o, &"198.18.1.10/32".parse().expect("a network")).expect("room");
        xdp.maps.tables().write_deny(&set.finish()).expect("write the deny set");
    }
    if filter == Filter::XdpFilt {
        xdp_filter_on_vb(&net.b);
    } else {
        net.b.run_in(|| xdp.attach_entry(prog, B_IF, AttachMode::Native).expect("attach to vb"));
    }
    if place == Place::OwnCpu {
        receiver_on_cpu1(&net.b);
    }
    match filter {
        Filter::Nft => nft_load(&net.b, &nft_rules()),
        Filter::Iptables => iptables_rules("iptables", &net.b),
        Filter::IptablesLegacy => iptables_rules("iptables-legacy", &net.b),
        Filter::Drop | Filter::TouchDrop | Filter::Limiter | Filter::XdpFilt | Filter::LimiterDeny => {}
    }

    let netload = scenario::locate_bin("netload").unwrap();
    let port = scenario::PORT;
    let mut recv = net.b.command("taskset");
    recv.args(["-c", "0"]).arg(&netload).args(["recv", &format!("0.0.0.0:{port}"), &format!("{}", SECS + 3.0)]);
    let (mut recv, recv_rx) = scenario::spawn_lines(recv).unwrap();
    scenario::wait_for(&recv_rx, "ready", Duration::from_secs(10), &mut String::new()).unwrap();
    let mut conform = Command::new("ip");
    conform.args(["netns", "exec", &net.a.name, "taskset", "-c", "0"]).arg(&netload).args([
        "send",
        scenario::CONFORM_SRC,
        &format!("{B_ADDR}:{port}"),
        &CONFORM_PPS.to_string(),
        &format!("{}", SECS + 1.0),
    ]);
    let conform = scenario::Guard(conform.stdout(Stdio::piped()).spawn().unwrap());
    std::thread::sleep(Duration::from_millis(500));

    let ip = match shape {
        Shape::One => std::net::Ipv4Addr::new(198, 18, 1, 10),
        Shape::Spread => std::net::Ipv4Addr::new(198, 19, 0, 1),
    };
    let frame = Frame::eth(ETH_P_IP).ipv4(ip, IPPROTO_UDP, 0, 0).udp_to(port).payload(18).on_the_wire();
    let generator = match shape {
        Shape::One => programs::BENCH_TX,
        Shape::Spread => programs::BENCH_TX_SPREAD,
    };
    let (frames, received, dropped, [gen_secs, cpu_secs], profile) = net.a.run_in(|| {
        pin_to_cpu(0, 0);
        let mut g = DataPlane::open_bench(1024).expect("load the generator");
        // Each call costs two RCU grace periods (the kernel swaps the XDP
        // dispatcher in and out), idle time that would leave the receiver
        // half idle: size one call to last about SECS from a short probe.
        let probe = g.test_run_live(generator, &frame, A_IF, 1 << 20).expect("live-frames run");
        #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "clamped to 1e6..=2e8")]
        let repeat = (SECS / probe.as_secs_f64().max(1e-9)).clamp(1e6, 2e8) as u32;
        let (d0, r0) = (dropped(filter, &net.b, &xdp), veth_stat(&net.b, B_IF, "_xdp_packets"));
        let perf = (profile::wanted() && place == Place::SameCpu).then(|| profile::Recording::start(0));
        let b0 = busy_ticks();
        g.test_run_live(generator, &frame, A_IF, repeat).expect("live-frames run");
        // The receiver may still be draining the ring.
        std::thread::sleep(Duration::from_millis(100));
        let b1 = busy_ticks();
        let lines = (perf.is_some() && filter == Filter::Limiter).then(|| JitLines::of("limiter")).flatten();
        let profile = perf.map(|p| p.stop(u64::from(repeat), lines.as_ref())).unwrap_or_default();
        let (d1, r1) = (dropped(filter, &net.b, &xdp), veth_stat(&net.b, B_IF, "_xdp_packets"));
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        (u64::from(repeat), r1 - r0, d1 - d0, [0, 1].map(|c| (b1[c] - b0[c]) as f64 / hz), profile)
    });
    let cpu_secs = if place == Place::OwnCpu { cpu_secs } else { gen_secs };

    let conform_out = scenario::wait_output(conform).unwrap();
    assert!(recv.0.wait().unwrap().success(), "receiver failed");
    let log: String = recv_rx.iter().map(|l| l + "\n").collect();
    // Offered, the full ring's refusals included: the ring's losses are
    // what this column measures.
    let conform_sent =
        scenario::field(&conform_out, "sent", 1).unwrap() + scenario::named(&conform_out, "ring_full").unwrap_or(0);
    let conform_got = scenario::field(&log, &format!("from {}", scenario::CONFORM_SRC), 2).unwrap_or(0);
    Row {
        filter,
        frames,
        received,
        dropped,
        cpu_secs,
        gen_secs,
        conform_sent,
        conform_lost: conform_sent.saturating_sub(conform_got),
        profile,
    }
}

/// Pin `pid` (0: the calling thread) to one CPU.
pub(crate) fn pin_to_cpu(pid: i32, cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_setaffinity
    // only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        let rc = libc::sched_setaffinity(pid, size_of::<libc::cpu_set_t>(), &raw const set);
        assert_eq!(rc, 0, "pin {pid} to CPU {cpu}: {}", std::io::Error::last_os_error());
    }
}

/// Rounds per row, interleaved so drift on a noisy VM hits every row
/// alike; each row prints its least disturbed round.
const ROUNDS: usize = 5;

/// Why this kernel refuses the live-frames generator, if it does (6.18.44
/// of the bench's own machines answers EPERM), tried on a veth pair of
/// its own.
fn live_frames_refused() -> Option<String> {
    let net = VethPair::new("lf");
    let frame = Frame::eth(ETH_P_IP).ipv4(std::net::Ipv4Addr::new(198, 18, 1, 10), IPPROTO_UDP, 0, 0);
    let frame = frame.udp_to(scenario::PORT).payload(18).on_the_wire();
    net.a.run_in(|| {
        let mut g = DataPlane::open_bench(1024).expect("load the generator");
        g.test_run_live(programs::BENCH_TX, &frame, A_IF, 1).err().map(|e| format!("{e:?}"))
    })
}

pub fn system_flood() {
    if let Some(why) = live_frames_refused() {
        println!(
            "system flood: not run, this kernel refuses BPF_PROG_TEST_RUN in live-frames mode, the generator ({why}); \
             `bench system-tcp-state` uses a socket generator instead"
        );
        return;
    }
    // LIMITER_BENCH_QUICK=1: only the XDP rows on the generator's CPU, for
    // work on the program's live cost (a few minutes instead of twenty).
    let quick = std::env::var_os("LIMITER_BENCH_QUICK").is_some();
    // xdp-filter denies addresses one by one: its rows (and the deny
    // set's beside them) are for the one-source flood only.
    let filters = |shape: Shape| -> Vec<Filter> {
        let mut f = vec![Filter::Drop, Filter::TouchDrop, Filter::Limiter];
        if !quick {
            f.extend([Filter::Nft, Filter::Iptables, Filter::IptablesLegacy]);
        }
        if matches!(shape, Shape::One) {
            f.extend([Filter::XdpFilt, Filter::LimiterDeny]);
        }
        f
    };
    let places: &[Place] = if quick { &[Place::SameCpu] } else { &[Place::SameCpu, Place::OwnCpu] };
    for (shape, title) in [(Shape::One, "one /24 (198.18.1.10)"), (Shape::Spread, "random sources over 256 /24s")] {
        for &place in places {
            let filters = filters(shape);
            let mut runs: Vec<Vec<Row>> = filters.iter().map(|_| Vec::new()).collect();
            for _ in 0..ROUNDS {
                for (i, f) in filters.iter().enumerate() {
                    runs[i].push(one_row(*f, shape, place));
                }
            }
            let rows: Vec<Row> = runs.into_iter().map(best_round).collect();
            if profile::wanted() && place == Place::SameCpu {
                profile::print(title, 0, &rows[0].profile, &rows[2].profile);
            }
            report::deny_goal(title, &rows);
            if quick {
                let rate = |r: &Row| r.dropped as f64 / r.cpu_secs;
                println!(
                    "system flood, {title}, receiver on the generator's CPU, best of {ROUNDS}: limiter {:.2}M drops/CPU-s, \
                     {:.0}% of a bare XDP_DROP's ({:.2}M); header read + XDP_DROP {:.0}%",
                    rate(&rows[2]) / 1e6,
                    rate(&rows[2]) / rate(&rows[0]) * 100.0,
                    rate(&rows[0]) / 1e6,
                    rate(&rows[1]) / rate(&rows[0]) * 100.0
                );
                continue;
            }
            match place {
                Place::SameCpu => report::print_same_cpu(title, &rows),
                Place::OwnCpu => report::print_own_cpu(title, &rows),
            }
        }
    }
}

/// The least disturbed round (most drops per receiver CPU-second: other
/// load on the VM only ever adds time), with conforming losses of all
/// rounds added up.
fn best_round(mut rounds: Vec<Row>) -> Row {
    let (sent, lost) = rounds.iter().fold((0, 0), |(s, l), r| (s + r.conform_sent, l + r.conform_lost));
    let per_drop = |r: &Row| r.cpu_secs / r.dropped.max(1) as f64;
    rounds.sort_by(|a, b| per_drop(a).total_cmp(&per_drop(b)));
    let best = rounds.swap_remove(0);
    Row { conform_sent: sent, conform_lost: lost, ..best }
}

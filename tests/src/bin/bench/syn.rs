//! `bench syn`: SYN cookies, side by side in one run.
//!
//! (a) Per SYN, through BPF_PROG_TEST_RUN: the cookie path (a SYN from a
//! prefix without a bucket answered with a SYN-ACK) against a bare
//! `XDP_DROP`. One run per call, both alike: the program turns its frame
//! into a SYN-ACK, so `repeat` would measure that SYN-ACK's path instead.
//! The per-call figure carries the test-run overhead, which only narrows
//! the ratio.
//!
//! (b) The same SYN flood over a veth pair (`netload spoof-syn`, generator
//! on CPU 0, the receiver's NAPI in a thread on CPU 1) answered by XDP's
//! cookies, or by the kernel's own with no limiter (`tcp_syncookies = 2`,
//! a listening socket, an `XDP_PASS` program for the same NAPI path):
//! SYN-ACKs per busy second of the receiving CPU.

use std::{net::Ipv4Addr, process::Command, time::Duration};

use limiter::{
    dataplane::{AttachMode, DataPlane},
    policy::{Class, CostUnit, Limit, Mode, Policy, Protocol, SynCookies},
};
use limiter_common::{Reason, cookie, programs};
use limiter_tests::{
    kernel,
    netns::{A_IF, B_ADDR, B_IF, VethPair},
    packet::{ETH_P_IP, Frame, IPPROTO_TCP},
    scenario,
};

const CALLS: usize = 200_000;
const PORT: u16 = 443;
const FLOOD_SECS: &str = "3";

fn cookie_policy() -> limiter::policy::Compiled {
    let p = Policy {
        v4_prefix: 32,
        classes: vec![Class {
            name: "syn".into(),
            protocol: Protocol::Tcp,
            ports: vec![(PORT, PORT)],
            source_ports: Vec::new(),
            syn: true,
            limit: Limit { rate: 10, burst: 20, cost: CostUnit::Packets, mode: Mode::Enforce, window: None },
            syn_cookies: SynCookies::Always,
            syn_rate: None,
            tcp_state: None,
            criticality: limiter::policy::Criticality::Default,
        }],
        ..Policy::default()
    };
    p.compile(1).expect("a valid policy")
}

pub fn syn() {
    per_packet();
    println!();
    flood();
}

/// `syn` (Ethernet, IPv4 without options, a 20-byte TCP header) with
/// `options` after its TCP header, lengths and IPv4 checksum fixed.
fn with_options(syn: &[u8], options: &[u8]) -> Vec<u8> {
    let mut f = syn[..54].to_vec();
    f.extend_from_slice(options);
    f[46] = u8::try_from((20 + options.len()) / 4).expect("a TCP header") << 4;
    let total = u16::try_from(40 + options.len()).expect("a short frame");
    f[16..18].copy_from_slice(&total.to_be_bytes());
    f[24..26].copy_from_slice(&[0, 0]);
    let sum = limiter_common::cookie::fold(limiter_common::cookie::sum16(&f[14..34], 0));
    f[24..26].copy_from_slice(&sum.to_be_bytes());
    f
}

fn per_packet() {
    let plain = Frame::eth(ETH_P_IP).ipv4(Ipv4Addr::new(198, 19, 7, 9), IPPROTO_TCP, 0, 0).tcp_to(PORT, 0x02);
    let plain = plain.on_the_wire();
    // A Linux SYN: MSS, SACK permitted, timestamps, NOP, window scale.
    let linux = [2, 4, 0x05, 0xb4, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7];
    let mut all = cookie_policy();
    all.config.cookies.opts = cookie::opt::TIMESTAMPS | cookie::opt::SACK | cookie::opt::WSCALE;
    all.config.cookies.wscale = 7;
    println!("SYN cookies, BPF_PROG_TEST_RUN, {CALLS} interleaved calls of one run each, median ns per call");
    println!("{:<52} {:>10} {:>12}", "program", "ns/call", "x bare drop");
    let rows = [
        ("limiter: a SYN without options, MSS only", cookie_policy(), plain.clone()),
        ("limiter: a Linux SYN, tcp_timestamps = 1 (MSS only)", cookie_policy(), with_options(&plain, &linux)),
        ("limiter: a Linux SYN, tcp_timestamps = 2 (all four)", all, with_options(&plain, &linux)),
    ];
    for (i, (label, policy, syn)) in rows.into_iter().enumerate() {
        let (bare, cookie) = cookie_row(&policy, &syn);
        if i == 0 {
            println!("{:<52} {bare:>10.0} {:>12.2}", "bare XDP_DROP", 1.0);
        }
        println!("{label:<52} {cookie:>10.0} {:>12.2}", cookie / bare);
    }
}

/// Median ns per call of a bare drop and of the cookie path on `syn`,
/// interleaved.
fn cookie_row(policy: &limiter::policy::Compiled, syn: &[u8]) -> (f64, f64) {
    let syn = syn.to_vec();
    let mut l = kernel::open_bench(policy, 1 << 16);
    l.set_test_clock(9_000_000_000_000).unwrap();
    // The first SYN to the port goes to the kernel (the once-a-second
    // refresh); every later one at this clock is answered here.
    l.test_run(programs::LIMITER_TEST_CLOCK, &syn, 1).unwrap();
    l.load_program(programs::BASELINE_DROP).unwrap();
    let (mut bare, mut cookie) = (Vec::with_capacity(CALLS), Vec::with_capacity(CALLS));
    for _ in 0..CALLS {
        let (a, d) = l.test_run(programs::BASELINE_DROP, &syn, 1).unwrap();
        assert_eq!(a, kernel::XDP_DROP);
        bare.push(d.as_nanos());
        let (a, d) = l.test_run(programs::LIMITER_TEST_CLOCK, &syn, 1).unwrap();
        assert_eq!(a, 3, "XDP_TX: a cookie SYN-ACK");
        cookie.push(d.as_nanos());
    }
    assert_eq!(l.tracked(), 0, "the cookie path stores nothing");
    let median = |mut v: Vec<u128>| {
        v.sort_unstable();
        v[v.len() / 2] as f64
    };
    (median(bare).max(1.0), median(cookie))
}

/// One flood: SYN-ACKs sent and busy seconds of CPU 1.
fn flood_row(xdp_cookies: bool) -> (u64, f64) {
    let net = VethPair::new("sb");
    net.a.ip(&format!("link set {A_IF} address 02:00:00:00:00:01"));
    net.b.ip(&format!("link set {B_IF} address 02:00:00:00:00:02"));
    let ok = net.b.command("sysctl").args(["-qw", "net.ipv4.tcp_syncookies=2"]).status().unwrap();
    assert!(ok.success());
    let _listener = net.b.run_in(|| std::net::TcpListener::bind((B_ADDR, PORT)).unwrap());
    // The generator drops the replies to its spoofed sources in XDP.
    let mut generator = DataPlane::open_bench(1024).unwrap();
    net.a.run_in(|| generator.attach_entry(programs::BENCH_DROP_FLOOD_REPLIES, A_IF, AttachMode::Native).unwrap());
    let mut rx = kernel::open_bench(&cookie_policy(), 1 << 16);
    let prog = if xdp_cookies { programs::LIMITER } else { programs::BENCH_PASS };
    net.b.run_in(|| rx.attach_entry(prog, B_IF, AttachMode::Native).unwrap());
    crate::system::receiver_on_cpu1(&net.b);
    let sent = |rx: &DataPlane| {
        if xdp_cookies {
            rx.maps.totals().unwrap().get(Reason::SynCookieSent).packets
        } else {
            net.b.nstat("TcpExtSyncookiesSent")
        }
    };
    let (s0, b0) = (sent(&rx), crate::system::busy_ticks());
    let netload = scenario::locate_bin("netload").unwrap();
    let out = Command::new("ip")
        .args(["netns", "exec", &net.a.name, "taskset", "-c", "0"])
        .arg(&netload)
        .args(["spoof-syn", A_IF, "02:00:00:00:00:02", &format!("{B_ADDR}:{PORT}"), FLOOD_SECS])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::thread::sleep(Duration::from_millis(100));
    let (s1, b1) = (sent(&rx), crate::system::busy_ticks());
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (s1 - s0, (b1[1] - b0[1]) as f64 / hz)
}

fn flood() {
    let (x_sent, x_cpu) = flood_row(true);
    let (k_sent, k_cpu) = flood_row(false);
    let (x_rate, k_rate) = (x_sent as f64 / x_cpu.max(1e-9), k_sent as f64 / k_cpu.max(1e-9));
    println!("SYN flood over a veth pair ({FLOOD_SECS} s, generator on CPU 0, receiver on CPU 1), one run");
    println!("{:<44} {:>12} {:>10} {:>16}", "answered by", "SYN-ACKs", "CPU 1 s", "per CPU-second");
    println!("{:<44} {x_sent:>12} {x_cpu:>10.2} {x_rate:>16.0}", "limiter: cookies from XDP (XDP_TX)");
    println!("{:<44} {k_sent:>12} {k_cpu:>10.2} {k_rate:>16.0}", "kernel: its own cookies (tcp_syncookies = 2)");
    println!("XDP's SYN-ACKs per CPU-second: {:.2}x the kernel's", x_rate / k_rate.max(1e-9));
}

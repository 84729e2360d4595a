//! Bench `forward`: the limiter's forwarder side by side with haproxy
//! (`mode tcp`, `send-proxy-v2`) and nginx (`stream`, `proxy_protocol
//! on`, which sends version 1), each pinned to CPU 0, with the same client and upstream pinned to
//! CPU 1, all on the loopback of one namespace: new connections a second,
//! bytes a second on long transfers, latency of a small request (median
//! and p99), and for the limiter the CPU cost of a connection refused at
//! its cap.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use limiter::forward::proxy::parse_v2;
use limiter_tests::{
    netns::{NetNs, VethPair, enter},
    scenario::{Guard, unique_socket},
};

use super::{
    fronts,
    rounds::{Fig, ROUNDS, busy_during, median_of, order, verdict},
};

mod cost;
mod http;

const UPSTREAM: u16 = 7100;
pub(super) const SECS: f64 = 2.0;
const BULK: usize = 32 << 20;
/// The long transfer's bytes, made once (not a 32 MiB fill per transfer
/// on the measured CPU).
pub(super) static LONG: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| vec![b'l'; BULK]);

pub(super) fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t with one bit set, for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &raw const set);
    }
}

/// The upstream on CPU 1: after the PROXY header, `c` gets one byte
/// back, `r` 100 bytes, `l` a long transfer; each then waits for the
/// client to close. Event-driven (one runtime thread, a task a
/// connection): with a thread a connection, CPU 1 ran at 100% and bounded
/// the connection rate of every forwarder alike while theirs idled
/// 9-16% (measured 2026-12-03), so the row measured the harness.
fn upstream(ns: &NetNs, stop: Arc<AtomicBool>) -> thread::JoinHandle<()> {
    let name = ns.name.clone();
    thread::spawn(move || {
        enter(&name);
        pin_to_cpu(1);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let l = tokio::net::TcpListener::bind(("127.0.0.1", UPSTREAM)).await.unwrap();
            let accept = async {
                loop {
                    if let Ok((c, _)) = l.accept().await {
                        tokio::spawn(answer(c));
                    }
                }
            };
            let watch = async {
                while !stop.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            };
            tokio::select! {
                () = accept => {}
                () = watch => {}
            }
        });
    })
}

/// One upstream connection: the PROXY header (v2 from the limiter and
/// haproxy, v1 from nginx stream), the request's kind, its answer, then
/// the client's close.
async fn answer(mut c: tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 256];
    let op = loop {
        let header = parse_v2(&buf).map(|p| p.len).or_else(|| {
            buf.starts_with(b"PROXY ").then(|| buf.windows(2).position(|w| w == b"\r\n").map(|i| i + 2))?
        });
        if let Some(len) = header
            && buf.len() > len
        {
            break buf[len];
        }
        match c.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let reply: &[u8] = match op {
        b'r' => &[b'r'; 100],
        b'l' => &LONG,
        _ => b"k",
    };
    let _ = c.write_all(reply).await;
    let _ = c.shutdown().await;
    let _ = c.read(&mut chunk).await;
}

/// One request of kind `op` through `port`: connect, send, read `want`
/// bytes, close with a reset (no TIME_WAIT on the client).
pub(super) fn once(port: u16, op: u8, want: usize) -> Option<usize> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    s.write_all(&[op]).ok()?;
    let mut got = 0;
    let mut buf = vec![0u8; 64 << 10];
    while got < want {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    reset_on_close(&s);
    (got >= want).then_some(got)
}

/// Close with a reset: no TIME_WAIT left on the client side.
pub(super) fn reset_on_close(s: &TcpStream) {
    let l = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: setsockopt on a descriptor we own, with a valid struct.
    unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(s),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&raw const l).cast(),
            u32::try_from(size_of::<libc::linger>()).unwrap_or(8),
        );
    }
}

/// 16 clients on CPU 1 making one-byte connections (`once(port, b'c',
/// 1)`) through `port` for `SECS`: how many were answered and how many
/// were not. Called inside the bench namespace.
pub(super) fn clients(port: u16) -> (u64, u64) {
    let (answered, not) = (AtomicU64::new(0), AtomicU64::new(0));
    let start = Instant::now();
    thread::scope(|s| {
        for _ in 0..16 {
            s.spawn(|| {
                pin_to_cpu(1);
                while start.elapsed().as_secs_f64() < SECS {
                    let n = if once(port, b'c', 1).is_some() { &answered } else { &not };
                    n.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    (answered.into_inner(), not.into_inner())
}

/// Connections a second with 16 clients on CPU 1.
fn conn_rate(ns: &NetNs, port: u16) -> f64 {
    ns.run_in(|| {
        let start = Instant::now();
        clients(port).0 as f64 / start.elapsed().as_secs_f64()
    })
}

/// Bytes a second over 4 connections at once, each making long
/// transfers one after another for `SECS`.
fn throughput(ns: &NetNs, port: u16) -> f64 {
    ns.run_in(|| {
        let start = Instant::now();
        let bytes: usize = thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(move || {
                        pin_to_cpu(1);
                        let mut bytes = 0;
                        while start.elapsed().as_secs_f64() < SECS {
                            match once(port, b'l', BULK) {
                                Some(n) => bytes += n,
                                None => break,
                            }
                        }
                        bytes
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        bytes as f64 / start.elapsed().as_secs_f64()
    })
}

/// Median and p99 of up to 1,000 small requests (at most `SECS`), one at
/// a time, in µs; and how many failed.
fn latency(ns: &NetNs, port: u16) -> (f64, f64, usize) {
    ns.run_in(|| {
        pin_to_cpu(1);
        let start = Instant::now();
        let (mut v, mut failed) = (Vec::new(), 0);
        while v.len() + failed < 1000 && start.elapsed().as_secs_f64() < SECS {
            let t = Instant::now();
            match once(port, b'r', 100) {
                Some(_) => v.push(t.elapsed().as_secs_f64() * 1e6),
                None => failed += 1,
            }
        }
        v.sort_by(f64::total_cmp);
        let at = |q: usize| v.get(v.len() * q / 100).copied().unwrap_or(f64::NAN);
        (at(50), at(99), failed)
    })
}

pub(super) fn wait_port(ns: &NetNs, port: u16) {
    assert!(ns.listens_on(port), "nothing listens on {port}");
}

#[derive(Clone, Copy, Default)]
struct Row {
    name: &'static str,
    conns: f64,
    /// CPU 0 and CPU 1 busy while `conns` was measured, and while
    /// `bytes` was.
    busy: [[f64; 2]; 2],
    bytes: f64,
    p50: f64,
    p99: f64,
}

/// One round of the four fronts' rows, a workload at a time (each
/// workload's rows seconds apart), the fronts in `round`'s order.
fn round(ns: &NetNs, fronts: &[(&'static str, u16); 4], round: usize) -> [Row; 4] {
    let mut rows = fronts.map(|(name, _)| Row { name, ..Row::default() });
    eprintln!("bench forward: round {}: connections, long transfers, latency...", round + 1);
    for i in order(4, round) {
        (rows[i].conns, rows[i].busy[0]) = busy_during(|| conn_rate(ns, fronts[i].1));
    }
    for i in order(4, round) {
        (rows[i].bytes, rows[i].busy[1]) = busy_during(|| throughput(ns, fronts[i].1));
    }
    for i in order(4, round) {
        let failed;
        (rows[i].p50, rows[i].p99, failed) = latency(ns, fronts[i].1);
        if failed > 0 {
            eprintln!("bench forward: {}: {failed} small requests failed", fronts[i].0);
        }
    }
    rows
}

/// The limiter's second forwarder, by buffer.
const BUFFERED: u16 = 7104;

/// A policy with the limiter's two forwarders to the upstream: by splice
/// on 7101, by buffer on `BUFFERED`.
fn two_modes() -> String {
    let splice = fronts::limiter_policy(7101, UPSTREAM, 20_000, "copy = \"splice\"\n");
    splice + &fronts::forward_section("buffered", BUFFERED, UPSTREAM, 20_000, "copy = \"buffer\"\n")
}

/// 1,000 one-byte connections through `port`, unmeasured: a forwarder's
/// first rows after its start ran up to 15% slower (code and kernel
/// state not yet warm).
fn warm(ns: &NetNs, port: u16) {
    wait_port(ns, port);
    ns.run_in(|| {
        for _ in 0..1000 {
            let _ = once(port, b'c', 1);
        }
    });
}

/// A forwarder's figures: the median of its rounds, each on its own.
fn median_row(rounds: &[[Row; 4]], i: usize) -> Row {
    let m = |f: Fig<Row>| median_of(rounds, |r| f(&r[i]));
    Row {
        name: rounds[0][i].name,
        conns: m(|r| r.conns),
        busy: [0, 1].map(|k| [0, 1].map(|c| median_of(rounds, |r| r[i].busy[k][c]))),
        bytes: m(|r| r.bytes),
        p50: m(|r| r.p50),
        p99: m(|r| r.p99),
    }
}

pub fn forward() {
    let net = VethPair::new("bfw");
    for (k, v) in [("net.ipv4.tcp_tw_reuse", "1"), ("net.ipv4.ip_local_port_range", "1024 65000")] {
        let _ = net.b.command("sysctl").args(["-q", "-w", &format!("{k}={v}")]).status();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let up = upstream(&net.b, Arc::clone(&stop));
    let tmp = limiter_tests::kernel::TempDir::new("bfw");
    let dir = &tmp.0;

    // One limiter (PROXY v2) with two forwarders, by splice(2), the
    // default, and by buffer, and the two peers, each on CPU 0, started
    // once and warmed up, each idle while the others' rows run.
    let policy = dir.join("policy.toml");
    std::fs::write(&policy, two_modes()).unwrap();
    let socket = unique_socket("bfw");
    let daemon = fronts::limiter(&net.b, "0", &policy, &socket);
    let peers = [(7102, fronts::haproxy as fronts::Peer), (7103, fronts::nginx_stream)]
        .map(|(port, start)| start(&net.b, dir, "0", port, UPSTREAM));
    let fronts = [
        ("limiter (PROXY v2, splice)", 7101),
        ("limiter (PROXY v2, buffer)", BUFFERED),
        ("haproxy 2.6 (send-proxy-v2)", 7102),
        ("nginx 1.22 stream (PROXY v1)", 7103),
    ];
    for (_, port) in fronts {
        warm(&net.b, port);
    }
    let rounds: Vec<[Row; 4]> = (0..ROUNDS).map(|r| round(&net.b, &fronts, r)).collect();
    drop(peers);
    drop::<Guard>(daemon);
    // The limiter's own costs, each mode in a daemon of its own (one that
    // held connections before keeps their memory for the next): memory,
    // and by splice a refusal at a cap of 1.
    let one = |max: u32, copy: &str| fronts::limiter_policy(7101, UPSTREAM, max, &format!("copy = \"{copy}\"\n"));
    let mut refusal = (0, 0.0);
    let mut idle = Vec::new();
    for (copy, (name, _)) in ["splice", "buffer"].into_iter().zip(fronts) {
        std::fs::write(&policy, one(20_000, copy)).unwrap();
        let socket = unique_socket("bfw");
        let daemon = fronts::limiter(&net.b, "0", &policy, &socket);
        idle.push((name, cost::idle_memory(&net.b, 7101, daemon.0.id())));
        if copy == "splice" {
            refusal = cost::refusal_cost(&net, &policy, &socket, daemon.0.id(), &one(1, copy));
        }
        drop::<Guard>(daemon);
    }
    let (refused, refused_us) = refusal;
    let rows: Vec<Row> = (0..4).map(|i| median_row(&rounds, i)).collect();
    stop.store(true, Ordering::Relaxed);
    let _ = up.join();
    let http = http::LAYOUTS.map(|l| (l, http::rows(&net, dir, l)));

    println!(
        "forwarders on CPU 0, client and upstream on CPU 1, loopback, {SECS} s a row, median of {ROUNDS} interleaved rounds"
    );
    println!(
        "{:<36} {:>12} {:>22} {:>12} {:>10} {:>10}",
        "forwarder", "conns/s", "busy CPU 0/1 (conns)", "MB/s", "p50 us", "p99 us"
    );
    for r in &rows {
        let busy = format!("{:.0}%/{:.0}%", r.busy[0][0] * 100.0, r.busy[0][1] * 100.0);
        println!(
            "{:<36} {:>12.0} {:>22} {:>12.0} {:>10.0} {:>10.0}",
            r.name,
            r.conns,
            busy,
            r.bytes / 1e6,
            r.p50,
            r.p99
        );
    }
    for (name, (rss, slab)) in &idle {
        println!(
            "{name}, memory per idle connection ({} open): {rss:.1} KiB daemon RSS, {slab:.1} KiB kernel slab (whole machine)",
            cost::IDLE
        );
    }
    println!("limiter, a connection refused at the cap: {refused_us:.1} us of daemon CPU ({refused} refused)");
    // Medians of the rounds' ratios: `a` against `b` by figure `f`.
    let ratio = |a: usize, b: usize, f: Fig<Row>| median_of(&rounds, |r| f(&r[a]) / f(&r[b]));
    let (conns, bytes, p50): (Fig<Row>, Fig<Row>, Fig<Row>) = (|r| r.conns, |r| r.bytes, |r| r.p50);
    println!(
        "splice against buffer: {:.2}x conns/s, {:.2}x bytes/s, {:.2}x p50",
        ratio(0, 1, conns),
        ratio(0, 1, bytes),
        ratio(0, 1, p50)
    );
    // The goals are the default config's (`copy = "splice"`) against both peers.
    for (k, (what, f)) in [("conns/s", conns), ("bytes/s on long transfers", bytes)].into_iter().enumerate() {
        let (h, n) = (ratio(0, 2, f), ratio(0, 3, f));
        let on = |cpu: usize| [0, 2, 3].map(|i| rows[i].busy[k][cpu]);
        println!(
            "goal ({}): {what} at least haproxy's and nginx's -> {} ({h:.2}x haproxy, {n:.2}x nginx, medians of the rounds' ratios)",
            rows[0].name,
            verdict(h >= 1.0 && n >= 1.0, &on(0), &on(1), 1),
        );
    }
    for (layout, rounds) in &http {
        http::report(*layout, rounds);
    }
}

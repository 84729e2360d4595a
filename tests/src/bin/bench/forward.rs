//! Bench `forward`: the limiter's forwarder side by side with haproxy
//! (`mode tcp`, `send-proxy-v2`) and nginx (`stream`, `proxy_protocol
//! on`, which sends version 1), each pinned to CPU 0, with the same client and upstream pinned to
//! CPU 1, all on the loopback of one namespace: new connections a second,
//! bytes a second on long transfers, latency of a small request (median
//! and p99), and for the limiter the CPU cost of a connection refused at
//! its cap.

use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
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

use super::fronts;

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
/// client to close.
fn upstream(ns: &NetNs, stop: Arc<AtomicBool>) -> thread::JoinHandle<()> {
    let name = ns.name.clone();
    thread::spawn(move || {
        enter(&name);
        pin_to_cpu(1);
        let l = TcpListener::bind(("127.0.0.1", UPSTREAM)).unwrap();
        l.set_nonblocking(true).unwrap();
        while !stop.load(Ordering::Relaxed) {
            let Ok((mut c, _)) = l.accept() else {
                thread::sleep(Duration::from_micros(200));
                continue;
            };
            thread::spawn(move || {
                pin_to_cpu(1);
                c.set_nonblocking(false).unwrap();
                let mut buf = Vec::with_capacity(256);
                let mut chunk = [0u8; 256];
                let op = loop {
                    // PROXY v2 (the limiter, haproxy) or v1 (nginx stream).
                    let header = parse_v2(&buf).map(|p| p.len).or_else(|| {
                        buf.starts_with(b"PROXY ").then(|| buf.windows(2).position(|w| w == b"\r\n").map(|i| i + 2))?
                    });
                    if let Some(len) = header
                        && buf.len() > len
                    {
                        break buf[len];
                    }
                    match c.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                };
                let reply: &[u8] = match op {
                    b'r' => &[b'r'; 100],
                    b'l' => &LONG,
                    _ => b"k",
                };
                let _ = c.write_all(reply);
                let _ = c.shutdown(std::net::Shutdown::Write);
                let _ = c.read(&mut chunk);
            });
        }
    })
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

#[derive(Clone, Copy)]
struct Row {
    name: &'static str,
    conns: f64,
    bytes: f64,
    p50: f64,
    p99: f64,
}

fn measure(name: &'static str, ns: &NetNs, port: u16) -> Row {
    wait_port(ns, port);
    eprintln!("bench forward: {name}: connections...");
    let conns = conn_rate(ns, port);
    eprintln!("bench forward: {name}: long transfers...");
    let bytes = throughput(ns, port);
    eprintln!("bench forward: {name}: latency...");
    let (p50, p99, failed) = latency(ns, port);
    if failed > 0 {
        eprintln!("bench forward: {name}: {failed} small requests failed");
    }
    Row { name, conns, bytes, p50, p99 }
}

/// The better of two rounds' figures, each figure on its own.
fn best(a: Option<Row>, b: Row) -> Row {
    a.map_or(b, |a| Row {
        name: a.name,
        conns: a.conns.max(b.conns),
        bytes: a.bytes.max(b.bytes),
        p50: a.p50.min(b.p50),
        p99: a.p99.min(b.p99),
    })
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

    // The limiter, PROXY v2, on CPU 0: by splice(2), then by buffer.
    let policy = dir.join("policy.toml");
    let fwd = |max: u32, copy: &str| fronts::limiter_policy(7101, UPSTREAM, max, &format!("copy = \"{copy}\"\n"));
    let mut refusal = (0, 0.0);
    let mut idle = Vec::new();
    // Two rounds, rows interleaved (the machine's speed drifts): the best
    // of each figure; memory and the cost of a refusal in the first.
    let mut best_of: [Option<Row>; 4] = [None; 4];
    for round in 1..=2 {
        let modes = [("splice", "limiter (PROXY v2, splice)"), ("buffer", "limiter (PROXY v2, buffer)")];
        for (i, (copy, name)) in modes.into_iter().enumerate() {
            std::fs::write(&policy, fwd(20_000, copy)).unwrap();
            let socket = unique_socket("bfw");
            let daemon = fronts::limiter(&net.b, "0", &policy, &socket);
            best_of[i] = Some(best(best_of[i], measure(name, &net.b, 7101)));
            if round == 1 {
                idle.push((name, super::forward_cost::idle_memory(&net.b, 7101, daemon.0.id())));
                if copy == "splice" {
                    refusal = super::forward_cost::refusal_cost(&net, &policy, &socket, daemon.0.id(), &fwd(1, copy));
                }
            }
            drop::<Guard>(daemon);
        }
        let peers: [(&str, u16, fronts::Peer); 2] = [
            ("haproxy 2.6 (send-proxy-v2)", 7102, fronts::haproxy),
            ("nginx 1.22 stream (PROXY v1)", 7103, fronts::nginx_stream),
        ];
        for (i, (name, port, start)) in peers.into_iter().enumerate() {
            let guard = start(&net.b, dir, "0", port, UPSTREAM);
            best_of[2 + i] = Some(best(best_of[2 + i], measure(name, &net.b, port)));
            drop(guard);
        }
    }
    let (refused, refused_us) = refusal;
    let rows: Vec<Row> = best_of.into_iter().flatten().collect();
    stop.store(true, Ordering::Relaxed);
    let _ = up.join();
    let http = super::forward_http::LAYOUTS.map(|l| (l, super::forward_http::rows(&net, dir, l)));

    println!("forwarders on CPU 0, client and upstream on CPU 1, loopback, {SECS} s a row, best of 2 rounds");
    println!("{:<36} {:>12} {:>12} {:>10} {:>10}", "forwarder", "conns/s", "MB/s", "p50 us", "p99 us");
    for r in &rows {
        println!("{:<36} {:>12.0} {:>12.0} {:>10.0} {:>10.0}", r.name, r.conns, r.bytes / 1e6, r.p50, r.p99);
    }
    for (name, (rss, slab)) in &idle {
        println!(
            "{name}, memory per idle connection ({} open): {rss:.1} KiB daemon RSS, {slab:.1} KiB kernel slab (whole machine)",
            super::forward_cost::IDLE
        );
    }
    println!("limiter, a connection refused at the cap: {refused_us:.1} us of daemon CPU ({refused} refused)");
    let (sp, bu, h) = (&rows[0], &rows[1], &rows[2]);
    println!(
        "splice against buffer: {:.2}x conns/s, {:.2}x bytes/s, {:.2}x p50",
        sp.conns / bu.conns,
        sp.bytes / bu.bytes,
        sp.p50 / bu.p50
    );
    // The goals are the default config's (`copy = "splice"`) against both peers.
    let n = &rows[3];
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    for (what, lv, hv, nv) in
        [("conns/s", sp.conns, h.conns, n.conns), ("bytes/s on long transfers", sp.bytes, h.bytes, n.bytes)]
    {
        println!(
            "goal ({}): {what} at least haproxy's and nginx's -> {} ({:.2}x haproxy, {:.2}x nginx)",
            sp.name,
            verdict(lv >= hv && lv >= nv),
            lv / hv,
            lv / nv
        );
    }
    for (layout, rows) in &http {
        super::forward_http::report(*layout, rows);
    }
}

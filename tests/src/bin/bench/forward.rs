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
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use limiter::forward::proxy::parse_v2;
use limiter_tests::{
    netns::{B_IF, NetNs, VethPair, enter},
    scenario::{self, Guard, spawn_lines, unique_socket, wait_for},
};

const UPSTREAM: u16 = 7100;
pub(super) const SECS: f64 = 2.0;
const BULK: usize = 32 << 20;

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
                let reply = match op {
                    b'r' => vec![b'r'; 100],
                    b'l' => vec![b'l'; BULK],
                    _ => vec![b'k'],
                };
                let _ = c.write_all(&reply);
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

/// Connections a second with 16 clients on CPU 1.
fn conn_rate(ns: &NetNs, port: u16) -> f64 {
    ns.run_in(|| {
        let done = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        thread::scope(|s| {
            for _ in 0..16 {
                let done = Arc::clone(&done);
                s.spawn(move || {
                    pin_to_cpu(1);
                    while start.elapsed().as_secs_f64() < SECS {
                        if once(port, b'c', 1).is_some() {
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
    })
}

/// Bytes a second over 4 long transfers at once.
fn throughput(ns: &NetNs, port: u16) -> f64 {
    ns.run_in(|| {
        let start = Instant::now();
        let bytes: usize = thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(move || {
                        pin_to_cpu(1);
                        once(port, b'l', BULK).unwrap_or(0)
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
    let fwd = |max: u32, copy: &str| {
        format!(
            "rate = 1000000\nburst = 1000000\n[[forward]]\nname = \"bench\"\nlisten = [\"127.0.0.1:7101\"]\nupstreams = [\"127.0.0.1:{UPSTREAM}\"]\nmax_connections = {max}\ncopy = \"{copy}\"\n"
        )
    };
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
            let mut c = Command::new("taskset");
            c.args(["-c", "0", "nsenter", &format!("--net=/run/netns/{}", net.b.name)])
                .arg(scenario::locate_bin("limiter").unwrap())
                .args(["run", "--iface", B_IF, "--metrics", "off", "--status-interval", "0", "--policy"])
                .arg(&policy)
                .arg("--socket")
                .arg(&socket);
            let (daemon, log) = spawn_lines(c).unwrap();
            wait_for(&log, "listening on", Duration::from_secs(20), &mut String::new()).unwrap();
            best_of[i] = Some(best(best_of[i], measure(name, &net.b, 7101)));
            if round == 1 {
                idle.push((name, super::forward_cost::idle_memory(&net.b, 7101, daemon.0.id())));
                if copy == "splice" {
                    refusal = super::forward_cost::refusal_cost(&net, &policy, &socket, daemon.0.id(), &fwd(1, copy));
                }
            }
            drop::<Guard>(daemon);
        }
        best_of[2] = Some(best(best_of[2], haproxy(&net, dir)));
        best_of[3] = Some(best(best_of[3], nginx(&net, dir)));
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

/// A peer listens on `port`, or the bench stops with what it said.
fn started(ns: &NetNs, port: u16, stderr: &std::path::Path) {
    if !ns.listens_on(port) {
        let said = std::fs::read_to_string(stderr).unwrap_or_default();
        panic!("nothing listens on {port} after 10 s; the peer said: {}", said.trim());
    }
}

/// haproxy, mode tcp, send-proxy-v2, one thread on CPU 0.
fn haproxy(net: &VethPair, dir: &std::path::Path) -> Row {
    let cfg = dir.join("haproxy.cfg");
    std::fs::write(
        &cfg,
        format!(
            "global\n  nbthread 1\n  maxconn 8000\ndefaults\n  mode tcp\n  timeout connect 2s\n  timeout client 10s\n  timeout server 10s\nfrontend fe\n  bind 127.0.0.1:7102\n  default_backend be\nbackend be\n  server s 127.0.0.1:{UPSTREAM} send-proxy-v2\n"
        ),
    )
    .unwrap();
    let mut c = Command::new("taskset");
    c.args(["-c", "0", "nsenter", &format!("--net=/run/netns/{}", net.b.name), "haproxy", "-db", "-f"]).arg(&cfg);
    let err = dir.join("haproxy.err");
    let haproxy = Guard(c.stdout(Stdio::null()).stderr(std::fs::File::create(&err).unwrap()).spawn().unwrap());
    started(&net.b, 7102, &err);
    let row = measure("haproxy 2.6 (send-proxy-v2)", &net.b, 7102);
    drop(haproxy);
    row
}

/// nginx stream, proxy_protocol on, one worker on CPU 0.
fn nginx(net: &VethPair, dir: &std::path::Path) -> Row {
    let conf = dir.join("nginx.conf");
    let d = dir.display();
    std::fs::write(
        &conf,
        format!(
            "load_module /usr/lib/nginx/modules/ngx_stream_module.so;\ndaemon off;\nmaster_process off;\nworker_processes 1;\nerror_log /dev/null;\npid {d}/nginx.pid;\nevents {{ worker_connections 8000; }}\nstream {{\n  server {{\n    listen 127.0.0.1:7103;\n    proxy_pass 127.0.0.1:{UPSTREAM};\n    proxy_protocol on;\n  }}\n}}\n"
        ),
    )
    .unwrap();
    let mut c = Command::new("taskset");
    c.args(["-c", "0", "nsenter", &format!("--net=/run/netns/{}", net.b.name), "nginx", "-c"])
        .arg(&conf)
        .arg("-p")
        .arg(dir);
    let err = dir.join("nginx.err");
    let nginx = Guard(c.stdout(Stdio::null()).stderr(std::fs::File::create(&err).unwrap()).spawn().unwrap());
    started(&net.b, 7103, &err);
    let row = measure("nginx 1.22 stream (PROXY v1)", &net.b, 7103);
    drop(nginx);
    row
}

//! Bench `forward`, HTTP workloads: wrk (Debian's) through each forwarder
//! to an nginx HTTP backend that reads the PROXY header (`listen ...
//! proxy_protocol`, `return 200`), all on the loopback of one namespace,
//! rows interleaved, two rounds: new connections a second (HTTP/1.1,
//! `Connection: close`), keep-alive requests a second, and the p99
//! latency of the keep-alive run. Two layouts of the two CPUs: the
//! forwarder sharing CPU 1 with the backend and wrk alone on CPU 0 (the
//! forwarder's own cost counts in full), and the forwarder alone on CPU 0
//! with wrk and the backend on CPU 1 (their CPU is the bound).

use std::{path::Path, time::Duration};

use limiter_tests::{
    netns::VethPair,
    scenario::{Guard, unique_socket},
};

use super::fronts;

const BACKEND: u16 = 7200;
const WRK_SECS: &str = "4";

/// One workload's figures for one forwarder.
#[derive(Clone, Copy, Default)]
pub struct Http {
    pub new_conns: f64,
    pub keepalive: f64,
    /// p99 of the keep-alive run, in µs.
    pub p99_us: f64,
}

/// Which CPU runs what.
#[derive(Clone, Copy)]
pub struct Layout {
    pub name: &'static str,
    client: &'static str,
    front: &'static str,
    backend: &'static str,
}

pub const LAYOUTS: [Layout; 2] = [
    Layout { name: "wrk on CPU 0, each forwarder and the backend on CPU 1", client: "0", front: "1", backend: "1" },
    Layout { name: "each forwarder on CPU 0, wrk and the backend on CPU 1", client: "1", front: "0", backend: "1" },
];

/// `wrk` through `port`: requests a second and the p99 in µs.
fn wrk(net: &VethPair, cpu: &str, port: u16, close: bool) -> (f64, f64) {
    let mut c = fronts::pinned(&net.b, cpu, "wrk");
    c.args(["-t1", "-c32", "-d"]).arg(format!("{WRK_SECS}s")).arg("--latency");
    if close {
        c.args(["-H", "Connection: close"]);
    }
    c.arg(format!("http://127.0.0.1:{port}/"));
    let out = c.output().expect("wrk (cargo xtask bench installs it)");
    let text = String::from_utf8_lossy(&out.stdout);
    let rate = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(f64::NAN);
    let p99 = text.lines().find_map(|l| l.trim().strip_prefix("99%")).map_or(f64::NAN, |v| micros(v.trim()));
    (rate, p99)
}

/// wrk's `1.23ms`, `456.78us` or `1.20s`, in µs.
fn micros(v: &str) -> f64 {
    let (num, scale) = if let Some(n) = v.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1e6)
    } else {
        (v, f64::NAN)
    };
    num.parse::<f64>().map_or(f64::NAN, |n| n * scale)
}

fn measure(net: &VethPair, cpu: &str, port: u16) -> Http {
    let (new_conns, _) = wrk(net, cpu, port, true);
    let (keepalive, p99_us) = wrk(net, cpu, port, false);
    Http { new_conns, keepalive, p99_us }
}

/// The backend: nginx HTTP, reading the PROXY header.
fn backend(net: &VethPair, dir: &Path, cpu: &str) -> Guard {
    let block = format!(
        "http {{\n  access_log off;\n  keepalive_requests 10000000;\n  server {{\n    listen 127.0.0.1:{BACKEND} proxy_protocol;\n    location / {{ return 200 \"ok\\n\"; }}\n  }}\n}}\n"
    );
    fronts::nginx(&net.b, dir, cpu, BACKEND, None, &block)
}

/// The three fronts, each started for its row and stopped after it: the
/// limiter in its default config.
fn limiter(net: &VethPair, dir: &Path, cpu: &str) -> Guard {
    let policy = dir.join("http.toml");
    std::fs::write(&policy, fronts::limiter_policy(7201, BACKEND, 20_000, "")).unwrap();
    fronts::limiter(&net.b, cpu, &policy, &unique_socket("bfwh"))
}

fn haproxy(net: &VethPair, dir: &Path, cpu: &str) -> Guard {
    fronts::haproxy(&net.b, dir, cpu, 7202, BACKEND)
}

fn nginx(net: &VethPair, dir: &Path, cpu: &str) -> Guard {
    fronts::nginx_stream(&net.b, dir, cpu, 7203, BACKEND)
}

/// Starts a front on a CPU.
type Front = fn(&VethPair, &Path, &str) -> Guard;

/// Two rounds, rows interleaved: (limiter, haproxy, nginx), the best of
/// each forwarder's rounds per figure (the p99: the lower).
pub fn rows(net: &VethPair, dir: &Path, layout: Layout) -> [Http; 3] {
    let backend = backend(net, dir, layout.backend);
    let mut best = [Http { p99_us: f64::INFINITY, ..Http::default() }; 3];
    for round in 1..=2 {
        let fronts: [(&str, u16, Front); 3] =
            [("limiter", 7201, limiter), ("haproxy", 7202, haproxy), ("nginx", 7203, nginx)];
        for (i, (name, port, start)) in fronts.into_iter().enumerate() {
            eprintln!("bench forward: HTTP through {name} ({}), round {round}...", layout.name);
            let guard = start(net, dir, layout.front);
            let h = measure(net, layout.client, port);
            drop(guard);
            std::thread::sleep(Duration::from_millis(300));
            eprintln!(
                "bench forward: {name} round {round}: {:.0} new conns/s, {:.0} keep-alive req/s, p99 {:.0} us",
                h.new_conns, h.keepalive, h.p99_us
            );
            let b = &mut best[i];
            b.new_conns = b.new_conns.max(h.new_conns);
            b.keepalive = b.keepalive.max(h.keepalive);
            b.p99_us = b.p99_us.min(h.p99_us);
        }
    }
    drop(backend);
    std::thread::sleep(Duration::from_millis(300));
    best
}

/// The table and the goals: at least 1.0x both peers on new connections
/// and keep-alive requests, and a p99 no worse than haproxy's.
pub fn report(layout: Layout, rows: &[Http; 3]) {
    let names = ["limiter (PROXY v2, default config)", "haproxy 2.6 (send-proxy-v2)", "nginx 1.22 stream (PROXY v1)"];
    println!(
        "HTTP/1.1 to an nginx backend (proxy_protocol, return 200), wrk -t1 -c32, {}, {WRK_SECS} s a run, best of 2 rounds",
        layout.name
    );
    println!("{:<36} {:>14} {:>16} {:>12}", "forwarder", "new conns/s", "keep-alive req/s", "p99 us");
    for (n, r) in names.iter().zip(rows) {
        println!("{n:<36} {:>14.0} {:>16.0} {:>12.0}", r.new_conns, r.keepalive, r.p99_us);
    }
    let [l, h, n] = rows;
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    for (what, lv, hv, nv) in [
        ("new connections/s", l.new_conns, h.new_conns, n.new_conns),
        ("keep-alive requests/s", l.keepalive, h.keepalive, n.keepalive),
    ] {
        println!(
            "goal: {what} at least haproxy's and nginx's -> {} ({:.2}x haproxy, {:.2}x nginx)",
            verdict(lv >= hv && lv >= nv),
            lv / hv,
            lv / nv
        );
    }
    println!(
        "goal: p99 of a small request no worse than haproxy's -> {} ({:.0} us against {:.0} us)",
        verdict(l.p99_us <= h.p99_us),
        l.p99_us,
        h.p99_us
    );
}
